"""Cluster KV directory: block locations, branch reference counts, eviction order.

Public API: `BlockDirectory` (the contract), its data types, and two
backends chosen by name through `DIRECTORY_BACKENDS` / `create_directory`.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from kvpool.directory.base import (
    BRANCH_TRANSITIONS,
    BlockDirectory,
    BranchEvent,
    BranchInfo,
    BranchState,
    BranchStateError,
    DirectoryError,
    DirectoryStats,
    Location,
    PrefixHit,
)
from kvpool.directory.memory import MemoryDirectory


def _redis(url: str = "redis://127.0.0.1:6379/0", prefix: str = "{kvpool}") -> BlockDirectory:
    from kvpool.directory.redis_backend import RedisDirectory

    return RedisDirectory.from_url(url, prefix)


DIRECTORY_BACKENDS: dict[str, Callable[..., BlockDirectory]] = {
    "memory": MemoryDirectory,
    "redis": _redis,
}


def create_directory(backend: str = "memory", **options: Any) -> BlockDirectory:
    """`create_directory("redis", url=..., prefix=...)`; no I/O until first call."""
    try:
        factory = DIRECTORY_BACKENDS[backend]
    except KeyError:
        raise ValueError(f"unknown directory backend {backend!r}; have {sorted(DIRECTORY_BACKENDS)}") from None
    return factory(**options)


__all__ = [
    "BRANCH_TRANSITIONS",
    "BlockDirectory",
    "BranchEvent",
    "BranchInfo",
    "BranchState",
    "BranchStateError",
    "DIRECTORY_BACKENDS",
    "DirectoryError",
    "DirectoryStats",
    "Location",
    "MemoryDirectory",
    "PrefixHit",
    "create_directory",
]
