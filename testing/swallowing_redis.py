"""A fake Redis client whose blocking reads turn a cancel into a Redis
`TimeoutError`, as redis-py's can when the cancel lands while its socket
timeout fires: a loop that retries on RedisError would then never end.
Enough of the client for `RedisWorkloadFeed` and `RedisBus` to start,
block and be stopped; nothing is stored."""

from __future__ import annotations

import asyncio
from typing import Any

from redis.exceptions import TimeoutError as RedisTimeout


async def _block() -> None:
    try:
        await asyncio.sleep(3600)
    except asyncio.CancelledError:
        raise RedisTimeout("Timeout reading from socket") from None


class SwallowingPubSub:
    async def subscribe(self, *channels: str) -> None:
        return None

    async def get_message(self, timeout: float = 0.0) -> dict[str, Any] | None:
        await _block()
        return None

    async def aclose(self) -> None:
        return None


class SwallowingRedis:
    def __init__(self) -> None:
        self.blocked_reads = 0

    def register_script(self, script: str) -> Any:
        async def run(*args: Any, **kwargs: Any) -> None:
            return None

        return run

    async def xread(self, *args: Any, **kwargs: Any) -> list[Any]:
        self.blocked_reads += 1
        await _block()
        return []

    async def mget(self, *keys: str) -> list[None]:
        return [None for _ in keys]

    def pubsub(self, **kwargs: Any) -> SwallowingPubSub:
        return SwallowingPubSub()
