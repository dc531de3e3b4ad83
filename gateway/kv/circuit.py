"""`CircuitBreaker`: stop waiting on a backend that is down, probe it now and then.

Pure over explicit time (callers pass `now`, monotonic seconds), so tests use
literal numbers. One breaker guards one backend (the gateway shares one per
Redis server between the directory and the tenant limits):

- **closed** (healthy): every call goes to the backend.
- after a failure: **open** for `backoff` seconds (`initial_s`, doubling per
  consecutive failure up to `max_s`): callers take their fallback at once
  instead of each waiting out the client's timeout.
- when the backoff ends: **half-open**: one caller probes the backend (the
  others keep the fallback while the probe runs); success closes the
  circuit, failure opens it again with the next backoff.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass
class CircuitBreaker:
    initial_s: float = 0.5
    max_s: float = 5.0
    failures: int = 0  # consecutive failures
    opened_until: float = 0.0
    probing: bool = False
    trips: int = 0  # closed -> open transitions, for metrics and tests

    def __post_init__(self) -> None:
        if self.initial_s <= 0 or self.max_s < self.initial_s:
            raise ValueError("need 0 < initial_s <= max_s")

    @property
    def closed(self) -> bool:
        return self.failures == 0

    def allow(self, now: float) -> bool:
        """May this caller use the backend now? (Half-open: True for one prober.)"""
        if self.failures == 0:
            return True
        if now < self.opened_until or self.probing:
            return False
        self.probing = True
        return True

    def success(self) -> None:
        self.failures, self.probing, self.opened_until = 0, False, 0.0

    def failure(self, now: float) -> float:
        """Record a failed call; returns until when the circuit stays open."""
        if self.failures == 0:
            self.trips += 1
        self.failures += 1
        self.probing = False
        self.opened_until = now + self.backoff_s(self.failures)
        return self.opened_until

    def backoff_s(self, failures: int) -> float:
        """Open time after `failures` consecutive failures (>= 1)."""
        return min(self.max_s, self.initial_s * 2.0 ** max(0, failures - 1))
