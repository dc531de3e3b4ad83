"""`AsyncDirectory`: any synchronous `BlockDirectory` behind the async contract.

For in-process backends (the memory directory: one gateway process) each
call is a plain method call with nothing to wait on, so wrapping it in a
coroutine costs one frame and never blocks the loop. Backends that do I/O
implement `AsyncBlockDirectory` themselves (`redis_backend.AsyncRedisDirectory`).
"""

from __future__ import annotations

from collections.abc import Sequence

from kvpool.directory.base import BlockDirectory, BranchInfo, DirectoryStats, PrefixHit


class AsyncDirectory:
    """`AsyncBlockDirectory` over a synchronous, non-blocking `BlockDirectory`."""

    def __init__(self, inner: BlockDirectory) -> None:
        self.inner = inner

    async def publish(self, node_id: str, locations: Sequence[tuple[str, int]], block_bytes: int, now: float) -> None:
        self.inner.publish(node_id, locations, block_bytes, now)

    async def unpublish(self, node_id: str, block_hashes: Sequence[str]) -> None:
        self.inner.unpublish(node_id, block_hashes)

    async def drop_node(self, node_id: str) -> list[str]:
        return self.inner.drop_node(node_id)

    async def longest_prefix(
        self,
        block_hashes: Sequence[str],
        *,
        prefer: str | None = None,
        exclude: Sequence[str] = (),
        record: bool = True,
    ) -> PrefixHit:
        return self.inner.longest_prefix(block_hashes, prefer=prefer, exclude=exclude, record=record)

    async def touch_blocks(self, node_id: str, block_hashes: Sequence[str], now: float) -> None:
        self.inner.touch_blocks(node_id, block_hashes, now)

    async def open_branch(
        self,
        branch_id: str,
        tenant_id: str,
        now: float,
        parent_id: str | None = None,
        session_id: str | None = None,
        max_active: int | None = None,
    ) -> BranchInfo:
        return self.inner.open_branch(branch_id, tenant_id, now, parent_id, session_id, max_active)

    async def touch(self, branch_id: str, now: float) -> None:
        self.inner.touch(branch_id, now)

    async def reference(self, branch_id: str, block_hashes: Sequence[str], now: float) -> int:
        return self.inner.reference(branch_id, block_hashes, now)

    async def finish_branch(self, branch_id: str) -> BranchInfo | None:
        return self.inner.finish_branch(branch_id)

    async def expire(self, now: float, idle_ttl_s: float) -> list[str]:
        return self.inner.expire(now, idle_ttl_s)

    async def branch(self, branch_id: str) -> BranchInfo | None:
        return self.inner.branch(branch_id)

    async def ref_counts(self, block_hashes: Sequence[str]) -> list[int]:
        return self.inner.ref_counts(block_hashes)

    async def branch_blocks(self, tenant_id: str) -> int:
        return self.inner.branch_blocks(tenant_id)

    async def tenant_ref_counts(self, tenant_id: str, block_hashes: Sequence[str]) -> list[int]:
        return self.inner.tenant_ref_counts(tenant_id, block_hashes)

    async def active_branch_count(self, tenant_id: str) -> int:
        return self.inner.active_branch_count(tenant_id)

    async def top_branches(self, n: int) -> list[BranchInfo]:
        return self.inner.top_branches(n)

    async def choose_victims(self, node_id: str, n: int) -> list[str]:
        return self.inner.choose_victims(node_id, n)

    async def eviction_order(self, node_id: str, candidates: Sequence[str]) -> list[str]:
        return self.inner.eviction_order(node_id, candidates)

    async def stats(self) -> DirectoryStats:
        return self.inner.stats()

    async def flush_stats(self) -> None:
        return None  # an in-process directory counts at once
