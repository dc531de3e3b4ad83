"""Which gateway replicas are alive: a heartbeat in Redis.

Each replica adds itself to `<p>:replicas` (a sorted set, score = the time
its entry lapses) every `interval_s` and reads how many entries have not
lapsed. The count is what the outage policies divide by (tenant limits and
branch caps while Redis is unreachable: limit ÷ replicas each), so the last
count seen is kept while Redis is down; before the first one,
`EVOLVING_GATEWAY_REPLICAS` (the deployment's own number). A replica that
stops cleanly removes itself.

The count never drops because Redis forgot someone: a replica counts every
member it saw in the last `ttl_s` of heartbeats that reached Redis, and
after heartbeats failed (Redis down or restarted empty) everyone seen
before is kept for one more `ttl_s`, the time each needs to register again.
Counting one replica too few would give this one too large a share (a
Redis restarted empty once read "1 replica" for a beat, and a replica
whose limiter had fallen back to its share admitted the whole limit).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable

import redis.asyncio as aioredis
from redis.exceptions import RedisError

log = logging.getLogger(__name__)


class Membership:
    def __init__(
        self,
        client: aioredis.Redis,
        prefix: str,
        replica: str,
        *,
        expected: int = 1,
        interval_s: float = 1.0,
        ttl_s: float = 3.0,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self._r = client
        self._key = f"{prefix}:replicas"
        self.replica = replica
        self.expected = max(1, expected)
        self.interval_s = interval_s
        self.ttl_s = ttl_s
        self._clock = clock
        self.known = False  # at least one count read from Redis
        self._seen: dict[str, float] = {}  # member -> when a heartbeat last saw it (or kept it)
        self._lost = False  # a heartbeat failed since the last one that reached Redis
        self._task: asyncio.Task[None] | None = None

    def count(self) -> int:
        """Live replicas: those seen in Redis over the last `ttl_s`, else the expected number."""
        return max(1, len(self._seen)) if self.known else self.expected

    def saw(self, members: list[str], now: float) -> None:
        """One heartbeat's answer: `members` are live now."""
        if self._lost:  # back after failures: those seen before have had no chance to register again
            self._seen = dict.fromkeys(self._seen, now)
            self._lost = False
        for m in members:
            self._seen[m] = now
        self._seen = {m: t for m, t in self._seen.items() if now - t <= self.ttl_s}
        self.known = True

    def lost(self) -> None:
        """A heartbeat did not reach Redis."""
        self._lost = True

    async def beat(self) -> None:
        now = self._clock()
        pipe = self._r.pipeline(transaction=True)
        pipe.zadd(self._key, {self.replica: now + self.ttl_s})
        pipe.zremrangebyscore(self._key, "-inf", now)
        pipe.zrangebyscore(self._key, now, "+inf")
        _, _, members = await pipe.execute()
        self.saw([m.decode() if isinstance(m, bytes) else str(m) for m in members], now)

    async def _loop(self) -> None:
        while True:
            try:
                await self.beat()
            except (RedisError, OSError) as exc:
                self.lost()
                log.debug("membership heartbeat failed: %s", exc)
            await asyncio.sleep(self.interval_s)

    async def start(self) -> None:
        try:
            await self.beat()
        except (RedisError, OSError):
            self.lost()
        if self._task is None or self._task.done():
            self._task = asyncio.get_running_loop().create_task(self._loop(), name="membership")

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
            self._task = None
        with contextlib.suppress(RedisError, OSError):
            await self._r.zrem(self._key, self.replica)
