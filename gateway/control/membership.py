"""Which gateway replicas are alive: a heartbeat in Redis.

Each replica adds itself to `<p>:replicas` (a sorted set, score = the time
its entry lapses) every `interval_s` and reads how many entries have not
lapsed. The count is what the outage policies divide by (tenant limits and
branch caps while Redis is unreachable: limit ÷ replicas each), so the last
count seen is kept while Redis is down; before the first one,
`EVOLVING_GATEWAY_REPLICAS` (the deployment's own number). A replica that
stops cleanly removes itself.
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
        self.members: list[str] = []
        self.known = False  # at least one count read from Redis
        self._task: asyncio.Task[None] | None = None

    def count(self) -> int:
        """Live replicas: the last count seen in Redis, else the expected number."""
        return max(1, len(self.members)) if self.known else self.expected

    async def beat(self) -> None:
        now = self._clock()
        pipe = self._r.pipeline(transaction=True)
        pipe.zadd(self._key, {self.replica: now + self.ttl_s})
        pipe.zremrangebyscore(self._key, "-inf", now)
        pipe.zrangebyscore(self._key, now, "+inf")
        _, _, members = await pipe.execute()
        self.members, self.known = sorted(members), True

    async def _loop(self) -> None:
        while True:
            try:
                await self.beat()
            except (RedisError, OSError) as exc:
                log.debug("membership heartbeat failed: %s", exc)
            await asyncio.sleep(self.interval_s)

    async def start(self) -> None:
        with contextlib.suppress(RedisError, OSError):
            await self.beat()
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
