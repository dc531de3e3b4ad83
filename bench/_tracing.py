"""`bench gateway`'s tracing case: the CPU a request costs with traces on.

A second gateway process ("gateway-traced") runs with the standard
OpenTelemetry environment pointing at a receiver process
(`testing.otlp_receiver`, the collector's stand-in, on the load CPU) and
every request sampled (`OTEL_TRACES_SAMPLER_ARG=1.0`). Each round runs it
and the untraced gateway back to back at one level (streaming, concurrency
32), so both see the same machine; `tracing_overhead_cpu` is the median over
the rounds of traced / untraced CPU per request (target <= 1.10).

Completeness: the receiver's counts per span name, read after the last
export. The bench upstream is no vLLM worker (no worker spans); every
request's gateway spans (request, tokenize, admission, route, decode,
relay) must be there as often as the request spans.
"""

from __future__ import annotations

import statistics
import sys
import time
from typing import Any

import httpx

LEVEL = 32
MODE = "stream"
GATEWAY_SPANS = ("tokenize", "admission", "route", "decode", "relay")
CONTROL_SPANS = ("planner.decision", "phase.switch")
TARGET = 1.10


def receiver_argv(port: int) -> list[str]:
    return [sys.executable, "-m", "testing.otlp_receiver", "--port", str(port)]


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
    stats = httpx.get(receiver_url + "/stats", timeout=10).json()
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
