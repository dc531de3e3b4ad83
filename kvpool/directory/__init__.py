"""Cluster KV directory: block locations, branch reference counts, eviction order.

Public API: `BlockDirectory` (the contract) and `AsyncBlockDirectory` (the
same contract as coroutines, what the gateway's event loop calls), their data
types, and two backends chosen by name through `DIRECTORY_BACKENDS` /
`create_directory`: "memory" (one gateway process; `MemoryDirectory` is also
the synchronous directory the simulator drives) and "redis" (several gateway
replicas, `redis.asyncio`).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from kvpool.directory.aio import AsyncDirectory
from kvpool.directory.base import (
    BRANCH_TRANSITIONS,
    AsyncBlockDirectory,
    BlockDirectory,
    BranchEvent,
    BranchInfo,
    BranchLimitReached,
    BranchState,
    BranchStateError,
    DirectoryError,
    DirectoryStats,
    DirectoryUnavailable,
    Location,
    PrefixHit,
)
from kvpool.directory.memory import MemoryDirectory


def _memory() -> AsyncBlockDirectory:
    return AsyncDirectory(MemoryDirectory())


def _redis(url: str = "redis://127.0.0.1:6379/0", prefix: str = "{kvpool}", client: Any = None) -> AsyncBlockDirectory:
    from kvpool.directory.redis_backend import AsyncRedisDirectory

    return AsyncRedisDirectory(client, prefix) if client is not None else AsyncRedisDirectory.from_url(url, prefix)


DIRECTORY_BACKENDS: dict[str, Callable[..., AsyncBlockDirectory]] = {
    "memory": _memory,
    "redis": _redis,
}


def create_directory(backend: str = "memory", **options: Any) -> AsyncBlockDirectory:
    """`create_directory("redis", url=..., prefix=...)` or `client=` (a
    `redis.asyncio.Redis` shared with other users); no I/O until first call."""
    try:
        factory = DIRECTORY_BACKENDS[backend]
    except KeyError:
        raise ValueError(f"unknown directory backend {backend!r}; have {sorted(DIRECTORY_BACKENDS)}") from None
    return factory(**options)


__all__ = [
    "BRANCH_TRANSITIONS",
    "AsyncBlockDirectory",
    "AsyncDirectory",
    "BlockDirectory",
    "BranchEvent",
    "BranchInfo",
    "BranchLimitReached",
    "BranchState",
    "BranchStateError",
    "DIRECTORY_BACKENDS",
    "DirectoryError",
    "DirectoryStats",
    "DirectoryUnavailable",
    "Location",
    "MemoryDirectory",
    "PrefixHit",
    "create_directory",
]
