"""`bench gateway`'s tracing case: the CPU a request costs with traces on.

A second gateway process ("gateway-traced") runs with the standard
OpenTelemetry environment pointing at a receiver process
(`testing.otlp_receiver`, the collector's stand-in) and every request
sampled (`OTEL_TRACES_SAMPLER_ARG=1.0`). Both gateways get the same warm-up;
each round runs them back to back at one level (streaming, concurrency 32),
`PAIRS_PER_ROUND` times, in alternating order (off, on; on, off; ...) so
neither always runs first; `tracing_overhead_cpu` is the median over the
pairs of traced / untraced CPU per request of the gateway process alone
(target <= 1.10).

The receiver only keeps the bodies while the runs are timed, niced, and
decodes them when its counts are read, after the last run: decoding every
span as it came (~25 µs of CPU per span) on the load generator's CPU made
the traced gateway's own CPU per request 1.2-1.3x the untraced one's, while
a receiver that only reads the bodies gave 0.95 in the same conditions
(docs/benchmarks-history.md, tracing). A collector runs on another machine.

Completeness: the receiver's counts per span name, read after the last
export. The bench upstream is no vLLM worker (no worker spans); every
request's gateway spans (request, tokenize, admission, route, decode,
relay) must be there as often as the request spans.
"""

from __future__ import annotations

import statistics
import sys
import time
from collections.abc import Callable
from typing import Any

import httpx

LEVEL = 32
MODE = "stream"
GATEWAY_SPANS = ("tokenize", "admission", "route", "decode", "relay")
CONTROL_SPANS = ("planner.decision", "phase.switch")
TARGET = 1.10
WARM_S = 2.0  # each gateway's warm-up at LEVEL before the first round
# Pairs per round: one pair's ratio moved by +-0.05 on this shared 2-core host
# (untraced runs of one process 500-560 µs a request, minutes apart), so the
# median is taken over three pairs a round (nine at --rounds 3), not one.
PAIRS_PER_ROUND = 3
OFF, ON = "gateway", "gateway-traced"

Run = Callable[[str, int, float], dict[str, Any]]  # (gateway name, concurrency, seconds) -> wrk's row


def receiver_argv(port: int) -> list[str]:
    """The receiver, niced, decoding only when its counts are read (see the module's docstring)."""
    rx = [sys.executable, "-m", "testing.otlp_receiver", "--port", str(port), "--defer-decode"]
    return ["nice", "-n", "19", *rx]


def warm_up(run: Run) -> None:
    for name in (OFF, ON):
        run(name, LEVEL, WARM_S)


def run_pair(run: Run, index: int, duration_s: float) -> tuple[dict[str, Any], dict[str, Any]]:
    """One (untraced, traced) pair of rows; odd pairs run the traced gateway first."""
    order = (OFF, ON) if index % 2 == 0 else (ON, OFF)
    rows = {name: run(name, LEVEL, duration_s) | {"order": i} for i, name in enumerate(order)}
    return rows[OFF], rows[ON]


def run_pairs(run: Run, rnd: int, duration_s: float) -> list[tuple[dict[str, Any], dict[str, Any]]]:
    """A round's `PAIRS_PER_ROUND` pairs, alternating which gateway runs first."""
    return [run_pair(run, rnd * PAIRS_PER_ROUND + i, duration_s) for i in range(PAIRS_PER_ROUND)]


def traced_env(receiver_url: str) -> dict[str, str]:
    return {
        "OTEL_EXPORTER_OTLP_ENDPOINT": receiver_url,
        "OTEL_TRACES_SAMPLER": "parentbased_traceidratio",
        "OTEL_TRACES_SAMPLER_ARG": "1.0",
    }


def overhead(pairs: list[tuple[dict[str, Any], dict[str, Any]]]) -> float | None:
    """Median over rounds of traced / untraced proxy CPU per request."""
    ratios = []
    for plain, traced in pairs:
        a = plain.get("cpu_us_per_request", {}).get("proxy")
        b = traced.get("cpu_us_per_request", {}).get("proxy")
        if a and b:
            ratios.append(b / a)
    return round(statistics.median(ratios), 3) if ratios else None


def completeness(receiver_url: str, *, wait_s: float = 3.0) -> dict[str, Any]:
    """The receiver's counts once the exporters' last batches are in (they leave every second)."""
    time.sleep(wait_s)
    stats = httpx.get(receiver_url + "/stats", timeout=300).json()  # decodes every body now
    by_name = stats.get("by_name", {})
    requests = sum(n for name, n in by_name.items() if name.startswith(("chat ", "POST ")))
    missing = {name: requests - by_name.get(name, 0) for name in GATEWAY_SPANS if by_name.get(name, 0) != requests}
    control = sum(by_name.get(name, 0) for name in CONTROL_SPANS)  # the planner's ticks: not the requests'
    return {
        "request_spans": requests,
        "spans": stats.get("spans", 0),
        "control_plane_spans": control,
        "spans_per_request": round((stats.get("spans", 0) - control) / requests, 2) if requests else None,
        "complete": requests > 0 and not missing,
        "missing": missing,
        "bad_exports": stats.get("bad_requests", 0),
    }
