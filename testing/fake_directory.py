"""`FlakyDirectory`: an async directory (memory inside) that can be made
unreachable, for unit tests of what the gateway does when Redis is down.
Every call raises `DirectoryUnavailable` while `down` is true."""

from __future__ import annotations

from typing import Any

from kvpool.directory import AsyncDirectory, DirectoryUnavailable, MemoryDirectory


class FlakyDirectory:
    def __init__(self) -> None:
        self.inner = AsyncDirectory(MemoryDirectory())
        self.down = False
        self.calls = 0

    def __getattr__(self, name: str) -> Any:
        method = getattr(self.inner, name)

        async def call(*args: Any, **kwargs: Any) -> Any:
            self.calls += 1
            if self.down:
                raise DirectoryUnavailable("redis: ConnectionError: connection refused (fake)")
            return await method(*args, **kwargs)

        return call

    async def publish(self, *args: Any, **kwargs: Any) -> Any:  # GatewayDirectory checks this one is a coroutine
        return await self.__getattr__("publish")(*args, **kwargs)
