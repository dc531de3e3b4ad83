"""Prefix-cache view for the simulator: which node holds which KV blocks.

`Directory` is the port; `LocalDirectory` is the simulator's in-memory
implementation (the shape of kvpool's directory: per-block holders, branch
reference counts, LRU eviction of unreferenced blocks per node host store).
Block ids are the workload's opaque `block_hashes`.
"""

from __future__ import annotations

import heapq
from collections.abc import Callable, Collection
from itertools import compress, filterfalse, islice
from operator import is_not
from typing import TYPE_CHECKING, Protocol, cast

from sim.lru import ChainLRU

if TYPE_CHECKING:
    from kvpool.directory.memory import MemoryDirectory


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
    the index's own (frozen: they stay valid as the index changes)."""

    __slots__ = ("layers",)
    TOP_LAYER_MAX = 64  # top() stops at a layer this common: a random sample already holds some

    def __init__(self, layers: list[tuple[int, frozenset[str]]]) -> None:
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


class Directory(Protocol):
    def lookup(self, hashes: tuple[int, ...]) -> tuple[int, PrefixHits]:
        """(blocks of the longest prefix held anywhere, each node's longest prefix)."""

    def publish(self, node_id: str, hashes: tuple[int, ...]) -> None:
        """`node_id`'s host store now holds these blocks (evicting LRU unreferenced ones)."""

    def retain(self, branch_id: str, hashes: tuple[int, ...]) -> None:
        """The active branch references these blocks (kept from eviction)."""

    def release(self, branch_id: str) -> None:
        """The branch finished: its references drop."""

    def extend_prefix(self, node_id: str, hashes: tuple[int, ...], start: int) -> int:
        """End of the run of blocks from position `start` that `node_id`
        holds (`start` when it does not hold block `start`); the blocks
        before `start` are taken as held."""


