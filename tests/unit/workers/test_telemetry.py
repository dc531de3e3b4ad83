"""workers.telemetry: a worker's spans join the gateway's trace, never start one.

The SDK's own in-memory exporter stands in for the collector here."""

from __future__ import annotations

from types import SimpleNamespace

from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from core import Role
from core.tracing import TraceSettings
from kvpool.events import PullDone
from workers.protocol import BlockLocation, GenerateRequest, KVTransferSpec
from workers.telemetry import WorkerTracing

TRACE = "4bf92f3577b34da6a3ce929d0e0e4736"
PARENT = "00f067aa0ba902b7"


def tracing() -> tuple[WorkerTracing, InMemorySpanExporter]:
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    return WorkerTracing(provider, node_id="wB", block_bytes=lambda: 4096), exporter


def request(traceparent: str | None) -> GenerateRequest:
    load = [BlockLocation(block_hash=f"h{i}", node_id="wA", slot=i) for i in range(3)]
    return GenerateRequest(
        request_id="seg-1",
        prompt_token_ids=[1, 2, 3],
        role=Role.DECODE,
        kv=KVTransferSpec(load=load, peers={"wA": "http://wA"}),
        traceparent=traceparent,
    )


def test_off_and_untraced_calls_make_no_span() -> None:
    assert WorkerTracing.build(TraceSettings(), node_id="w").enabled is False
    assert WorkerTracing.off().start(request(f"00-{TRACE}-{PARENT}-01")) is None
    t, exporter = tracing()
    assert t.start(request(None)) is None  # the gateway does not trace it: no root here
    assert t.start(request(f"00-{TRACE}-{PARENT}-00")) is None  # sampled out upstream
    assert exporter.get_finished_spans() == ()


def test_a_traced_call_is_a_child_with_its_pulls_under_it() -> None:
    t, exporter = tracing()
    span = t.start(request(f"00-{TRACE}-{PARENT}-01"))
    assert span is not None
    headers = t.vllm_headers(span)
    assert headers is not None and headers["traceparent"].startswith(f"00-{TRACE}-")
    t.pulled(PullDone("wA", "ok", 3, 0.02, rid="seg-1", ended_at=1_700_000_000.5))
    t.pulled(PullDone("wA", "ok", 1, 0.01, rid="another-request"))  # not this call's: no span
    out = SimpleNamespace(num_cached_tokens=96, metrics=SimpleNamespace(queued_ts=10.0, scheduled_ts=10.25))
    t.end(span, "seg-1", out=out, generated=5, finish="stop")
    pull, call = exporter.get_finished_spans()
    assert call.parent is not None and call.context is not None and call.attributes is not None
    assert pull.parent is not None and pull.attributes is not None
    assert pull.end_time is not None and pull.start_time is not None
    assert call.name == "decode (worker)" and format(call.parent.span_id, "016x") == PARENT
    assert format(call.context.trace_id, "032x") == TRACE
    assert call.attributes["evolving.kv.peer_blocks"] == 3 and call.attributes["evolving.cached_tokens"] == 96
    assert call.attributes["evolving.engine.queue_s"] == 0.25 and call.attributes["gen_ai.usage.output_tokens"] == 5
    assert pull.name == "kv_pull" and pull.parent.span_id == call.context.span_id
    assert pull.attributes["evolving.kv.bytes"] == 3 * 4096 and pull.attributes["evolving.kv.peer"] == "wA"
    assert pull.end_time == 1_700_000_000_500_000_000 and pull.end_time - pull.start_time == 20_000_000


def test_a_failed_pull_is_an_error_span() -> None:
    t, exporter = tracing()
    span = t.start(request(f"00-{TRACE}-{PARENT}-01"))
    t.pulled(PullDone("wA", "timeout", 3, 3.0, rid="seg-1"))
    t.end(span, "seg-1", out=None, generated=0, finish=None)
    pull, call = exporter.get_finished_spans()
    assert call.attributes is not None
    assert not pull.status.is_ok and call.attributes["evolving.ended_early"] is True


def test_a_pull_reported_after_its_call_ended_is_still_under_it() -> None:
    """The engine core's pull news comes over a socket and may reach the
    worker after the call it was made for has ended."""
    t, exporter = tracing()
    span = t.start(request(f"00-{TRACE}-{PARENT}-01"))
    t.end(span, "seg-1", out=None, generated=5, finish="stop")
    t.pulled(PullDone("wA", "ok", 3, 0.02, rid="seg-1", ended_at=1_700_000_000.5))
    call, pull = exporter.get_finished_spans()
    assert call.context is not None and pull.parent is not None
    assert pull.name == "kv_pull" and pull.parent.span_id == call.context.span_id
