"""The gateway's view of the cluster KV directory (`kvpool.directory`).

`Directory` is the port the router, orchestrator and registry use;
`GatewayDirectory` adapts any `kvpool.directory.BlockDirectory`
(memory backend for one gateway, Redis for replicas; the memory backend is
also the in-memory fake in tests). The adapter adds what the gateway needs
on top: prompt hashing (`kvpool.hashing`, identical to the workers'), the
clock, the branch TTL, and block locations re-picked for the node that will
load them.

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
All methods are synchronous and O(blocks in the call) (Redis: one round trip).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Protocol

from kvpool.directory import BlockDirectory, BranchStateError
from kvpool.hashing import block_hashes as kv_block_hashes
from kvpool.hashing import extend_block_hashes
from workers.protocol import BlockLocation

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

    def lookup(
        self,
        token_ids: Sequence[int],
        salt: str,
        *,
        exclude: Sequence[str] = (),
        record: bool = True,
        known: Sequence[str] = (),
    ) -> PrefixHit: ...
    def publish(self, node_id: str, blocks: Sequence[BlockLocation], block_bytes: int = 0) -> None: ...
    def unpublish(self, node_id: str, hashes: Sequence[str]) -> None: ...
    def drop_node(self, node_id: str) -> None: ...
    def open_branch(
        self,
        branch_id: str,
        *,
        tenant_id: str,
        parent_id: str | None = None,
        session_id: str | None = None,
        kv_retention_blocks: int | None = None,
    ) -> None: ...
    def is_branch_active(self, branch_id: str) -> bool: ...
    def active_branch_count(self, tenant_id: str) -> int: ...
    def reference(self, branch_id: str, hashes: Sequence[str]) -> None: ...
    def finish_branch(self, branch_id: str) -> bool: ...
    def expire(self, now: float | None = None) -> list[str]: ...
    def stats(self) -> dict[str, float]: ...
    def top_branches(self, limit: int = 10) -> list[dict[str, object]]: ...


class GatewayDirectory:
    """`Directory` over a `BlockDirectory`."""

    def __init__(
        self,
        directory: BlockDirectory,
        *,
        block_size: int = 16,
        branch_ttl_s: float = 1800.0,
        hasher: BlockHasher = kv_block_hashes,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.backend = directory
        self.block_size = block_size
        self._ttl = branch_ttl_s
        self._hasher = hasher
        self._clock = clock  # wall clock: replicas sharing a Redis directory share its base
        self._block_bytes: dict[str, int] = {}
        self._retention: dict[str, int] = {}  # tenant -> kv_retention_blocks (latest policy seen)
        self.unpinned_over_quota = 0  # blocks left unreferenced by the retention quota

    def block_hashes(self, token_ids: Sequence[int], salt: str, *, known: Sequence[str] = ()) -> list[str]:
        if known and self._hasher is kv_block_hashes:
            return extend_block_hashes(known, token_ids, self.block_size, salt)
        return self._hasher(token_ids, self.block_size, salt)

    def lookup(
        self,
        token_ids: Sequence[int],
        salt: str,
        *,
        exclude: Sequence[str] = (),
        record: bool = True,
        known: Sequence[str] = (),
    ) -> PrefixHit:
        hashes = self.block_hashes(token_ids, salt, known=known)
        hit = self.backend.longest_prefix(hashes, exclude=exclude, record=record)
        return PrefixHit(self.block_size, hashes, hit.holders, hit.per_node_blocks)

    def publish(self, node_id: str, blocks: Sequence[BlockLocation], block_bytes: int = 0) -> None:
        if block_bytes:
            self._block_bytes[node_id] = block_bytes
        self.backend.publish(
            node_id, [(b.block_hash, b.slot) for b in blocks], self._block_bytes.get(node_id, 0), self._clock()
        )

    def unpublish(self, node_id: str, hashes: Sequence[str]) -> None:
        self.backend.unpublish(node_id, hashes)

    def drop_node(self, node_id: str) -> None:
        self.backend.drop_node(node_id)

    def open_branch(
        self,
        branch_id: str,
        *,
        tenant_id: str,
        parent_id: str | None = None,
        session_id: str | None = None,
        kv_retention_blocks: int | None = None,
    ) -> None:
        if kv_retention_blocks is None:
            self._retention.pop(tenant_id, None)
        else:
            self._retention[tenant_id] = kv_retention_blocks
        self.backend.open_branch(branch_id, tenant_id, self._clock(), parent_id, session_id)

    def active_branch_count(self, tenant_id: str) -> int:
        return self.backend.active_branch_count(tenant_id)

    def reference(self, branch_id: str, hashes: Sequence[str]) -> None:
        try:
            hashes = self._within_quota(branch_id, hashes)
            if hashes:
                self.backend.reference(branch_id, hashes, self._clock())
        except BranchStateError:
            pass  # finished or expired while the request ran: nothing left to pin

    def _within_quota(self, branch_id: str, hashes: Sequence[str]) -> Sequence[str]:
        """The longest prefix of `hashes` the branch's tenant may pin."""
        if not self._retention or not hashes:
            return hashes
        info = self.backend.branch(branch_id)
        quota = None if info is None else self._retention.get(info.tenant_id)
        if info is None or quota is None:
            return hashes
        room = quota - self.backend.branch_blocks(info.tenant_id)
        n = 0
        for count in self.backend.tenant_ref_counts(info.tenant_id, hashes):
            if count == 0:  # a block new to the tenant costs quota; one it pins already is free
                if room <= 0:
                    break
                room -= 1
            n += 1
        self.unpinned_over_quota += len(hashes) - n
        return hashes[:n]

    def finish_branch(self, branch_id: str) -> bool:
        return self.backend.finish_branch(branch_id) is not None

    def expire(self, now: float | None = None) -> list[str]:
        return self.backend.expire(self._clock() if now is None else now, self._ttl)

    def is_branch_active(self, branch_id: str) -> bool:
        return self.backend.branch(branch_id) is not None

    def references(self, block_hash: str) -> int:
        return self.backend.ref_counts([block_hash])[0]

    def stats(self) -> dict[str, float]:
        s = self.backend.stats()
        return {
            "blocks": float(s.blocks),
            "bytes": float(s.bytes),
            "referenced": float(s.referenced_blocks),
            "branches": float(s.active_branches),
            "hit_rate": s.hit_rate,
        }

    def top_branches(self, limit: int = 10) -> list[dict[str, object]]:
        return [
            {"branch_id": b.branch_id, "tenant_id": b.tenant_id, "blocks": b.num_blocks}
            for b in self.backend.top_branches(limit)
        ]
