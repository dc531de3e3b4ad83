"""gateway.telemetry._inflight: what a switch or a decision links to."""

from __future__ import annotations

import gc

from opentelemetry.trace import SpanContext

from gateway.telemetry._inflight import InflightSegments
from gateway.telemetry._lean import LeanSpan


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


def test_an_ended_lean_span_leaves_only_its_ids_for_links() -> None:
    seg = InflightSegments(recent=2)
    span = LeanSpan(None, "decode", 0xABC, 7, 3, {"evolving.node": "w0"}, 1_000)
    seg.add("a", "w0", span)
    seg.done("a")
    (kept,) = seg.context_of(["a"])
    assert kept == span.get_span_context() and kept.trace_flags.sampled and not kept.is_remote
    # the span (and its attributes) is no longer referenced by the window
    assert not any(r is seg._recent for r in gc.get_referrers(span))
    assert all(v is not span for v in seg._recent.values())


def test_an_id_done_twice_leaves_the_window_with_its_older_slot() -> None:
    seg = InflightSegments(recent=3)
    for sid, n in (("a", 1), ("b", 2), ("a", 3)):  # "a" runs again (a retried segment id)
        seg.add(sid, "w0", Segment(n))
        seg.done(sid)
    assert seg.context_of(["a", "b"]) == [ctx(3), ctx(2)]
    seg.add("c", "w0", Segment(4))
    seg.done("c")  # overwrites the oldest slot, "a"'s first: "a" goes
    assert seg.context_of(["a", "b", "c"]) == [ctx(2), ctx(4)]
