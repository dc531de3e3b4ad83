"""CPU the gateway's request-path spans cost, in one process, without the
rest of the gateway: `evolving-infra bench tracing --json`.

Each request runs through the gateway's own dispatch of a hot route
(`gateway.http.asgi.GatewayApp`, which opens a traced request's turn
itself) to a stand-in endpoint that calls every span site a streamed,
routed, single-segment request calls (tokenize, admission, turn_started,
route, decode segment with its `traceparent`, 16 token chunks relayed in
the gateway's event-stream response, turn_finished), the same names and
attributes the serving code gives. Requests run 32 at a time on one event
loop, as a loaded gateway runs them, with the garbage collector set as the
gateway's server sets it (`gateway.http.server.tune_gc`). Spans are exported by the gateway's own
exporter to a receiver process (`testing.otlp_receiver`, niced, decoding
the bodies only when its counts are read), so the process's CPU includes
recording, batching, encoding and posting.

Prints one JSON object: CPU µs per request with tracing off and on (median
of `--rounds`), their difference (`span_cpu_us`, the cost of the spans),
the off run over the same stand-in with no span site at all (`bare`:
`off_cost_us`, what tracing off costs: each site one context-variable read),
the receiver's span count against the expected six spans per request.
The goal (issue 34): `span_cpu_us` <= 40 on a quiet machine.
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import json
import socket
import statistics
import subprocess
import time
from collections.abc import AsyncGenerator
from typing import Any

import httpx
from fastapi import APIRouter, Request
from fastapi.responses import Response
from fastapi.routing import APIRoute

from bench._tracing import receiver_argv
from core.tracing import TraceSettings
from gateway.http.asgi import GatewayApp
from gateway.http.server import tune_gc
from gateway.http.sse import CLIENT_GONE, EventStreamResponse
from gateway.telemetry import (
    NO_JOB,
    Tracing,
    TurnOpener,
    end_span,
    job_trace,
    start_span,
    turn_finished,
    turn_started,
)
from workers.protocol import BlockLocation, KVTransferSpec

SPANS_PER_REQUEST = 6  # request, tokenize, admission, route, decode, relay
CHUNKS = 16
GOAL_US = 40.0
_IDS = itertools.count(1)  # each request its own id, as a gateway's are (no value repeats across requests)
LOAD = [BlockLocation(block_hash=f"{i:064x}", node_id="w1", slot=i) for i in range(16)]  # 16 local cached blocks


async def _stream(sited: bool) -> AsyncGenerator[bytes, None]:
    """One streamed request's answer; `sited`: with the serving code's span sites
    as the orchestrator runs them (the route and the segment as the stream starts)."""
    rid = f"chatcmpl-{next(_IDS):032x}"
    trace = job_trace(rid) if sited else NO_JOB
    trace.routed(
        trace.clock(),
        node_id="w1",
        role="decode",
        candidates=["w1", "w2"],
        cached_by_node={"w1": 256, "w2": 0},
        pool_cached_tokens=256,
        context_tokens=300,
    )
    kv = KVTransferSpec.model_construct(load=LOAD, peers={}, save=True)
    trace.segment_started(f"{rid}.1", node_id="w1", role="decode", kv=kv, context_tokens=300, max_tokens=16)
    for _ in range(CHUNKS):
        yield b"data: {}\n\n"
    trace.segment_ended(outcome="finished", reason="length", error="", tokens=CHUNKS, cached_tokens=256)
    if sited:
        turn_finished(
            prompt_tokens=300,
            cached_tokens=256,
            completion_tokens=CHUNKS,
            finish_reason="length",
            first_phase="decode",
            nodes=["w1"],
            resumes=0,
            ttft_s=0.01,
        )
    yield b"data: [DONE]\n\n"


async def _closed() -> None:
    return None


async def _endpoint(request: Request) -> Response:
    """What the serving code does at its span sites for one streamed request."""
    rid = f"chatcmpl-{next(_IDS):032x}"
    span = start_span("tokenize", **{"evolving.prompt_chars": 1200})
    sizes: dict[str, Any] = {"gen_ai.usage.input_tokens": 300, "evolving.prompt_blocks": 18}
    end_span(span, **sizes)
    span = start_span("admission", **{"evolving.tenant": "t1"})
    end_span(span)
    turn_started(model="demo", request_id=rid, tenant="t1", branch="b1", session=None, max_tokens=16, choices=1)
    return EventStreamResponse(_stream(True), headers={}, on_close=_closed)


async def _bare_endpoint(request: Request) -> Response:
    """`_endpoint` without its span sites: what a build without tracing would run."""
    return EventStreamResponse(_stream(False), headers={}, on_close=_closed)


def _gateway(endpoint: Any, tracing: Tracing | None) -> GatewayApp:
    """The gateway's own dispatch of a hot route (`gateway.http.asgi`), traced when `tracing`."""
    app = GatewayApp()
    router = APIRouter()
    router.post("/v1/chat/completions")(endpoint)
    for route in router.routes:
        assert isinstance(route, APIRoute) and app.add_hot_route(route)
    if tracing is not None:
        app.tracer = TurnOpener(tracing)
    return app


