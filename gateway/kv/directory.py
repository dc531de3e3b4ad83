"""The gateway's view of the cluster KV directory (`kvpool.directory`).

`Directory` is the port the router, orchestrator and registry use;
`GatewayDirectory` adapts any `kvpool.directory.AsyncBlockDirectory`
(memory backend for one gateway, Redis for replicas; a synchronous
`BlockDirectory` such as the memory one is wrapped). The adapter adds what
the gateway needs on top: prompt hashing (`kvpool.hashing`, identical to the
workers'), the clock, the branch TTL, block locations re-picked for the node
that will load them, and what happens when the backend is unreachable.

Contract:
- One hash per *full* block, chained and salted; the salt is the tenant's
  cache salt plus the model (the gateway passes it as `tenant_salt`).
- `lookup` has no side effects beyond hit-rate counters (`record=False`
  skips those, for resumes).
- A branch references the blocks it used; referenced blocks stay while the
  branch is active; `finish_branch` and `expire` release them.
- KV retention quota (tenant policy `kv_retention_blocks`, passed at
  `open_branch`): the tenant's active branches pin at most that many
  distinct blocks. Past it, `reference` pins only the longest prefix of the
  new blocks that fits; the rest stay cached but unreferenced, so they are
  evicted first (LRU) under pressure. Requests are never refused for it:
  the quota bounds what a tenant can hold, not what it can run.
- Every method but `block_hashes` is a coroutine (Redis: one round trip,
  never blocking the event loop).
- Backend unreachable (`DirectoryUnavailable`, or the shared circuit breaker
  open after one): no cache hit, no published or referenced block, never an
  error to the caller. Branch counts then come from this replica's own
  record of the branches it opened, multiplied by the number of replicas
  (`replicas()`), so a tenant's `max_active_branches` still holds
  cluster-wide as "limit ÷ replicas" per replica, never unlimited.
"""

from __future__ import annotations

import inspect
import logging
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, replace
from typing import Protocol, TypeVar, cast

from gateway.kv.circuit import CircuitBreaker
from gateway.kv.views import BranchSummary, DirectoryStatus
from kvpool.directory import (
    AsyncBlockDirectory,
    AsyncDirectory,
    BlockDirectory,
    BranchInfo,
    BranchLimitReached,
    BranchStateError,
    DirectoryUnavailable,
)
from kvpool.hashing import block_hashes as kv_block_hashes
from kvpool.hashing import extend_block_hashes
from workers.protocol import BlockLocation

log = logging.getLogger(__name__)
T = TypeVar("T")

BlockHasher = Callable[[Sequence[int], int, str], list[str]]


def default_block_hasher() -> BlockHasher:
    return kv_block_hashes


@dataclass(frozen=True)
class PrefixHit:
    """Where the prompt's cached prefix lives. Block i covers tokens [i*B, (i+1)*B)."""

    block_size: int
    block_hashes: list[str]  # every full block of the prompt
    holders: list[dict[str, int]]  # per cached prefix block: node_id -> slot
    per_node_blocks: dict[str, int]  # node -> contiguous prefix blocks it holds

    @property
    def pool_cached_tokens(self) -> int:
        return len(self.holders) * self.block_size

    def cached_by_node(self) -> dict[str, int]:
        return {n: b * self.block_size for n, b in self.per_node_blocks.items()}

    def locations(self, prefer: str | None = None, max_blocks: int | None = None) -> list[BlockLocation]:
        """One location per cached block: `prefer`'s own copy when it has one,
        else the holder with the longest prefix (fewest peers), ties by id."""
        n = len(self.holders) if max_blocks is None else min(max_blocks, len(self.holders))
        out = []
        for i in range(n):
            nodes = self.holders[i]
            node = prefer if prefer in nodes else min(nodes, key=lambda x: (-self.per_node_blocks.get(x, 0), x))
            out.append(BlockLocation(block_hash=self.block_hashes[i], node_id=node, slot=nodes[node]))
        return out


