"""W3C Trace Context (`traceparent`) to and from span contexts, by hand: the
request path formats one per worker call and parses one per client request,
and the propagator's carrier machinery costs several times this."""

from __future__ import annotations

from opentelemetry.trace import SpanContext, TraceFlags, TraceState

_HEX = frozenset("0123456789abcdef")


def format_traceparent(ctx: SpanContext) -> str:
    return f"00-{ctx.trace_id:032x}-{ctx.span_id:016x}-{int(ctx.trace_flags):02x}"


def parse_traceparent(value: str | None, tracestate: str | None = None) -> SpanContext | None:
    """The remote parent a `traceparent` header names; None for an absent or
    malformed one (the W3C rule: then start a new trace, never fail the request)."""
    if not value:
        return None
    parts = value.strip().lower().split("-")
    if len(parts) < 4 or len(parts[0]) != 2 or parts[0] == "ff":
        return None
    version, trace_hex, span_hex, flags_hex = parts[:4]
    if version == "00" and len(parts) != 4:
        return None
    if len(trace_hex) != 32 or len(span_hex) != 16 or len(flags_hex) != 2:
        return None
    if not set(trace_hex + span_hex + flags_hex + version) <= _HEX:
        return None
    trace_id, span_id = int(trace_hex, 16), int(span_hex, 16)
    if trace_id == 0 or span_id == 0:
        return None
    state = TraceState.from_header([tracestate]) if tracestate else TraceState()
    return SpanContext(
        trace_id, span_id, is_remote=True, trace_flags=TraceFlags(int(flags_hex, 16) & 1), trace_state=state
    )
