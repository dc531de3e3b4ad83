"""Sliding-window logs over explicit time: no clock reads, no I/O.

A tenant's "N requests per minute" (or tokens) means: at most N in *any*
window of `window_s` seconds. The log keeps one entry per admission (its
time, its amount and an id so it can be taken back) and forgets entries
older than the window. Unlike a token bucket that starts full and refills,
it never lets through more than N in one window (a bucket of capacity N
admits up to 2N in the first minute). The Redis limiter
(`gateway.serving.policy.cluster_limits`) keeps the same log in sorted sets
with the same arithmetic, so one gateway and several replicas enforce the
same thing.

Callers pass `now` (seconds, any monotonic origin) to every call, so tests
drive time with literal numbers.
"""

from __future__ import annotations

import collections
import math


class SlidingWindowLog:
    """At most `limit` units in any `window_s` seconds."""

    def __init__(self, limit: int, window_s: float = 60.0) -> None:
        if limit < 1 or window_s <= 0:
            raise ValueError("limit must be >= 1 and window_s > 0")
        self.limit = limit
        self.window_s = window_s
        self._entries: collections.deque[tuple[float, int, int]] = collections.deque()  # (t, amount, id)
        self._used = 0

    def _expire(self, now: float) -> None:
        cutoff = now - self.window_s
        while self._entries and self._entries[0][0] <= cutoff:
            _, amount, _ = self._entries.popleft()
            self._used -= amount

    def used(self, now: float) -> int:
        self._expire(now)
        return self._used

    def wait_s(self, amount: int, now: float) -> float:
        """Seconds until `amount` more fit: 0 now, `inf` never (amount > limit)."""
        if amount > self.limit:
            return math.inf
        self._expire(now)
        excess = self._used + amount - self.limit
        if excess <= 0:
            return 0.0
        freed = 0
        for t, a, _ in self._entries:  # oldest first: when enough of them have left the window
            freed += a
            if freed >= excess:
                return t + self.window_s - now
        return self.window_s  # unreachable while the invariant used <= limit holds

    def add(self, amount: int, now: float, entry_id: int) -> None:
        """Record an admission; call only after `wait_s(amount, now) == 0`."""
        self._expire(now)
        self._entries.append((now, amount, entry_id))
        self._used += amount

    def remove(self, entry_id: int) -> bool:
        """Take an admission back (its request never ran)."""
        for i, (_, amount, eid) in enumerate(self._entries):
            if eid == entry_id:
                del self._entries[i]
                self._used -= amount
                return True
        return False

    def resize(self, limit: int) -> None:
        """A new limit; what the window holds stays (it may exceed a lower limit until it ages out)."""
        if limit < 1:
            raise ValueError("limit must be >= 1")
        self.limit = limit
