"""Shared shell of the KV-pool benchmarks (`bench disagg`, `bench prefetch`).

Plain HTTP calls against the worker's internal API (workers/protocol.py) and
a context manager that starts local workers and always stops them. The
benchmark functions take worker base URLs, so tests can point them at the
session's `vllm_cluster` instead of starting engines of their own.
"""

from __future__ import annotations

import contextlib
import json
import pathlib
import random
import tempfile
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field

import httpx

from testing.worker_process import WorkerProcess

# Token ids the demo model accepts (vocab 4096); low ids are special tokens.
TOKEN_LOW, TOKEN_HIGH = 10, 4000
# Sent on every call: workers bound beyond loopback (the testbed's) demand the cluster token.
HEADERS: dict[str, str] = {}


def use_cluster_token(token: str | None) -> None:
    """Present `token` on every /internal call of these helpers from now on."""
    HEADERS.pop("Authorization", None)
    if token:
        HEADERS["Authorization"] = f"Bearer {token}"


class BenchError(RuntimeError):
    """A worker answered something a benchmark cannot continue from."""


def synthetic_tokens(n: int, rng: random.Random) -> list[int]:
    return [rng.randrange(TOKEN_LOW, TOKEN_HIGH) for _ in range(n)]


def node_id(url: str) -> str:
    r = httpx.get(url + "/internal/phase", headers=HEADERS, timeout=10)
    r.raise_for_status()
    return r.json()["node_id"]


def phase_of(url: str) -> str:
    r = httpx.get(url + "/internal/phase", headers=HEADERS, timeout=10)
    r.raise_for_status()
    return r.json()["phase"]


def set_phase(url: str, phase: str, deadline_s: float = 30.0) -> dict:
    r = httpx.post(
        url + "/internal/phase",
        json={"phase": phase, "deadline_s": deadline_s},
        headers=HEADERS,
        timeout=deadline_s + 60,
    )
    if r.status_code != 200:
        raise BenchError(f"phase change of {url} to {phase} failed: {r.status_code} {r.text}")
    return r.json()


def generate(url: str, body: dict, timeout: float = 300) -> dict:
    """One non-streaming generate; returns the collected final chunk."""
    r = httpx.post(url + "/internal/generate", json={**body, "stream": False}, headers=HEADERS, timeout=timeout)
    if r.status_code != 200:
        raise BenchError(f"generate on {url} failed: {r.status_code} {r.text}")
    return r.json()


def iterations_since(url: str, since: int = 0) -> list[dict]:
    """Every iteration record of the worker from index `since` on (the endpoint pages them)."""
    out: list[dict] = []
    while True:
        page = httpx.get(url + "/internal/stats", params={"since": since}, headers=HEADERS, timeout=30).json()[
            "iterations"
        ]
        if not page:
            return out
        out += page
        since = page[-1]["index"] + 1


def next_iteration_index(url: str) -> int:
    """Index the worker's next iteration record will get."""
    records = iterations_since(url)
    return records[-1]["index"] + 1 if records else 0


@dataclass
class StreamResult:
    tokens: list[int] = field(default_factory=list)
    ttft_s: float | None = None  # request sent -> first chunk with tokens
    total_s: float = 0.0
    cached_tokens: int = 0
    finish_reason: str | None = None
    saved_blocks: list[dict] | None = None


def stream_generate(
    url: str, body: dict, on_tokens: Callable[[StreamResult], None] | None = None, timeout: float = 300
) -> StreamResult:
    """Streaming generate (NDJSON); `on_tokens` sees the result after each chunk."""
    out = StreamResult()
    start = time.perf_counter()
    with httpx.stream(
        "POST", url + "/internal/generate", json={**body, "stream": True}, headers=HEADERS, timeout=timeout
    ) as r:
        if r.status_code != 200:
            raise BenchError(f"generate on {url} failed: {r.status_code} {r.read().decode()}")
        for line in r.iter_lines():
            if not line:
                continue
            chunk = json.loads(line)
            if chunk.get("error"):
                raise BenchError(f"generate on {url} failed mid-stream: {chunk['error']}")
            if chunk.get("token_ids") and out.ttft_s is None:
                out.ttft_s = time.perf_counter() - start
            out.tokens.extend(chunk.get("token_ids", []))
            out.cached_tokens = max(out.cached_tokens, chunk.get("cached_tokens", 0))
            if chunk.get("finish_reason"):
                out.finish_reason = chunk["finish_reason"]
                out.saved_blocks = chunk.get("saved_blocks")
            if on_tokens is not None:
                on_tokens(out)
    out.total_s = time.perf_counter() - start
    return out


@dataclass(frozen=True)
class WorkerSpec:
    node_id: str
    port: int
    phase: str
    cpu: str  # VLLM_CPU_OMP_THREADS_BIND
    extra: tuple[str, ...] = ()


@contextlib.contextmanager
def local_workers(specs: list[WorkerSpec], model: str, log_dir: str | None = None) -> Iterator[list[str]]:
    """Start the workers (in parallel), yield their URLs, always stop them."""
    run_dir = tempfile.mkdtemp(prefix="evolving-bench-run-")
    logs = pathlib.Path(log_dir or tempfile.mkdtemp(prefix="evolving-bench-logs-"))
    logs.mkdir(parents=True, exist_ok=True)
    procs = [
        WorkerProcess(
            s.port,
            s.phase,
            model,
            s.node_id,
            threads_bind=s.cpu,
            log_path=str(logs / f"{s.node_id}.log"),
            extra=["--run-dir", run_dir, *s.extra],
        )
        for s in specs
    ]
    try:
        for p in procs:
            p.start()
        for p in procs:
            p.wait_ready()
        yield [p.url for p in procs]
    finally:
        for p in procs:
            p.stop()


def percentile(xs: list[float], q: float) -> float:
    """Nearest-rank-free linear percentile (numpy's default), q in [0, 100]."""
    if not xs:
        return float("nan")
    s = sorted(xs)
    pos = (len(s) - 1) * q / 100.0
    lo = int(pos)
    hi = min(lo + 1, len(s) - 1)
    return s[lo] + (s[hi] - s[lo]) * (pos - lo)
