"""`BlockingDirectory`: an `AsyncBlockDirectory` driven from synchronous code,
each call run on one private event loop in a thread. Lets the one contract
suite (`testing.directory_contract`, synchronous) and threaded replica tests
run against the async Redis backend."""

from __future__ import annotations

from typing import Any

from testing.stacks import LoopThread


class BlockingDirectory:
    def __init__(self, factory: Any) -> None:
        """`factory()` builds the async directory; it runs on the private loop
        (a `redis.asyncio` client belongs to the loop that first uses it)."""
        self.loop = LoopThread()

        async def build() -> Any:
            return factory()

        self.inner = self.loop.run(build())

    def __getattr__(self, name: str) -> Any:
        method = getattr(self.inner, name)

        def call(*args: Any, **kwargs: Any) -> Any:
            return self.loop.run(method(*args, **kwargs))

        return call

    def close(self) -> None:
        self.loop.close()
