"""gateway.telemetry._turn: a turn hands its spans over once, when it
finishes: every child ended (one left open ends as an error), its own span
last, in one list; an ended span's record stands; a span made after the
turn finished leaves alone when it ends."""

from __future__ import annotations

from opentelemetry.trace import SpanKind, StatusCode

from core.tracing import TraceSettings
from gateway.telemetry._inflight import InflightSegments
from gateway.telemetry._lean import LeanSink, LeanSpan
from gateway.telemetry._turn import Turn, current, end_span, start_span


def _turn() -> tuple[Turn, list[LeanSpan], list[list[LeanSpan]]]:
    alone: list[LeanSpan] = []
    handed: list[list[LeanSpan]] = []
    sink = LeanSink(alone.append, TraceSettings(endpoint="http://c:4318/v1/traces"), handed.append)
    root = sink.root("POST /v1/chat/completions", None, SpanKind.SERVER.value, {})
    assert root is not None
    return Turn(sink, root, InflightSegments(), "chat"), alone, handed


def test_a_turn_hands_its_spans_over_once_when_it_finishes() -> None:
    turn, alone, handed = _turn()
    turn.enter()
    assert current() is turn
    tokenize = start_span("tokenize", **{"evolving.prompt_chars": 10})
    assert tokenize is not None
    end_span(tokenize, input_tokens=3)
    end_span(tokenize, error="late", late=1)  # ended: its record stands
    left_open = turn.child("decode")
    assert handed == [] and alone == []  # nothing leaves while it runs
    turn.finish()
    assert current() is None
    assert handed == [[tokenize, left_open, turn.span]] and alone == []
    assert tokenize.attributes == {"evolving.prompt_chars": 10, "input_tokens": 3}
    assert tokenize.status is None and not tokenize.is_recording()
    assert left_open.status is not None and left_open.status.status_code is StatusCode.ERROR
    assert left_open.status.description == "the request ended first"
    assert all(s.parent_id == turn.span.span_id and s.trace_id == turn.span.trace_id for s in handed[0][:2])
    turn.finish()  # once
    assert len(handed) == 1


def test_a_span_made_after_the_turn_finished_leaves_alone() -> None:
    turn, alone, handed = _turn()
    turn.finish()
    late = turn.child("migrate")
    turn.end(late, {"evolving.migration.to_node": "w2"})
    other = turn.child("relay")
    other.end()
    assert alone == [late, other] and len(handed) == 1
    assert late.attributes == {"evolving.migration.to_node": "w2"}
