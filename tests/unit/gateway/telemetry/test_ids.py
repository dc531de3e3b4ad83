"""W3C traceparent parsing and formatting (gateway.telemetry._ids)."""

from __future__ import annotations

import pytest
from opentelemetry.trace import SpanContext, TraceFlags

from gateway.telemetry._ids import format_traceparent, parse_traceparent

VALID = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"


def test_round_trip() -> None:
    ctx = parse_traceparent(VALID, "vendor=x")
    assert ctx is not None and ctx.is_remote and ctx.trace_flags.sampled
    assert ctx.trace_id == 0x4BF92F3577B34DA6A3CE929D0E0E4736 and ctx.span_id == 0x00F067AA0BA902B7
    assert ctx.trace_state.get("vendor") == "x"
    assert format_traceparent(ctx) == VALID


def test_unsampled_flag_is_kept() -> None:
    ctx = parse_traceparent(VALID[:-2] + "00")
    assert ctx is not None and not ctx.trace_flags.sampled


@pytest.mark.parametrize(
    "value",
    [
        None,
        "",
        "garbage",
        "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7",  # no flags
        "00-00000000000000000000000000000000-00f067aa0ba902b7-01",  # all-zero trace id
        "00-4bf92f3577b34da6a3ce929d0e0e4736-0000000000000000-01",  # all-zero span id
        "ff-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",  # version ff is invalid
        "00-4bf92f3577b34da6a3ce929d0e0e473-00f067aa0ba902b7-01",  # short trace id
        "00-4bf92f3577b34da6a3ce929d0e0e47zz-00f067aa0ba902b7-01",  # not hex
        VALID + "-extra",  # version 00 has exactly four fields
    ],
)
def test_malformed_values_start_a_new_trace(value: str | None) -> None:
    assert parse_traceparent(value) is None


def test_a_future_version_with_more_fields_is_read() -> None:
    assert parse_traceparent("01" + VALID[2:] + "-what-comes-next") is not None


def test_format() -> None:
    ctx = SpanContext(1, 2, is_remote=False, trace_flags=TraceFlags(1))
    assert format_traceparent(ctx) == "00-00000000000000000000000000000001-0000000000000002-01"
