"""Prefix-cache view for the simulator: which node holds which KV blocks.

`PrefixIndex` is the port; `LocalPrefixIndex` is the simulator's in-memory
implementation (the shape of kvpool's directory: per-block holders, branch
reference counts, LRU eviction of unreferenced blocks per node host store).
Block ids are the workload's opaque `block_hashes`.
"""

from __future__ import annotations

import heapq
from collections import OrderedDict
from typing import Protocol


class PrefixHits(Protocol):
    """Each node's longest cached prefix for one prompt, in blocks (0 if none)."""

    def get(self, node_id: str) -> int: ...

    def top(self, k: int) -> list[str]:
        """Up to ``k`` nodes with the longest prefix (ties by node id)."""


class DictHits:
    """`PrefixHits` over a plain ``{node: blocks}`` map."""

    __slots__ = ("blocks",)

    def __init__(self, blocks: dict[str, int]) -> None:
        self.blocks = blocks

    def get(self, node_id: str) -> int:
        return self.blocks.get(node_id, 0)

    def top(self, k: int) -> list[str]:
        return sorted(self.blocks, key=lambda n: (-self.blocks[n], n))[:k]


class LayeredHits:
    """`PrefixHits` of a prefix walk, without a per-node map: ``layers`` is
    ``[(blocks, nodes), ...]`` deepest first, each set a subset of the next
    one (the nodes holding the first ``blocks`` blocks), so a node's prefix
    is the ``blocks`` of the first set that holds it. A prompt whose system
    prefix every node holds stays O(layers) to build and to query, where a
    per-node map would cost O(nodes) Python work per request. The sets may be
    the index's own: valid until the index next changes."""

    __slots__ = ("layers",)
    TOP_LAYER_MAX = 64  # top() stops at a layer this common: a random sample already holds some

    def __init__(self, layers: list[tuple[int, set[str]]]) -> None:
        self.layers = layers

    def get(self, node_id: str) -> int:
        for blocks, nodes in self.layers:
            if node_id in nodes:
                return blocks
        return 0

    def top(self, k: int) -> list[str]:
        """Up to ``k`` nodes with the longest prefix (ties by node id), from
        layers of at most `TOP_LAYER_MAX` nodes."""
        out: list[str] = []
        for _, nodes in self.layers:
            if len(out) >= k or len(nodes) > self.TOP_LAYER_MAX:
                break
            out += heapq.nsmallest(k - len(out), nodes.difference(out))
        return out


class PrefixIndex(Protocol):
    def lookup(self, hashes: tuple[int, ...]) -> tuple[int, PrefixHits]:
        """(blocks of the longest prefix held anywhere, each node's longest prefix)."""

    def publish(self, node_id: str, hashes: tuple[int, ...]) -> None:
        """`node_id`'s host store now holds these blocks (evicting LRU unreferenced ones)."""

    def retain(self, branch_id: str, hashes: tuple[int, ...]) -> None:
        """The active branch references these blocks (kept from eviction)."""

    def release(self, branch_id: str) -> None:
        """The branch finished: its references drop."""


class LocalPrefixIndex:
    def __init__(self, blocks_per_node: int) -> None:
        if blocks_per_node <= 0:
            raise ValueError("blocks_per_node must be > 0")
        self.blocks_per_node = blocks_per_node
        self.holders: dict[int, set[str]] = {}
        self.stores: dict[str, OrderedDict[int, None]] = {}
        self.refs: dict[int, int] = {}
        self.branches: dict[str, set[int]] = {}
        self.lookups = 0
        self.hit_blocks = 0
        self.evicted = 0
        # Subset checks between two popular blocks' holder sets (a system
        # prompt held by every node) are cached until either set changes.
        self._stamp: dict[int, int] = {}  # block -> clock of its holders' last change
        self._clock = 0
        self._subset: dict[tuple[int, int], tuple[int, int, bool]] = {}

    def lookup(self, hashes: tuple[int, ...]) -> tuple[int, PrefixHits]:
        self.lookups += 1
        pool = 0
        live: set[str] = set()  # nodes holding every block so far
        first: int | None = None  # the block whose holder set `live` is, until an intersection makes a new set
        layers: list[tuple[int, set[str]]] = []  # (prefix blocks, nodes holding that many), shallow first
        holders = self.holders
        for h in hashes:
            hs = holders.get(h)
            if not hs:
                break
            if pool == 0:
                live, first = hs, h  # not copied: only read (the hits are valid until the index changes)
            elif not (live <= hs if first is None or len(live) < 32 else self._within(live, first, hs, h)):
                layers.append((pool, live))
                live, first = live & hs, None
            pool += 1
        if live:
            layers.append((pool, live))
        layers.reverse()
        self.hit_blocks += pool
        return pool, LayeredHits(layers)

    def _within(self, live: set[str], first: int, hs: set[str], h: int) -> bool:
        """live <= hs for the big holder sets of blocks (first, h), cached."""
        if len(live) > len(hs):
            return False
        stamps = (self._stamp.get(first, 0), self._stamp.get(h, 0))
        got = self._subset.get((first, h))
        if got is not None and got[:2] == stamps:
            return got[2]
        ok = live <= hs
        if len(self._subset) > 100_000:  # entries of evicted blocks are never read again
            self._subset.clear()
        self._subset[(first, h)] = (*stamps, ok)
        return ok

    def _changed(self, h: int) -> None:
        self._clock += 1
        self._stamp[h] = self._clock

    def publish(self, node_id: str, hashes: tuple[int, ...]) -> None:
        store = self.stores.setdefault(node_id, OrderedDict())
        for h in hashes:
            if h in store:
                store.move_to_end(h)
                continue
            store[h] = None
            self.holders.setdefault(h, set()).add(node_id)
            self._changed(h)
        self._evict(node_id, store)

    def _evict(self, node_id: str, store: OrderedDict[int, None]) -> None:
        over = len(store) - self.blocks_per_node
        if over <= 0:
            return
        over += self.blocks_per_node // 10  # hysteresis: one scan per ~10 % of capacity
        # Unreferenced LRU first (scanning a bounded LRU window), then
        # referenced LRU: a store smaller than the active working set must
        # still make room, as kvpool's choose_victims does.
        victims: list[int] = []
        referenced: list[int] = []
        for i, h in enumerate(store):
            if i >= 4 * over:
                break
            if self.refs.get(h, 0) == 0:
                victims.append(h)
                if len(victims) >= over:
                    break
            elif len(referenced) < over:
                referenced.append(h)
        victims += referenced[: over - len(victims)]
        for h in victims:
            del store[h]
            hs = self.holders[h]
            hs.discard(node_id)
            self._changed(h)
            if not hs:
                del self.holders[h]
                self._stamp.pop(h, None)
        self.evicted += len(victims)

    def retain(self, branch_id: str, hashes: tuple[int, ...]) -> None:
        held = self.branches.setdefault(branch_id, set())
        new = set(hashes).difference(held)
        held |= new
        for h in new:
            self.refs[h] = self.refs.get(h, 0) + 1

    def release(self, branch_id: str) -> None:
        for h in self.branches.pop(branch_id, ()):
            n = self.refs.get(h, 0) - 1
            if n <= 0:
                self.refs.pop(h, None)
            else:
                self.refs[h] = n