async def _serve(app: Any, requests: int, concurrency: int, flush: Any) -> None:
    scope = {
        "type": "http",
        "method": "POST",
        "path": "/v1/chat/completions",
        "headers": [],
        "extensions": {CLIENT_GONE: lambda: False},  # as the gateway's server says it
    }

    async def receive() -> dict[str, Any]:
        return {"type": "http.request", "body": b"", "more_body": False}

    async def send(message: Any) -> None:
        return None

    for i in range(requests // concurrency):
        await asyncio.gather(*(app(dict(scope), receive, send) for _ in range(concurrency)))
        if i % 16 == 15:  # ~600 requests a batch: a loaded gateway's second, within the exporter's queue
            flush()


def _cpu_us_per_request(app: Any, requests: int, concurrency: int, flush: Any) -> float:
    t0 = time.process_time()
    asyncio.run(_serve(app, requests, concurrency, flush))
    flush()
    return (time.process_time() - t0) / requests * 1e6


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(prog="evolving-infra bench tracing", description=__doc__.split("\n\n")[0])
    p.add_argument("--json", action="store_true", help="print one JSON object (the only output)")
    p.add_argument("--requests", type=int, default=8192)
    p.add_argument("--concurrency", type=int, default=32)
    p.add_argument("--rounds", type=int, default=5)
    args = p.parse_args(argv)

    port = _free_port()
    rx = subprocess.Popen(receiver_argv(port))  # niced, decoding only when its counts are read
    url = f"http://127.0.0.1:{port}"
    try:
        for _ in range(100):
            try:
                httpx.get(url + "/stats", timeout=1)
                break
            except httpx.TransportError:
                time.sleep(0.1)
        tracing = Tracing.build(TraceSettings(endpoint=url + "/v1/traces"), replica="bench")
        traced, untraced, bare_app = (
            _gateway(_endpoint, tracing),
            _gateway(_endpoint, None),
            _gateway(_bare_endpoint, None),
        )
        tune_gc()  # the collector as the gateway's server sets it
        bare, off, on = [], [], []
        _cpu_us_per_request(traced, args.concurrency * 8, args.concurrency, tracing.flush)  # warm up
        before = httpx.get(url + "/stats", timeout=10).json().get("spans", 0)
        for _ in range(args.rounds):
            bare.append(_cpu_us_per_request(bare_app, args.requests, args.concurrency, lambda: None))
            off.append(_cpu_us_per_request(untraced, args.requests, args.concurrency, lambda: None))
            on.append(_cpu_us_per_request(traced, args.requests, args.concurrency, tracing.flush))
        time.sleep(0.5)
        spans = httpx.get(url + "/stats", timeout=300).json().get("spans", 0) - before  # decodes them all now
        tracing.shutdown()
    finally:
        rx.terminate()
        rx.wait(10)
    served = args.rounds * (args.requests // args.concurrency) * args.concurrency
    bare_us, off_us, on_us = statistics.median(bare), statistics.median(off), statistics.median(on)
    out = {
        "requests_per_round": served // args.rounds,
        "cpu_us_per_request": {"bare": round(bare_us, 1), "off": round(off_us, 1), "on": round(on_us, 1)},
        "span_cpu_us": round(on_us - off_us, 1),
        "off_cost_us": round(off_us - bare_us, 1),
        "rounds": {
            "bare": [round(x, 1) for x in bare],
            "off": [round(x, 1) for x in off],
            "on": [round(x, 1) for x in on],
        },
        "spans_received": spans,
        "spans_expected": served * SPANS_PER_REQUEST,
        "complete": spans == served * SPANS_PER_REQUEST,
        "targets": {"span_cpu_us": GOAL_US},
    }
    print(json.dumps(out) if args.json else json.dumps(out, indent=2))


if __name__ == "__main__":
    main()
