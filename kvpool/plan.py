"""Scheduler-side bookkeeping of the KV connector (pure, no torch, no I/O).

vLLM runs the connector's scheduler half in the EngineCore process and its
worker half in the model-runner process. The scheduler half alone decides
which host-store slot holds which block, so its `SlotIndex` is the truth
about the local store; the worker half only copies bytes where it is told
(`LoadItem`, `SaveItem`, carried in the per-step connector metadata).

Slot lifecycle here: free -> reserved (a save or a staging load in flight,
pinned) -> committed (in the index, LRU-ordered) -> free (evicted). Pinned
slots are never evicted; a read by a peer of a slot evicted meanwhile is
caught by the store's tags on the reading side. A staging slot whose read
timed out is quarantined (the network may still write it,
kvpool.transport.base): released, it stays out of use until the worker half
reports the read finished.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any


@dataclass(frozen=True)
class RemoteRead:
    node_id: str
    remote_slot: int
    local_slot: int


@dataclass(frozen=True)
class LoadItem:
    """Copy host slots into the request's device blocks (after remote reads)."""

    req_id: str
    device_blocks: tuple[int, ...]
    local_slots: tuple[int, ...]  # one per device block
    hashes: tuple[str, ...]
    remote: tuple[RemoteRead, ...] = ()  # reads that fill some local_slots first
    layerwise: bool = False  # load inside the forward pass, layer by layer
    # Device blocks vLLM counts as loaded that this load does not fill (no
    # slot left to stage them): reported as load errors, so vLLM recomputes
    # them instead of reading whatever the blocks held before.
    unloaded: tuple[int, ...] = ()
    rid: str = ""  # the worker's own id of the request (its KV params' rid); "": req_id


@dataclass(frozen=True)
class SaveItem:
    """Copy the request's device blocks into host slots."""

    req_id: str
    device_blocks: tuple[int, ...]
    slots: tuple[int, ...]
    hashes: tuple[str, ...]


@dataclass
class StepPlan:
    loads: list[LoadItem] = field(default_factory=list)
    saves: list[SaveItem] = field(default_factory=list)
    peers: dict[str, str] = field(default_factory=dict)  # node_id -> base URL
    shape: dict[str, int] | None = None  # this step's work, for the iteration record


def step_shape(scheduler_output: Any) -> dict[str, int]:  # vLLM's SchedulerOutput (duck-typed)
    """What one engine step computes, from vLLM's SchedulerOutput.

    A request still producing no output is in prefill: its scheduled tokens
    are uncached prompt tokens and, for a new request, its computed tokens
    the cached prefix. The rest decode: batch and attended context.
    `attention_pairs` sums, over the prefills, scheduled tokens x (scheduled
    + already computed): each prompt's new tokens attend to its own context.
    """
    shape = {
        "prefill_requests": 0,
        "uncached_prompt_tokens": 0,
        "cached_prompt_tokens": 0,
        "attention_pairs": 0,
        "decode_requests": 0,
        "generated_tokens": 0,
        "context_tokens": 0,
    }
    counts = scheduler_output.num_scheduled_tokens
    for r in scheduler_output.scheduled_new_reqs:
        n = counts.get(r.req_id, 0)
        shape["prefill_requests"] += 1
        shape["uncached_prompt_tokens"] += n
        shape["cached_prompt_tokens"] += r.num_computed_tokens
        shape["attention_pairs"] += n * (n + r.num_computed_tokens)
    cached = scheduler_output.scheduled_cached_reqs
    for i, rid in enumerate(cached.req_ids):
        n = counts.get(rid, 0)
        if cached.num_output_tokens[i] == 0:
            shape["prefill_requests"] += 1
            shape["uncached_prompt_tokens"] += n
            shape["attention_pairs"] += n * (n + cached.num_computed_tokens[i])
        else:
            shape["decode_requests"] += 1
            shape["generated_tokens"] += n
            shape["context_tokens"] += cached.num_computed_tokens[i] + n
    return shape


