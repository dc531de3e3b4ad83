"""What a follower shows as the planner's latest decision: the leader's.

Followers record no decision of their own. The leader's decisions reach the
store through its event sink (within `SinkConfig.flush_interval_s`, 1 s by
default); `StoredDecision.latest` reads the newest one, cached for
`cache_s` so a console polling every follower costs one query per interval.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable

from gateway.store import repository
from gateway.store.db import Database, StoreUnavailable
from planner.types import Decision


class StoredDecision:
    def __init__(self, db: Database, *, cache_s: float = 0.5, clock: Callable[[], float] = time.monotonic) -> None:
        self.db = db
        self.cache_s = cache_s
        self._clock = clock
        self._cached: Decision | None = None
        self._read_at: float | None = None

    async def latest(self) -> Decision | None:
        now = self._clock()
        if self._read_at is not None and now - self._read_at < self.cache_s:
            return self._cached
        with contextlib.suppress(StoreUnavailable):  # keep the last one seen
            self._cached = await self.db.run_async(lambda s: repository.latest_decision(s))
        self._read_at = now
        return self._cached
