"""The cluster KV directory contract: where blocks live, which branches pin them.

Two backends implement `BlockDirectory` (memory: one gateway; redis: several
gateway replicas) and share one contract test suite. Everything here is pure.

Model:
- A *location* is (node_id, slot): block `slot` of that node's host store. A
  node holds a block hash in at most one slot (publishing again moves it).
- A block's *refcount* is the number of ACTIVE branches that reference it; a
  branch referencing a block twice counts once. Refcounts are kept per hash,
  whether or not any node holds the block yet (the gateway references a
  prompt's blocks before the prefill saves them).
- Times (`now`) are seconds on any monotonic clock the caller chooses; the
  directory never reads a clock. All replicas must use the same clock base.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from enum import Enum
from typing import Protocol


class DirectoryError(Exception):
    """Root of the directory's errors."""


class BranchStateError(DirectoryError):
    """An event that the branch's current state does not allow."""


class BranchLimitReached(DirectoryError):
    """`open_branch(..., max_active=n)` of a new branch when its tenant already has n."""

    def __init__(self, tenant_id: str, active: int) -> None:
        super().__init__(f"tenant {tenant_id!r} has {active} active branches")
        self.tenant_id, self.active = tenant_id, active


class DirectoryUnavailable(DirectoryError):
    """The backend could not be reached (Redis down, slow past its timeout).
    Callers treat it as "no cache hit", never as a failed request."""


class BranchState(str, Enum):
    ACTIVE = "active"
    FINISHED = "finished"  # terminal: refs released
    EXPIRED = "expired"  # terminal: idle past the TTL, refs released


class BranchEvent(str, Enum):
    OPEN = "open"
    TOUCH = "touch"
    REFERENCE = "reference"
    FINISH = "finish"
    EXPIRE = "expire"


# The one transition table. `None` = unknown branch. Terminal states are not
# stored (the record is deleted and its refs released), so re-opening a
# finished branch id starts a fresh branch.
BRANCH_TRANSITIONS: Mapping[tuple[BranchState | None, BranchEvent], BranchState] = {
    (None, BranchEvent.OPEN): BranchState.ACTIVE,
    (BranchState.ACTIVE, BranchEvent.OPEN): BranchState.ACTIVE,
    (BranchState.ACTIVE, BranchEvent.TOUCH): BranchState.ACTIVE,
    (BranchState.ACTIVE, BranchEvent.REFERENCE): BranchState.ACTIVE,
    (BranchState.ACTIVE, BranchEvent.FINISH): BranchState.FINISHED,
    (BranchState.ACTIVE, BranchEvent.EXPIRE): BranchState.EXPIRED,
}


def next_branch_state(state: BranchState | None, event: BranchEvent, branch_id: str) -> BranchState:
    """Apply the transition table or raise BranchStateError."""
    try:
        return BRANCH_TRANSITIONS[(state, event)]
    except KeyError:
        shown = state.value if state else "unknown"
        raise BranchStateError(f"branch {branch_id!r}: cannot {event.value} when {shown}") from None


@dataclass(frozen=True)
class Location:
    node_id: str
    slot: int


@dataclass(frozen=True)
class PrefixHit:
    """Answer of `longest_prefix` for hashes h_0..h_{k-1}.

    - `num_blocks`: largest n such that every block 0..n-1 is held by at least
      one node (possibly different nodes).
    - `locations[i]` (i < num_blocks): one place holding block i: `prefer`'s
      own copy if it has one, else the holder with the longest contiguous
      prefix (fewest peers to read from), ties to the smallest node_id.
    - `holders[i]`: every node_id -> slot holding block i.
    - `per_node_blocks[node]`: blocks that node holds contiguously from block
      0 (nodes holding block 0 only; absent means 0).
    """

    num_blocks: int
    per_node_blocks: dict[str, int]
    locations: list[Location]
    holders: list[dict[str, int]]


@dataclass(frozen=True)
class BranchInfo:
    branch_id: str
    tenant_id: str
    parent_id: str | None
    session_id: str | None
    state: BranchState
    opened_at: float
    last_active_at: float
    num_blocks: int  # distinct blocks it references