class SlotIndex:
    """hash -> slot of the local host store, LRU, with reservations and pins."""

    def __init__(self, capacity: int) -> None:
        if capacity <= 0:
            raise ValueError("capacity must be > 0")
        self.capacity = capacity
        self._free = list(range(capacity - 1, -1, -1))  # pop() gives slot 0 first
        self._ready: OrderedDict[str, int] = OrderedDict()  # LRU first
        self._pins: dict[int, int] = {}
        self._reserved: set[int] = set()
        # Slots of superseded copies that a load still reads: freed at their last unpin.
        self._retired: set[int] = set()
        self._quarantined: set[int] = set()  # a timed-out read may still write them
        self._held: set[int] = set()  # released while quarantined: freed at unquarantine

    def __len__(self) -> int:
        return len(self._ready)

    def lookup(self, block_hash: str) -> int | None:
        slot = self._ready.get(block_hash)
        if slot is not None:
            self._ready.move_to_end(block_hash)
        return slot

    def pin(self, slots: Iterable[int]) -> None:
        for s in slots:
            self._pins[s] = self._pins.get(s, 0) + 1

    def unpin(self, slots: Iterable[int]) -> None:
        for s in slots:
            n = self._pins.get(s, 0) - 1
            if n <= 0:
                self._pins.pop(s, None)
                if s in self._retired:
                    self._retired.discard(s)
                    self._give_back(s)
            else:
                self._pins[s] = n

    def reserve(self, n: int) -> tuple[list[int], list[tuple[str, int]]]:
        """Take `n` slots (evicting LRU unpinned blocks). Returns (slots,
        dropped (hash, slot) pairs). Fewer than n slots when the rest are
        pinned or reserved."""
        slots: list[int] = []
        dropped: list[tuple[str, int]] = []
        while len(slots) < n and self._free:
            slots.append(self._free.pop())
        if len(slots) < n:
            for h in list(self._ready):
                if len(slots) >= n:
                    break
                s = self._ready[h]
                if s in self._pins:
                    continue
                del self._ready[h]
                dropped.append((h, s))
                slots.append(s)
        self._reserved.update(slots)
        return slots, dropped

    def available(self, keep: Iterable[int] = (), enough: int | None = None) -> int:
        """How many slots `reserve` could take now without evicting `keep`
        (counting stops at `enough`: a full store is not walked for a small load)."""
        n = len(self._free)
        if enough is not None and n >= enough:
            return n
        kept = set(keep)
        for s in self._ready.values():
            if s not in self._pins and s not in kept:
                n += 1
                if enough is not None and n >= enough:
                    break
        return n

    def commit(self, block_hash: str, slot: int) -> None:
        """A reserved slot now holds `block_hash`."""
        self._reserved.discard(slot)
        old = self._ready.pop(block_hash, None)
        if old is not None and old != slot:
            # An older copy of the same block: free now, or at its last
            # unpin if a load is still reading it.
            if old in self._pins:
                self._retired.add(old)
            else:
                self._give_back(old)
        self._ready[block_hash] = slot

    def release(self, slot: int) -> None:
        """A reserved slot was not filled (failed or cancelled)."""
        if slot in self._reserved:
            self._reserved.discard(slot)
            self._give_back(slot)

    def quarantine(self, slots: Iterable[int]) -> None:
        """Keep these slots out of use, even once released, until `unquarantine`."""
        self._quarantined.update(slots)

    def unquarantine(self, slots: Iterable[int]) -> None:
        """Nothing writes these slots any more; a released one is free again."""
        for s in slots:
            self._quarantined.discard(s)
            if s in self._held:
                self._held.discard(s)
                self._free.append(s)

    @property
    def quarantined(self) -> frozenset[int]:
        return frozenset(self._quarantined)

    def _give_back(self, slot: int) -> None:
        if slot in self._quarantined:
            self._held.add(slot)
        else:
            self._free.append(slot)


def plan_prefix_sources(
    hashes: list[str], start_block: int, max_blocks: int, index: SlotIndex, remote: dict[int, tuple[str, str, int]]
) -> list[tuple[int, str, str | None, int]]:
    """Walk blocks from `start_block` while each is local or offered remotely.

    `remote[i] = (hash, node_id, slot)` as resolved by the gateway. Returns
    [(block_index, hash, node_id or None for local, slot)], stopping at the
    first block found nowhere (a prefix must be contiguous).
    """
    out: list[tuple[int, str, str | None, int]] = []
    for i in range(start_block, min(max_blocks, len(hashes))):
        slot = index.lookup(hashes[i])
        if slot is not None:
            out.append((i, hashes[i], None, slot))
            continue
        offer = remote.get(i)
        if offer is None or offer[0] != hashes[i]:
            break
        out.append((i, hashes[i], offer[1], offer[2]))
    return out
