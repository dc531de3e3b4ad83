"""A minimal discrete-event loop: a heap of (time, seq, callback, args).

Contract: callbacks run in time order; ties run in scheduling order (seq), so
a run is deterministic. A callback may schedule further events at times
>= `now`. No wall clock is read.
"""

from __future__ import annotations

import heapq
from collections.abc import Callable
from typing import Any


class EventLoop:
    __slots__ = ("now", "_heap", "_seq", "processed")

    def __init__(self) -> None:
        self.now = 0.0
        self._heap: list[tuple[float, int, Callable[..., Any], tuple[Any, ...]]] = []
        self._seq = 0
        self.processed = 0

    def at(self, t: float, fn: Callable[..., Any], *args: Any) -> None:
        """Run `fn(*args)` at time `t` (clamped to now: the past cannot be scheduled)."""
        if t < self.now:
            t = self.now
        self._seq += 1
        heapq.heappush(self._heap, (t, self._seq, fn, args))

    def run(self, until: float) -> None:
        """Process every event with time <= `until`; leaves `now == until`."""
        heap = self._heap
        pop = heapq.heappop
        while heap and heap[0][0] <= until:
            t, _, fn, args = pop(heap)
            self.now = t
            fn(*args)
            self.processed += 1
        self.now = max(self.now, until)

    def __len__(self) -> int:
        return len(self._heap)