class DirectoryPrefixIndex:
    """`PrefixIndex` over the real `kvpool.directory` `BlockDirectory`.

    Slots are allocated per node; when a node's host store is over
    `blocks_per_node`, the directory's own `choose_victims` picks what to drop
    (unreferenced LRU first), and this adapter unpublishes them, as a worker
    would. Times come from `clock()` (the simulator's now).
    """

    def __init__(self, directory, blocks_per_node: int, block_bytes: int, clock) -> None:  # noqa: ANN001
        self.dir, self.cap, self.block_bytes, self.clock = directory, blocks_per_node, block_bytes, clock
        self.held: dict[str, set[str]] = {}
        self.free_slots: dict[str, list[int]] = {}
        self.next_slot: dict[str, int] = {}
        self.slot_of: dict[tuple[str, str], int] = {}
        self.open: set[str] = set()

    def lookup(self, hashes: tuple[int, ...]) -> tuple[int, PrefixHits]:
        hit = self.dir.longest_prefix([str(h) for h in hashes])
        return hit.num_blocks, DictHits(dict(hit.per_node_blocks))

    def _slot(self, node_id: str) -> int:
        free = self.free_slots.setdefault(node_id, [])
        if free:
            return free.pop()
        s = self.next_slot.get(node_id, 0)
        self.next_slot[node_id] = s + 1
        return s

    def publish(self, node_id: str, hashes: tuple[int, ...]) -> None:
        held = self.held.setdefault(node_id, set())
        now = self.clock()
        keys = [str(h) for h in hashes]
        new = [k for k in keys if k not in held]
        if new:
            locs = []
            for k in new:
                s = self._slot(node_id)
                self.slot_of[(node_id, k)] = s
                locs.append((k, s))
                held.add(k)
            self.dir.publish(node_id, locs, self.block_bytes, now)
        self.dir.touch_blocks(node_id, keys, now)
        over = len(held) - self.cap
        if over > 0:
            # Evict down to 90 % in one go: choose_victims ranks the node's whole
            # store (O(n log n)), so calling it per publish dominates run time.
            victims = self.dir.choose_victims(node_id, over + self.cap // 10)
            self.dir.unpublish(node_id, victims)
            for v in victims:
                held.discard(v)
                self.free_slots.setdefault(node_id, []).append(self.slot_of.pop((node_id, v)))

    def retain(self, branch_id: str, hashes: tuple[int, ...]) -> None:
        now = self.clock()
        if branch_id not in self.open:
            self.dir.open_branch(branch_id, "sim", now)
            self.open.add(branch_id)
        self.dir.reference(branch_id, [str(h) for h in hashes], now)

    def release(self, branch_id: str) -> None:
        if branch_id in self.open:
            self.open.discard(branch_id)
            self.dir.finish_branch(branch_id)


def make_prefix_index(blocks_per_node: int, block_bytes: int, clock, kind: str = "memory") -> PrefixIndex:  # noqa: ANN001
    """`memory`: the real kvpool in-memory directory (when importable);
    `local`: the simulator's faster index with the same semantics."""
    if kind == "local":
        return LocalPrefixIndex(blocks_per_node)
    try:
        from kvpool.directory.memory import MemoryDirectory  # type: ignore[import-not-found]
    except ImportError:
        return LocalPrefixIndex(blocks_per_node)
    return DirectoryPrefixIndex(MemoryDirectory(), blocks_per_node, block_bytes, clock)