class LocalDirectory:
    """The simulator's own index, built so that a turn costs C-level work per
    block of its prompt and Python work only per block it adds or evicts
    (agents' contexts grow to hundreds of blocks, a turn adds a few).

    - ``holders[h]``: frozenset of the nodes holding block h. Sets are
      shared and never mutated; adding (removing) node n to (from) set S
      gives the same object every time (transition caches), so blocks that
      were published together share one object and a prefix walk compares
      sets only where that object changes.
    - ``stores[n]``: node n's host store, a `ChainLRU` (a publish costs
      work per run of the prompt, not per block).

    Block ids must name their prefix, as chained hashes do (`sim.lru`).
    """

    _CACHE_MAX = 200_000  # transition-cache entries (they pin old sets) kept before a clear

    def __init__(self, blocks_per_node: int) -> None:
        if blocks_per_node <= 0:
            raise ValueError("blocks_per_node must be > 0")
        self.blocks_per_node = blocks_per_node
        self.holders: dict[int, frozenset[str]] = {}
        self.stores: dict[str, ChainLRU] = {}
        self.refs: dict[int, int] = {}
        self.branches: dict[str, set[int]] = {}
        self._retained: dict[str, tuple[int, ...]] = {}  # each branch's last retained prompt
        self.lookups = 0
        self.hit_blocks = 0
        self.evicted = 0
        self._plus: dict[tuple[frozenset[str] | None, str], frozenset[str]] = {}
        self._minus: dict[tuple[frozenset[str], str], frozenset[str]] = {}

    def lookup(self, hashes: tuple[int, ...]) -> tuple[int, PrefixHits]:
        self.lookups += 1
        found = list(map(self.holders.get, hashes))
        try:
            pool = found.index(None)
        except ValueError:
            pool = len(found)
        sets = cast("list[frozenset[str]]", found)  # only its first `pool` entries are read: no None there
        layers: list[tuple[int, frozenset[str]]] = []  # (prefix blocks, nodes holding that many), shallow first
        if pool:
            live = sets[0]  # nodes holding every block so far
            # `live` can only shrink where the holder object changes.
            for i in compress(range(1, pool), map(is_not, islice(sets, 1, pool), sets)):
                s = sets[i]
                if not live <= s:
                    layers.append((i, live))
                    live = live & s
            if live:
                layers.append((pool, live))
            layers.reverse()
        self.hit_blocks += pool
        return pool, LayeredHits(layers)

    def publish(self, node_id: str, hashes: tuple[int, ...]) -> None:
        store = self.stores.get(node_id)
        if store is None:
            store = self.stores[node_id] = ChainLRU()
        new = store.touch(hashes)
        if new:
            holders = self.holders
            plus = self._plus
            for h in new:
                old = holders.get(h)
                s = plus.get((old, node_id))
                if s is None:
                    s = plus[(old, node_id)] = (old or frozenset()) | {node_id}
                holders[h] = s
            if len(plus) > self._CACHE_MAX:
                plus.clear()
        self._evict(node_id, store)

    def _evict(self, node_id: str, store: ChainLRU) -> None:
        over = len(store) - self.blocks_per_node
        if over <= 0:
            return
        over += self.blocks_per_node // 10  # hysteresis: one scan per ~10 % of capacity
        # Unreferenced LRU first (scanning a bounded LRU window), then
        # referenced LRU: a store smaller than the active working set must
        # still make room, as kvpool's choose_victims does.
        window = store.oldest(4 * over)
        refs = self.refs
        victims = list(filterfalse(refs.__contains__, window))  # C-level scans: the store holds thousands
        if len(victims) >= over:
            del victims[over:]
        else:
            victims += list(islice(filter(refs.__contains__, window), over - len(victims)))
        store.remove(victims)
        holders, minus = self.holders, self._minus
        for h in victims:
            old = holders[h]
            s = minus.get((old, node_id))
            if s is None:
                s = minus[(old, node_id)] = old - {node_id}
            if s:
                holders[h] = s
            else:
                del holders[h]
        if len(minus) > self._CACHE_MAX:
            minus.clear()
        self.evicted += len(victims)

    def retain(self, branch_id: str, hashes: tuple[int, ...]) -> None:
        held = self.branches.get(branch_id)
        if held is None:
            held = self.branches[branch_id] = set()
        prev = self._retained.get(branch_id, ())
        if prev and len(prev) <= len(hashes) and hashes[len(prev) - 1] == prev[-1]:
            # The next turn of a growing context: only its new blocks (ids name their prefix).
            new: Collection[int] = [h for h in hashes[len(prev) :] if h not in held]
        else:
            new = set(hashes).difference(held)
        held.update(new)
        self._retained[branch_id] = hashes
        refs = self.refs
        for h in new:
            refs[h] = refs.get(h, 0) + 1

    def extend_prefix(self, node_id: str, hashes: tuple[int, ...], start: int) -> int:
        holders, i, n = self.holders, start, len(hashes)
        while i < n:
            s = holders.get(hashes[i])
            if s is None or node_id not in s:
                break
            i += 1
        return i

    def release(self, branch_id: str) -> None:
        refs = self.refs
        self._retained.pop(branch_id, None)
        for h in self.branches.pop(branch_id, ()):
            n = refs.get(h, 0) - 1
            if n <= 0:
                refs.pop(h, None)
            else:
                refs[h] = n


class PoolDirectory:
    """`Directory` over the real `kvpool.directory` `BlockDirectory`.

    Slots are allocated per node; when a node's host store is over
    `blocks_per_node`, the directory's own `choose_victims` picks what to drop
    (unreferenced LRU first), and this adapter unpublishes them, as a worker
    would. Times come from `clock()` (the simulator's now).
    """

    def __init__(
        self, directory: MemoryDirectory, blocks_per_node: int, block_bytes: int, clock: Callable[[], float]
    ) -> None:
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

    def extend_prefix(self, node_id: str, hashes: tuple[int, ...], start: int) -> int:
        held, i = self.held.get(node_id, set()), start
        while i < len(hashes) and str(hashes[i]) in held:
            i += 1
        return i

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


def make_directory(
    blocks_per_node: int, block_bytes: int, clock: Callable[[], float], kind: str = "memory"
) -> Directory:
    """`memory`: the real kvpool in-memory directory (when importable);
    `local`: the simulator's faster index with the same semantics."""
    if kind == "local":
        return LocalDirectory(blocks_per_node)
    try:
        from kvpool.directory.memory import MemoryDirectory
    except ImportError:
        return LocalDirectory(blocks_per_node)
    return PoolDirectory(MemoryDirectory(), blocks_per_node, block_bytes, clock)
