"""gateway.telemetry._lean: the request path's spans keep the SDK samplers'
decisions and the trace's parentage."""

from __future__ import annotations

import random

import pytest
from opentelemetry.sdk.trace.sampling import Decision
from opentelemetry.trace import NonRecordingSpan, SpanContext, SpanKind, TraceFlags, TraceState, set_span_in_context

from core.tracing import TraceSettings
from gateway.telemetry._lean import LeanSink, LeanSpan
from gateway.telemetry._provider import sampler_of

SERVER = SpanKind.SERVER.value


def remote(sampled: bool, state: str = "") -> SpanContext:
    flags = TraceFlags(TraceFlags.SAMPLED if sampled else 0)
    trace_state = TraceState.from_header([state]) if state else TraceState()
    return SpanContext(0xABC, 0xDEF, is_remote=True, trace_flags=flags, trace_state=trace_state)


@pytest.mark.parametrize("ratio", [0.0, 0.3, 1.0])
@pytest.mark.parametrize("parent_based", [True, False])
def test_the_same_decisions_as_the_sdk_sampler(ratio: float, parent_based: bool) -> None:
    settings = TraceSettings(endpoint="http://c:4318/v1/traces", sample_ratio=ratio, parent_based=parent_based)
    sink, sdk = LeanSink(lambda span: None, settings), sampler_of(settings)
    rng = random.Random(7)
    for _ in range(2000):
        trace_id = rng.getrandbits(128)
        for parent in (None, remote(True), remote(False)):
            ctx = set_span_in_context(NonRecordingSpan(parent)) if parent is not None else None
            want = sdk.should_sample(ctx, trace_id, "x", SpanKind.SERVER).decision is Decision.RECORD_AND_SAMPLE
            assert sink.sampled(trace_id, parent) is want


def test_a_root_is_new_or_the_clients_child_and_children_share_its_trace() -> None:
    ended: list[LeanSpan] = []
    sink = LeanSink(ended.append, TraceSettings(endpoint="http://c:4318/v1/traces"))
    fresh = sink.root("chat", None, SERVER, {})
    assert fresh is not None and fresh.parent_id == 0 and fresh.trace_id and not fresh.parent_remote
    joined = sink.root("chat", remote(True, "k=v"), SERVER, {"a": 1})
    assert joined is not None
    assert (joined.trace_id, joined.parent_id, joined.parent_remote) == (0xABC, 0xDEF, True)
    assert joined.trace_state is not None and joined.trace_state.to_header() == "k=v"
    assert sink.root("chat", remote(False), SERVER, {}) is None  # the client did not sample it
    child = sink.child(joined, "tokenize", SpanKind.INTERNAL.value, None, 5)
    assert (child.trace_id, child.parent_id, child.start_time) == (0xABC, joined.span_id, 5)
    assert child.traceparent() == f"00-{0xABC:032x}-{child.span_id:016x}-01"
    ctx = child.get_span_context()
    assert (ctx.trace_id, ctx.span_id, ctx.trace_flags.sampled, ctx.trace_state.to_header()) == (
        0xABC,
        child.span_id,
        True,
        "k=v",
    )
    child.end()
    child.end()  # once
    assert ended == [child] and child.end_time > 0 and not child.is_recording()