class Directory(Protocol):
    block_size: int

    def block_hashes(self, token_ids: Sequence[int], salt: str, *, known: Sequence[str] = ()) -> list[str]:
        """Hashes of every full block; `known`: those of a prefix of the same tokens (reused, not redone)."""

    async def lookup(
        self,
        token_ids: Sequence[int],
        salt: str,
        *,
        exclude: Sequence[str] = (),
        record: bool = True,
        known: Sequence[str] = (),
    ) -> PrefixHit: ...
    async def publish(self, node_id: str, blocks: Sequence[BlockLocation], block_bytes: int = 0) -> None: ...
    async def unpublish(self, node_id: str, hashes: Sequence[str]) -> None: ...
    async def drop_node(self, node_id: str) -> None: ...
    async def open_branch(
        self,
        branch_id: str,
        *,
        tenant_id: str,
        parent_id: str | None = None,
        session_id: str | None = None,
        kv_retention_blocks: int | None = None,
        max_active_branches: int | None = None,
    ) -> bool:
        """Open or touch the branch; False (nothing opened) for a new branch
        of a tenant already at `max_active_branches`, checked atomically."""

    async def is_branch_active(self, branch_id: str) -> bool: ...
    async def active_branch_count(self, tenant_id: str) -> int: ...
    async def reference(self, branch_id: str, hashes: Sequence[str]) -> None: ...
    async def finish_branch(self, branch_id: str) -> bool: ...
    async def expire(self, now: float | None = None) -> list[str]: ...
    async def stats(self) -> DirectoryStatus: ...
    async def top_branches(self, limit: int = 10) -> list[BranchSummary]: ...
    async def flush_stats(self) -> None: ...