@dataclass(frozen=True)
class DirectoryStats:
    blocks: int  # distinct block hashes held by at least one node
    bytes: int  # sum over nodes of blocks held x that node's block_bytes
    referenced_blocks: int  # hashes with refcount > 0
    active_branches: int
    lookups: int
    looked_up_blocks: int
    hit_blocks: int

    @property
    def hit_rate(self) -> float:
        """Hit tokens / looked-up tokens over full blocks (= hit / looked-up blocks)."""
        return self.hit_blocks / self.looked_up_blocks if self.looked_up_blocks else 0.0


class BlockDirectory(Protocol):
    """Cluster-wide block index plus branch reference counts.

    Callers: the gateway (longest_prefix at routing; branch lifecycle per
    request; expire on a timer; publish/unpublish with the events workers
    report) and optionally workers (ref_counts for their eviction policy).
    Every method is atomic with respect to other callers, including other
    gateway replicas on the Redis backend. None blocks on anything but the
    backend itself; the memory backend is not thread-safe (one event loop).
    """

    # -- locations -----------------------------------------------------
    def publish(self, node_id: str, locations: Sequence[tuple[str, int]], block_bytes: int, now: float) -> None:
        """Node now holds each (block_hash, slot); access time := now."""

    def unpublish(self, node_id: str, block_hashes: Sequence[str]) -> None:
        """Node no longer holds these hashes; unknown ones are ignored."""

    def drop_node(self, node_id: str) -> list[str]:
        """Forget everything the node holds (it died or restarted); return them."""

    def longest_prefix(
        self,
        block_hashes: Sequence[str],
        *,
        prefer: str | None = None,
        exclude: Sequence[str] = (),
        record: bool = True,
    ) -> PrefixHit:
        """See PrefixHit. Nodes in `exclude` are treated as holding nothing.
        `record=False` leaves hit-rate counters alone (routing probes)."""

    def touch_blocks(self, node_id: str, block_hashes: Sequence[str], now: float) -> None:
        """Record an access to blocks the node holds (others are ignored)."""

    # -- branches ------------------------------------------------------
    def open_branch(
        self,
        branch_id: str,
        tenant_id: str,
        now: float,
        parent_id: str | None = None,
        session_id: str | None = None,
        max_active: int | None = None,
    ) -> BranchInfo:
        """Open (or, when active, touch) a branch. Idempotent per request.
        With `max_active`, a *new* branch of a tenant that already has that
        many active ones raises `BranchLimitReached` instead (atomically: two
        replicas racing for the last slot cannot both get it)."""

    def touch(self, branch_id: str, now: float) -> None:
        """Mark an active branch as used; BranchStateError when not active."""

    def reference(self, branch_id: str, block_hashes: Sequence[str], now: float) -> int:
        """The active branch references these blocks (+1 each, once per branch).
        Returns how many were new to the branch. BranchStateError if not active."""

    def finish_branch(self, branch_id: str) -> BranchInfo | None:
        """Release the branch's refs; None when it was not active (idempotent)."""

    def expire(self, now: float, idle_ttl_s: float) -> list[str]:
        """Expire active branches idle for >= idle_ttl_s; return their ids."""

    def branch(self, branch_id: str) -> BranchInfo | None:
        """The active branch, or None."""

    def ref_counts(self, block_hashes: Sequence[str]) -> list[int]:
        """Refcount of each hash (0 when unreferenced or unknown)."""

    def branch_blocks(self, tenant_id: str) -> int:
        """Distinct blocks pinned by the tenant's active branches (quota)."""

    def tenant_ref_counts(self, tenant_id: str, block_hashes: Sequence[str]) -> list[int]:
        """Per hash, how many of the tenant's active branches reference it (0: none)."""

    def active_branch_count(self, tenant_id: str) -> int:
        """The tenant's active branches (the max-active-branches policy)."""

    def top_branches(self, n: int) -> list[BranchInfo]:
        """The n active branches referencing the most blocks, largest first."""

    # -- eviction and stats ---------------------------------------------
    def choose_victims(self, node_id: str, n: int) -> list[str]:
        """Up to n hashes the node should drop: unreferenced LRU first, then
        referenced LRU. Side-effect free (the node unpublishes what it drops)."""

    def eviction_order(self, node_id: str, candidates: Sequence[str]) -> list[str]:
        """`candidates` sorted best-victim first by the same rule; candidates
        the node does not hold count as least recently used."""

    def stats(self) -> DirectoryStats: ...


