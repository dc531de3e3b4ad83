"""In-memory BlockDirectory (the default: one gateway process).

Not thread-safe: call it from one thread / event loop (the gateway's).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

from kvpool.directory.base import (
    BranchEvent,
    BranchInfo,
    BranchLimitReached,
    BranchState,
    DirectoryStats,
    PrefixHit,
    build_prefix_hit,
    next_branch_state,
    order_victims,
)


@dataclass
class _Branch:
    tenant_id: str
    parent_id: str | None
    session_id: str | None
    opened_at: float
    last_active_at: float
    blocks: set[str] = field(default_factory=set)


class MemoryDirectory:
    """BlockDirectory kept in dicts; see kvpool.directory.base for the contract."""

    def __init__(self) -> None:
        self._holders: dict[str, dict[str, int]] = {}  # hash -> node -> slot
        self._node_access: dict[str, dict[str, float]] = {}  # node -> hash -> last access
        self._node_block_bytes: dict[str, int] = {}
        self._refs: dict[str, int] = {}
        self._tenant_refs: dict[str, dict[str, int]] = {}
        self._branches: dict[str, _Branch] = {}
        self._tenant_branches: dict[str, int] = {}  # tenant -> active branches
        self._lookups = 0
        self._looked_up_blocks = 0
        self._hit_blocks = 0

    # -- locations -----------------------------------------------------
    def publish(self, node_id: str, locations: Sequence[tuple[str, int]], block_bytes: int, now: float) -> None:
        self._node_block_bytes[node_id] = block_bytes
        access = self._node_access.setdefault(node_id, {})
        for block_hash, slot in locations:
            self._holders.setdefault(block_hash, {})[node_id] = int(slot)
            access[block_hash] = now

    def unpublish(self, node_id: str, block_hashes: Sequence[str]) -> None:
        access = self._node_access.get(node_id, {})
        for h in block_hashes:
            nodes = self._holders.get(h)
            if nodes is not None and nodes.pop(node_id, None) is not None and not nodes:
                del self._holders[h]
            access.pop(h, None)

    def drop_node(self, node_id: str) -> list[str]:
        held = sorted(self._node_access.get(node_id, {}))
        self.unpublish(node_id, held)
        self._node_access.pop(node_id, None)
        self._node_block_bytes.pop(node_id, None)
        return held

    def longest_prefix(
        self,
        block_hashes: Sequence[str],
        *,
        prefer: str | None = None,
        exclude: Sequence[str] = (),
        record: bool = True,
    ) -> PrefixHit:
        per_block = []
        for h in block_hashes:
            nodes = self._holders.get(h)
            if not nodes:
                break
            per_block.append(nodes)
        hit = build_prefix_hit(per_block, prefer=prefer, exclude=exclude)
        if record:
            self._lookups += 1
            self._looked_up_blocks += len(block_hashes)
            self._hit_blocks += hit.num_blocks
        return hit

    def touch_blocks(self, node_id: str, block_hashes: Sequence[str], now: float) -> None:
        access = self._node_access.get(node_id, {})
        for h in block_hashes:
            if h in access:
                access[h] = now

    # -- branches ------------------------------------------------------
    def _state(self, branch_id: str) -> BranchState | None:
        return BranchState.ACTIVE if branch_id in self._branches else None

    def open_branch(
        self,
        branch_id: str,
        tenant_id: str,
        now: float,
        parent_id: str | None = None,
        session_id: str | None = None,
        max_active: int | None = None,
    ) -> BranchInfo:
        next_branch_state(self._state(branch_id), BranchEvent.OPEN, branch_id)
        br = self._branches.get(branch_id)
        if br is None:
            active = self._tenant_branches.get(tenant_id, 0)
            if max_active is not None and active >= max_active:
                raise BranchLimitReached(tenant_id, active)
            br = self._branches[branch_id] = _Branch(tenant_id, parent_id, session_id, now, now)
            self._tenant_branches[tenant_id] = self._tenant_branches.get(tenant_id, 0) + 1
        br.last_active_at = max(br.last_active_at, now)
        return self._info(branch_id, br, BranchState.ACTIVE)

    def touch(self, branch_id: str, now: float) -> None:
        next_branch_state(self._state(branch_id), BranchEvent.TOUCH, branch_id)
        br = self._branches[branch_id]
        br.last_active_at = max(br.last_active_at, now)

    def reference(self, branch_id: str, block_hashes: Sequence[str], now: float) -> int:
        next_branch_state(self._state(branch_id), BranchEvent.REFERENCE, branch_id)
        br = self._branches[branch_id]
        br.last_active_at = max(br.last_active_at, now)
        tenant = self._tenant_refs.setdefault(br.tenant_id, {})
        added = 0
        for h in block_hashes:
            if h not in br.blocks:
                br.blocks.add(h)
                self._refs[h] = self._refs.get(h, 0) + 1
                tenant[h] = tenant.get(h, 0) + 1
                added += 1
        return added

    def _release(self, branch_id: str, event: BranchEvent) -> BranchInfo | None:
        if branch_id not in self._branches:
            return None
        state = next_branch_state(BranchState.ACTIVE, event, branch_id)
        br = self._branches.pop(branch_id)
        _decrement(self._tenant_branches, br.tenant_id)
        tenant = self._tenant_refs.get(br.tenant_id, {})
        for h in br.blocks:
            _decrement(self._refs, h)
            _decrement(tenant, h)
        if not tenant:
            self._tenant_refs.pop(br.tenant_id, None)
        return self._info(branch_id, br, state)

    def finish_branch(self, branch_id: str) -> BranchInfo | None:
        return self._release(branch_id, BranchEvent.FINISH)

    def expire(self, now: float, idle_ttl_s: float) -> list[str]:
        stale = sorted(
            # Same comparison as the Redis backend (last <= now - ttl), so the
            # two agree at the boundary.
            b
            for b, br in self._branches.items()
            if br.last_active_at <= now - idle_ttl_s
        )
        for b in stale:
            self._release(b, BranchEvent.EXPIRE)
        return stale

    def branch(self, branch_id: str) -> BranchInfo | None:
        br = self._branches.get(branch_id)
        return None if br is None else self._info(branch_id, br, BranchState.ACTIVE)

    def ref_counts(self, block_hashes: Sequence[str]) -> list[int]:
        return [self._refs.get(h, 0) for h in block_hashes]

    def branch_blocks(self, tenant_id: str) -> int:
        return len(self._tenant_refs.get(tenant_id, {}))

    def tenant_ref_counts(self, tenant_id: str, block_hashes: Sequence[str]) -> list[int]:
        refs = self._tenant_refs.get(tenant_id, {})
        return [refs.get(h, 0) for h in block_hashes]

    def active_branch_count(self, tenant_id: str) -> int:
        return self._tenant_branches.get(tenant_id, 0)

    def top_branches(self, n: int) -> list[BranchInfo]:
        ranked = sorted(self._branches.items(), key=lambda kv: (-len(kv[1].blocks), kv[0]))
        return [self._info(b, br, BranchState.ACTIVE) for b, br in ranked[: max(n, 0)]]

    # -- eviction and stats ---------------------------------------------
    def choose_victims(self, node_id: str, n: int) -> list[str]:
        access = self._node_access.get(node_id, {})
        entries = [(h, at, self._refs.get(h, 0)) for h, at in access.items()]
        return order_victims(entries)[: max(n, 0)]

    def eviction_order(self, node_id: str, candidates: Sequence[str]) -> list[str]:
        access = self._node_access.get(node_id, {})
        entries = [(h, access.get(h), self._refs.get(h, 0)) for h in dict.fromkeys(candidates)]
        return order_victims(entries)

    def stats(self) -> DirectoryStats:
        return DirectoryStats(
            blocks=len(self._holders),
            bytes=sum(len(a) * self._node_block_bytes.get(n, 0) for n, a in self._node_access.items()),
            referenced_blocks=len(self._refs),
            active_branches=len(self._branches),
            lookups=self._lookups,
            looked_up_blocks=self._looked_up_blocks,
            hit_blocks=self._hit_blocks,
        )

    @staticmethod
    def _info(branch_id: str, br: _Branch, state: BranchState) -> BranchInfo:
        return BranchInfo(
            branch_id,
            br.tenant_id,
            br.parent_id,
            br.session_id,
            state,
            br.opened_at,
            br.last_active_at,
            len(br.blocks),
        )


def _decrement(counts: dict[str, int], key: str) -> None:
    left = counts.get(key, 0) - 1
    if left > 0:
        counts[key] = left
    else:
        counts.pop(key, None)
