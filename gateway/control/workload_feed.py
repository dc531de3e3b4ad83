"""Finished-request samples on their way to the planner.

The OpenAI service adds one `RequestSample` per finished request, with the
branch it belonged to; the planner loop drains them once per tick.
`WorkloadFeed` is the port. The feed, not the service, knows the agents'
turn gaps (`planner.offered.TurnGaps`: a request's arrival minus the end of
its branch's previous request), because with several replicas a branch's
turns land on different ones:

- `LocalWorkloadFeed` (one gateway process): gaps from its own `TurnGaps`,
  samples kept in memory;
- `gateway.control.workload_stream.RedisWorkloadFeed` (several replicas):
  gaps computed in Redis from the branch's last finish, whichever replica
  served it, and every replica's samples on one stream that every replica's
  planner reads.

Bounded: past `max_samples` the oldest are dropped (a planner that stopped
ticking must not grow the gateway without bound).
"""

from __future__ import annotations

import collections
import dataclasses
from typing import Protocol

from planner.offered import TurnGaps
from planner.types import RequestSample


class WorkloadFeed(Protocol):
    def add(self, sample: RequestSample, *, branch: str | None = None, last_in_branch: bool = False) -> None:
        """One finished request; called on the request path, must not block.

        With `branch` the feed sets `sample.gap_s` from the branch's previous
        request (`last_in_branch`: the branch ends with this one); without,
        the sample is kept as given (open-loop traffic, no gap).
        """

    def drain(self) -> list[RequestSample]:
        """Every sample added since the last drain (all replicas' on a shared feed), oldest first."""


class LocalWorkloadFeed:
    def __init__(self, max_samples: int = 100_000, turn_gaps: TurnGaps | None = None) -> None:
        self._samples: collections.deque[RequestSample] = collections.deque(maxlen=max_samples)
        self.turn_gaps = turn_gaps or TurnGaps()

    def add(self, sample: RequestSample, *, branch: str | None = None, last_in_branch: bool = False) -> None:
        if branch is not None:
            finish = sample.t + (sample.e2e_s or 0.0)
            sample = dataclasses.replace(
                sample, gap_s=self.turn_gaps.finished(branch, sample.t, finish, last_in_branch)
            )
        self._samples.append(sample)

    def drain(self) -> list[RequestSample]:
        out = list(self._samples)
        self._samples.clear()
        return out

    def peek(self) -> list[RequestSample]:
        """What a drain would return, without draining (tests, admin views)."""
        return list(self._samples)