class AsyncBlockDirectory(Protocol):
    """`BlockDirectory` with every method a coroutine: what the gateway's
    event loop calls, so a slow backend delays only the callers waiting on it.

    Same contract, same results as the synchronous protocol above; a backend
    that cannot be reached raises `DirectoryUnavailable`.
    """

    async def publish(self, node_id: str, locations: Sequence[tuple[str, int]], block_bytes: int, now: float) -> None:
        """See `BlockDirectory.publish`."""

    async def unpublish(self, node_id: str, block_hashes: Sequence[str]) -> None: ...

    async def drop_node(self, node_id: str) -> list[str]: ...

    async def longest_prefix(
        self,
        block_hashes: Sequence[str],
        *,
        prefer: str | None = None,
        exclude: Sequence[str] = (),
        record: bool = True,
    ) -> PrefixHit: ...

    async def touch_blocks(self, node_id: str, block_hashes: Sequence[str], now: float) -> None: ...

    async def open_branch(
        self,
        branch_id: str,
        tenant_id: str,
        now: float,
        parent_id: str | None = None,
        session_id: str | None = None,
        max_active: int | None = None,
    ) -> BranchInfo: ...

    async def touch(self, branch_id: str, now: float) -> None: ...

    async def reference(self, branch_id: str, block_hashes: Sequence[str], now: float) -> int: ...

    async def finish_branch(self, branch_id: str) -> BranchInfo | None: ...

    async def expire(self, now: float, idle_ttl_s: float) -> list[str]: ...

    async def branch(self, branch_id: str) -> BranchInfo | None: ...

    async def ref_counts(self, block_hashes: Sequence[str]) -> list[int]: ...

    async def branch_blocks(self, tenant_id: str) -> int: ...

    async def tenant_ref_counts(self, tenant_id: str, block_hashes: Sequence[str]) -> list[int]: ...

    async def active_branch_count(self, tenant_id: str) -> int: ...

    async def top_branches(self, n: int) -> list[BranchInfo]: ...

    async def choose_victims(self, node_id: str, n: int) -> list[str]: ...

    async def eviction_order(self, node_id: str, candidates: Sequence[str]) -> list[str]: ...

    async def stats(self) -> DirectoryStats: ...

    async def flush_stats(self) -> None:
        """Send the counters the backend still holds back (the Redis one: the
        hits of its last lookups, which go out with the next one); `stats`
        includes them. A replica calls it when it stops."""


# -- pure helpers shared by the backends ----------------------------------


def build_prefix_hit(
    holders_per_block: Sequence[Mapping[str, int]],
    *,
    prefer: str | None = None,
    exclude: Sequence[str] = (),
) -> PrefixHit:
    """Compute a PrefixHit from each block's node -> slot map, in prompt order."""
    excluded = set(exclude)
    holders: list[dict[str, int]] = []
    for raw in holders_per_block:
        nodes = {n: s for n, s in raw.items() if n not in excluded}
        if not nodes:
            break
        holders.append(nodes)
    per_node: dict[str, int] = {}
    running = set(holders[0]) if holders else set()
    for i, nodes in enumerate(holders):
        running &= nodes.keys()
        if not running:
            break
        for n in running:
            per_node[n] = i + 1
    locations = []
    for nodes in holders:
        node = prefer if prefer is not None and prefer in nodes else min(nodes, key=lambda n: (-per_node.get(n, 0), n))
        locations.append(Location(node, nodes[node]))
    return PrefixHit(len(holders), per_node, locations, holders)


def order_victims(entries: Sequence[tuple[str, float | None, int]]) -> list[str]:
    """(hash, last_access or None = never, refcount) -> best victim first.

    Unreferenced before referenced; within each, least recently used first
    (never-accessed first); ties by hash for determinism.
    """

    def key(e: tuple[str, float | None, int]) -> tuple[bool, float, str]:
        h, at, refs = e
        return (refs > 0, float("-inf") if at is None else at, h)

    return [e[0] for e in sorted(entries, key=key)]
