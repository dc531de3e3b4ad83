"""Token buckets over explicit time: no clock reads, no I/O.

A bucket holds at most `capacity` tokens and refills continuously at
`rate_per_s`. Callers pass `now` (seconds, any monotonic origin) to every
call, so tests drive time with literal numbers.
"""

from __future__ import annotations

import math


class TokenBucket:
    """Continuous-refill token bucket; starts full."""

    def __init__(self, *, capacity: float, rate_per_s: float, now: float) -> None:
        if capacity <= 0 or rate_per_s <= 0:
            raise ValueError("capacity and rate_per_s must be > 0")
        self.capacity = float(capacity)
        self.rate_per_s = float(rate_per_s)
        self._tokens = float(capacity)
        self._updated = now

    @classmethod
    def per_minute(cls, limit: int, *, now: float) -> TokenBucket:
        """`limit` per minute, with a burst of up to one minute's worth."""
        return cls(capacity=limit, rate_per_s=limit / 60.0, now=now)

    def _refill(self, now: float) -> None:
        if now > self._updated:
            self._tokens = min(self.capacity, self._tokens + (now - self._updated) * self.rate_per_s)
            self._updated = now

    def available(self, now: float) -> float:
        self._refill(now)
        return self._tokens

    def wait_s(self, amount: float, now: float) -> float:
        """Seconds until `amount` tokens are available: 0 now, `inf` never (amount > capacity)."""
        if amount > self.capacity:
            return math.inf
        self._refill(now)
        missing = amount - self._tokens
        return 0.0 if missing <= 0 else missing / self.rate_per_s

    def take(self, amount: float, now: float) -> None:
        """Remove `amount` tokens; call only after `wait_s(amount, now) == 0`."""
        self._refill(now)
        if amount > self._tokens + 1e-9:
            raise ValueError("not enough tokens; check wait_s first")
        self._tokens -= amount

    def give_back(self, amount: float, now: float) -> None:
        """Return tokens taken for work that did not happen (capped at capacity)."""
        self._refill(now)
        self._tokens = min(self.capacity, self._tokens + amount)

    def reconfigure(self, *, capacity: float, rate_per_s: float, now: float) -> None:
        """Change the limit, keeping the current fill (clipped to the new capacity)."""
        if capacity <= 0 or rate_per_s <= 0:
            raise ValueError("capacity and rate_per_s must be > 0")
        self._refill(now)
        self.capacity, self.rate_per_s = float(capacity), float(rate_per_s)
        self._tokens = min(self._tokens, self.capacity)
