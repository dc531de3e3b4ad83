"""Finished-request samples and arrival counts on their way to the planner.

The OpenAI service adds one `RequestSample` per finished request; the
planner loop drains them once per tick. It also counts every request that
is admitted (`count_arrival`, queued ones included) and every one refused
for a rate or concurrency limit (`count_rejection`): the planner takes the
offered load from these (`planner.arrivals`), not from what finished.
`WorkloadFeed` is the port; `LocalWorkloadFeed` keeps them in this process
(one gateway). A bounded buffer: past `max_samples` the oldest samples are
dropped (a planner that stopped ticking must not grow the gateway without
bound); the counts are two integers.
"""

from __future__ import annotations

import collections
from typing import Protocol

from planner.types import RequestSample


class WorkloadFeed(Protocol):
    def add(self, sample: RequestSample) -> None:
        """Called on the request path: must not block."""

    def drain(self) -> list[RequestSample]:
        """Every sample added since the last drain, oldest first."""

    def count_arrival(self) -> None:
        """A request passed admission (called on the request path: must not block)."""

    def count_rejection(self) -> None:
        """A request was refused by a rate or concurrency limit."""

    def counts(self) -> tuple[int, int]:
        """(arrived, rejected) since this feed was made."""


class LocalWorkloadFeed:
    def __init__(self, max_samples: int = 100_000) -> None:
        self._samples: collections.deque[RequestSample] = collections.deque(maxlen=max_samples)
        self._arrived = 0
        self._rejected = 0

    def add(self, sample: RequestSample) -> None:
        self._samples.append(sample)

    def count_arrival(self) -> None:
        self._arrived += 1

    def count_rejection(self) -> None:
        self._rejected += 1

    def counts(self) -> tuple[int, int]:
        return self._arrived, self._rejected

    def drain(self) -> list[RequestSample]:
        out = list(self._samples)
        self._samples.clear()
        return out

    def peek(self) -> list[RequestSample]:
        """What a drain would return, without draining (tests, admin views)."""
        return list(self._samples)
