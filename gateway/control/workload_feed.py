"""Finished-request samples on their way to the planner.

The OpenAI service adds one `RequestSample` per finished request; the
planner loop drains them once per tick. `WorkloadFeed` is the port;
`LocalWorkloadFeed` keeps them in this process (one gateway). A bounded
buffer: past `max_samples` the oldest are dropped (a planner that stopped
ticking must not grow the gateway without bound).
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


class LocalWorkloadFeed:
    def __init__(self, max_samples: int = 100_000) -> None:
        self._samples: collections.deque[RequestSample] = collections.deque(maxlen=max_samples)

    def add(self, sample: RequestSample) -> None:
        self._samples.append(sample)

    def drain(self) -> list[RequestSample]:
        out = list(self._samples)
        self._samples.clear()
        return out

    def peek(self) -> list[RequestSample]:
        """What a drain would return, without draining (tests, admin views)."""
        return list(self._samples)