class GatewayDirectory:
    """`Directory` over an `AsyncBlockDirectory` (module docstring)."""

    def __init__(
        self,
        directory: AsyncBlockDirectory | BlockDirectory,
        *,
        block_size: int = 16,
        branch_ttl_s: float = 1800.0,
        hasher: BlockHasher = kv_block_hashes,
        clock: Callable[[], float] = time.time,
        breaker: CircuitBreaker | None = None,
        replicas: Callable[[], int] = lambda: 1,
        monotonic: Callable[[], float] = time.monotonic,
    ) -> None:
        self.backend: AsyncBlockDirectory = (
            cast(AsyncBlockDirectory, directory)
            if inspect.iscoroutinefunction(directory.publish)
            else AsyncDirectory(cast(BlockDirectory, directory))
        )
        self.block_size = block_size
        self._ttl = branch_ttl_s
        self._hasher = hasher
        self._clock = clock  # wall clock: replicas sharing a Redis directory share its base
        self._monotonic = monotonic
        self._breaker = breaker or CircuitBreaker()
        self._replicas = replicas
        self._block_bytes: dict[str, int] = {}
        self._retention: dict[str, int] = {}  # tenant -> kv_retention_blocks (latest policy seen)
        # branches this replica opened and has not seen end: tenant -> branch -> last use (outage fallback)
        self._own: dict[str, dict[str, float]] = {}
        self._last_stats = DirectoryStatus(available=False)  # before the backend ever answered
        self.unpinned_over_quota = 0  # blocks left unreferenced by the retention quota
        self.unavailable = 0  # calls answered without the backend (down, or circuit open)

    # -- the backend, guarded --------------------------------------------------
    @property
    def backend_available(self) -> bool:
        return self._breaker.closed

    async def _call(self, what: str, fn: Callable[[], Awaitable[T]], fallback: T) -> T:
        """`await fn()`, or `fallback` when the backend is down (never raises for that)."""
        if not self._breaker.allow(self._monotonic()):
            self.unavailable += 1
            return fallback
        try:
            result = await fn()
        except DirectoryUnavailable as exc:
            self.unavailable += 1
            if self._breaker.closed:
                log.warning("KV directory unreachable (%s: %s): serving without cache hits", what, exc)
            self._breaker.failure(self._monotonic())
            return fallback
        if not self._breaker.closed:
            log.info("KV directory reachable again")
        self._breaker.success()
        return result

    def _own_open(self, tenant_id: str, branch_id: str) -> None:
        self._own.setdefault(tenant_id, {})[branch_id] = self._clock()

    def _own_close(self, branch_id: str) -> None:
        for tenant, branches in list(self._own.items()):
            if branches.pop(branch_id, None) is not None and not branches:
                del self._own[tenant]

    # -- Directory ------------------------------------------------------------
    def block_hashes(self, token_ids: Sequence[int], salt: str, *, known: Sequence[str] = ()) -> list[str]:
        if self._hasher is kv_block_hashes:  # `known` reused (a lookup right after tokenizing hashes nothing)
            return extend_block_hashes(known, token_ids, self.block_size, salt)
        return self._hasher(token_ids, self.block_size, salt)

    async def lookup(
        self,
        token_ids: Sequence[int],
        salt: str,
        *,
        exclude: Sequence[str] = (),
        record: bool = True,
        known: Sequence[str] = (),
    ) -> PrefixHit:
        hashes = self.block_hashes(token_ids, salt, known=known)
        hit = await self._call(
            "lookup", lambda: self.backend.longest_prefix(hashes, exclude=exclude, record=record), None
        )
        if hit is None:
            return PrefixHit(self.block_size, hashes, [], {})
        return PrefixHit(self.block_size, hashes, hit.holders, hit.per_node_blocks)

    async def publish(self, node_id: str, blocks: Sequence[BlockLocation], block_bytes: int = 0) -> None:
        if block_bytes:
            self._block_bytes[node_id] = block_bytes
        locs = [(b.block_hash, b.slot) for b in blocks]
        size, now = self._block_bytes.get(node_id, 0), self._clock()
        await self._call("publish", lambda: self.backend.publish(node_id, locs, size, now), None)

    async def unpublish(self, node_id: str, hashes: Sequence[str]) -> None:
        await self._call("unpublish", lambda: self.backend.unpublish(node_id, hashes), None)

    async def drop_node(self, node_id: str) -> None:
        await self._call("drop_node", lambda: self.backend.drop_node(node_id), list[str]())

    async def open_branch(
        self,
        branch_id: str,
        *,
        tenant_id: str,
        parent_id: str | None = None,
        session_id: str | None = None,
        kv_retention_blocks: int | None = None,
        max_active_branches: int | None = None,
    ) -> bool:
        if kv_retention_blocks is None:
            self._retention.pop(tenant_id, None)
        else:
            self._retention[tenant_id] = kv_retention_blocks
        now, cap = self._clock(), max_active_branches

        async def open_() -> bool:
            try:
                await self.backend.open_branch(branch_id, tenant_id, now, parent_id, session_id, cap)
            except BranchLimitReached:
                return False
            return True

        own = self._own.get(tenant_id, {})
        if cap is not None and branch_id not in own and len(own) * max(1, self._replicas()) >= cap:
            fallback = False  # the outage policy: limit / replicas on this replica
        else:
            fallback = True
        opened = await self._call("open_branch", open_, fallback)
        if opened:
            self._own_open(tenant_id, branch_id)
        return opened

    async def active_branch_count(self, tenant_id: str) -> int:
        own = len(self._own.get(tenant_id, {}))
        return await self._call(
            "active_branch_count", lambda: self.backend.active_branch_count(tenant_id), own * max(1, self._replicas())
        )

    async def reference(self, branch_id: str, hashes: Sequence[str]) -> None:
        async def pin() -> None:
            try:
                within = await self._within_quota(branch_id, hashes)
                if within:
                    await self.backend.reference(branch_id, within, self._clock())
            except BranchStateError:
                pass  # finished or expired while the request ran: nothing left to pin

        await self._call("reference", pin, None)

    async def _within_quota(self, branch_id: str, hashes: Sequence[str]) -> Sequence[str]:
        """The longest prefix of `hashes` the branch's tenant may pin."""
        if not self._retention or not hashes:
            return hashes
        info = await self.backend.branch(branch_id)
        quota = None if info is None else self._retention.get(info.tenant_id)
        if info is None or quota is None:
            return hashes
        room = quota - await self.backend.branch_blocks(info.tenant_id)
        n = 0
        for count in await self.backend.tenant_ref_counts(info.tenant_id, hashes):
            if count == 0:  # a block new to the tenant costs quota; one it pins already is free
                if room <= 0:
                    break
                room -= 1
            n += 1
        self.unpinned_over_quota += len(hashes) - n
        return hashes[:n]

    async def finish_branch(self, branch_id: str) -> bool:
        own = any(branch_id in b for b in self._own.values())
        self._own_close(branch_id)
        info: BranchInfo | bool | None = await self._call(
            "finish_branch", lambda: self.backend.finish_branch(branch_id), False
        )
        return own if info is False else info is not None

    async def expire(self, now: float | None = None) -> list[str]:
        t = self._clock() if now is None else now
        for branches in self._own.values():
            for b in [b for b, last in branches.items() if t - last >= self._ttl]:
                del branches[b]
        self._own = {k: v for k, v in self._own.items() if v}
        return await self._call("expire", lambda: self.backend.expire(t, self._ttl), [])

    async def is_branch_active(self, branch_id: str) -> bool:
        own = any(branch_id in b for b in self._own.values())
        info: BranchInfo | bool | None = await self._call("branch", lambda: self.backend.branch(branch_id), False)
        return own if info is False else info is not None

    async def flush_stats(self) -> None:
        """The backend's held-back counters sent (at shutdown: no lookup's hits lost)."""
        await self._call("flush_stats", self.backend.flush_stats, None)

    async def references(self, block_hash: str) -> int:
        counts = await self._call("ref_counts", lambda: self.backend.ref_counts([block_hash]), [0])
        return counts[0]

    async def stats(self) -> DirectoryStatus:
        s = await self._call("stats", self.backend.stats, None)
        if s is None:  # the last numbers seen, marked stale
            return replace(self._last_stats, available=False)
        self._last_stats = DirectoryStatus.of(s)
        return self._last_stats

    async def top_branches(self, limit: int = 10) -> list[BranchSummary]:
        infos = await self._call("top_branches", lambda: self.backend.top_branches(limit), list[BranchInfo]())
        return [BranchSummary.of(b) for b in infos]
