"""Offered load counted at arrival: requests the gateway received, queued
and rejected ones included, not only those that finished.

A planner that counts finished requests sees at most what the current
split serves: under open-loop overload the queue grows and the rate looks
like capacity, so the split looks right. The gateway (and the simulator)
report cumulative counts in each `ClusterView`; `ArrivalHistory` keeps them
per tick and answers the rate over any window it covers (linear between
ticks).
"""

from __future__ import annotations

import bisect


class ArrivalHistory:
    """Cumulative offered requests over time; `rate(start, end)` in requests/s."""

    def __init__(self, retention_s: float = 900.0) -> None:
        if retention_s <= 0:
            raise ValueError("retention_s must be > 0")
        self.retention_s = retention_s
        self._t: list[float] = []
        self._n: list[float] = []

    def add(self, t: float, total: float) -> None:
        """The cumulative count at time `t` (times increase; a counter that
        went down, a restarted gateway, starts the history again)."""
        if self._t and (t <= self._t[-1] or total < self._n[-1]):
            if t <= self._t[-1] and total >= self._n[-1]:
                self._n[-1] = total
                return
            self._t, self._n = [], []
        self._t.append(t)
        self._n.append(total)
        cut = bisect.bisect_left(self._t, t - self.retention_s) - 1
        if cut > 0:
            del self._t[:cut], self._n[:cut]

    def _at(self, x: float) -> float | None:
        t, n = self._t, self._n
        if not t or x < t[0]:
            return None
        if x >= t[-1]:
            return n[-1]
        i = bisect.bisect_right(t, x)
        f = (x - t[i - 1]) / (t[i] - t[i - 1])
        return n[i - 1] + f * (n[i] - n[i - 1])

    def rate(self, start: float, end: float, min_span_s: float = 10.0) -> float | None:
        """Offered requests / s over [start, end), or over the part of it the
        history covers when that is at least `min_span_s` (a new history);
        None otherwise."""
        if not self._t:
            return None
        lo = max(start, self._t[0])
        if end - lo < min_span_s or end <= lo:
            return None
        a, b = self._at(lo), self._at(end)
        assert a is not None and b is not None
        return (b - a) / (end - lo)
