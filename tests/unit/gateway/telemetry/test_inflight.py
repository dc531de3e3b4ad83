"""gateway.telemetry._inflight: what a switch or a decision links to."""

from __future__ import annotations

from opentelemetry.trace import SpanContext

from gateway.telemetry._inflight import InflightSegments


def ctx(n: int) -> SpanContext:
    return SpanContext(n, n, is_remote=False)


class Segment:
    """A stand-in span: the registry asks it for its context only when a link needs one."""

    def __init__(self, n: int) -> None:
        self.n = n

    def get_span_context(self) -> SpanContext:
        return ctx(self.n)


def test_live_segments_by_node_and_ended_ones_still_found_by_id() -> None:
    seg = InflightSegments(recent=2)
    seg.add("a", "w0", Segment(1))
    seg.add("b", "w1", Segment(2))
    seg.add("c", "w0", Segment(3))
    assert seg.on_nodes(["w0"]) == [ctx(1), ctx(3)] and seg.nodes() == {"a": "w0", "b": "w1", "c": "w0"}
    seg.done("a")  # a migrated decode ends before the switch's answer names it
    assert seg.on_nodes(["w0"]) == [ctx(3)] and len(seg) == 2
    assert seg.context_of(["a", "b", "zz"]) == [ctx(1), ctx(2)]
    seg.done("b")
    seg.done("c")  # the window keeps the 2 most recent: "a" is forgotten
    assert seg.context_of(["a", "b", "c"]) == [ctx(2), ctx(3)]
    seg.done("nope")  # unknown: nothing happens
    assert len(seg) == 0
