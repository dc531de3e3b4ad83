"""Which traced worker calls are in flight where: what a phase switch or a
planner decision links its span to.

`add(segment_id, node_id, span)` when a traced segment starts, `done` when
it ends; the span's context is built only when a link asks for it. A
migrated decode's segment ends (its stream closes with "migrated") before
the worker's answer to the switch names it, so ended segments stay findable
in a bounded window of the most recent ones.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Iterable
from typing import Protocol

from opentelemetry.trace import SpanContext

RECENT = 4096  # ended segments kept for `context_of` (a switch migrates at most a node's batch)


class HasContext(Protocol):
    def get_span_context(self) -> SpanContext: ...


class InflightSegments:
    def __init__(self, recent: int = RECENT) -> None:
        self._live: dict[str, tuple[str, HasContext]] = {}
        self._recent: OrderedDict[str, HasContext] = OrderedDict()
        self._keep = recent

    def add(self, segment_id: str, node_id: str, span: HasContext) -> None:
        self._live[segment_id] = (node_id, span)

    def done(self, segment_id: str) -> None:
        entry = self._live.pop(segment_id, None)
        if entry is None:
            return
        self._recent[segment_id] = entry[1]
        if len(self._recent) > self._keep:
            self._recent.popitem(last=False)

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
