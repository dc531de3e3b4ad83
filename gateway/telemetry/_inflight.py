"""Which traced worker calls are in flight where: what a phase switch or a
planner decision links its span to.

`add(segment_id, node_id, span)` when a traced segment starts, `done` when
it ends; the span's context is built only when a link asks for it. A
migrated decode's segment ends (its stream closes with "migrated") before
the worker's answer to the switch names it, so ended segments stay findable
in a bounded window of the most recent ones.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Protocol

from opentelemetry.trace import SpanContext, TraceState

from gateway.telemetry._lean import SAMPLED, LeanSpan

RECENT = 4096  # ended segments kept for `context_of` (a switch migrates at most a node's batch)


class HasContext(Protocol):
    def get_span_context(self) -> SpanContext: ...


class _Ended:
    """What an ended lean span leaves for a link: its ids. The span itself,
    with its attributes, is freed: the window held ~2 s of a loaded
    gateway's decode spans, attribute dicts and all, otherwise."""

    __slots__ = ("trace_id", "span_id", "trace_state")

    def __init__(self, span: LeanSpan) -> None:
        self.trace_id = span.trace_id
        self.span_id = span.span_id
        self.trace_state: TraceState | None = span.trace_state

    def get_span_context(self) -> SpanContext:
        return SpanContext(self.trace_id, self.span_id, False, SAMPLED, self.trace_state)


class InflightSegments:
    def __init__(self, recent: int = RECENT) -> None:
        self._live: dict[str, tuple[str, HasContext]] = {}
        self._recent: dict[str, HasContext] = {}
        # The recent segments' ids in a ring: the oldest is overwritten (an
        # OrderedDict's node per entry cost ~1 µs a traced request).
        self._ring: list[str | None] = [None] * recent
        self._next = 0

    def add(self, segment_id: str, node_id: str, span: HasContext) -> None:
        self._live[segment_id] = (node_id, span)

    def done(self, segment_id: str) -> None:
        entry = self._live.pop(segment_id, None)
        if entry is None:
            return
        ring, i = self._ring, self._next
        oldest = ring[i]
        if oldest is not None:
            self._recent.pop(oldest, None)  # (an id done twice leaves with its older slot)
        ring[i] = segment_id
        span = entry[1]
        self._recent[segment_id] = _Ended(span) if isinstance(span, LeanSpan) else span
        self._next = (i + 1) % len(ring)

    def on_nodes(self, node_ids: Iterable[str]) -> list[SpanContext]:
        """The span contexts of the traced calls now running on these nodes."""
        wanted = set(node_ids)
        return [span.get_span_context() for node, span in self._live.values() if node in wanted]

    def context_of(self, segment_ids: Iterable[str]) -> list[SpanContext]:
        """The span contexts of these segments, running or recently ended (unknown ids are skipped)."""
        out = []
        for sid in segment_ids:
            live = self._live.get(sid)
            span = live[1] if live is not None else self._recent.get(sid)
            if span is not None:
                out.append(span.get_span_context())
        return out

    def nodes(self) -> dict[str, str]:
        """Segment id -> node of every traced call in flight."""
        return {sid: node for sid, (node, _) in self._live.items()}

    def __len__(self) -> int:
        return len(self._live)
