"""Host block store: one fixed region of host memory holding KV blocks by hash.

Layout of `buffer` (one contiguous uint8 tensor, registered with a transport
once): `capacity_blocks` slots of `block_bytes` data, then `capacity_blocks`
tags of HASH_BYTES. A slot's bytes are opaque here (the connector decides:
per block, all layers' K and V contiguous). A slot's tag is the raw digest of
the hash it holds, zero while it is free or being filled. Peers read data and
then tags; `commit(verify=True)` accepts a block only if the tag read *after*
the data still names the expected hash, so a slot reused mid-read is caught.

Slot lifecycle: FREE -> FILLING (allocate) -> READY (commit) -> FREE (evict,
drop, abort). READY slots form an LRU; pinned slots are never evicted.

Thread-safe: one lock guards the bookkeeping; data copies into a FILLING slot
run outside it (the slot belongs to its allocator until commit/abort).

Memory: the buffer is an anonymous mapping aligned to 2 MiB and advised for
transparent huge pages. torch's allocator does not ask for them (THP is
`madvise` on most distributions), and a peer's CMA read pins the source
pages one by one: on 4 KiB pages a 64 KiB read cost twice as much and 1-16
MiB reads stayed near 0.55-0.65x memcpy (docs/benchmarks-history.md).
"""

from __future__ import annotations

import heapq
import mmap
import threading
from collections import OrderedDict
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from enum import Enum
from typing import Any

import numpy as np
import torch

from kvpool.hashing import HASH_BYTES, hash_tag

GIB = 1 << 30
HUGE_PAGE = 2 << 20

# (candidates: evictable hashes, least recently used first; n) -> up to n
# victims drawn from candidates. Called with the store lock held: it must not
# call back into the store. Fewer than n answers are topped up in LRU order.
EvictionPolicy = Callable[[list[str], int], list[str]]


def lru_policy(candidates: list[str], n: int) -> list[str]:
    """The default; kvpool.directory.eviction.referenced_last consults the directory."""
    return candidates[:n]


class StoreError(Exception):
    """Root of the host store's errors."""


class StoreFull(StoreError):
    """Not enough free or evictable slots (the rest are filling or pinned)."""


class SlotState(str, Enum):
    FREE = "free"
    FILLING = "filling"
    READY = "ready"


@dataclass(frozen=True)
class StoreConfig:
    block_bytes: int  # bytes per block, > 0
    capacity_blocks: int  # slots, > 0
    pin_memory: bool = False  # page-locked buffer (needs a CUDA build of torch)
    huge_pages: bool = True  # back the buffer with transparent huge pages (ignored with pin_memory)
    eviction_window: int = 256  # LRU candidates offered to the policy per eviction (>= 1)

    def __post_init__(self) -> None:
        if self.block_bytes <= 0 or self.capacity_blocks <= 0 or self.eviction_window <= 0:
            raise ValueError(f"invalid StoreConfig {self}")

    @classmethod
    def from_gib(cls, block_bytes: int, capacity_gib: float, **kw: Any) -> StoreConfig:
        """`kw`: the other fields, by name."""
        return cls(block_bytes, max(1, int(capacity_gib * GIB) // block_bytes), **kw)

    @property
    def data_bytes(self) -> int:
        return self.block_bytes * self.capacity_blocks

    @property
    def total_bytes(self) -> int:
        return self.data_bytes + HASH_BYTES * self.capacity_blocks


@dataclass(frozen=True)
class StoreEvents:
    """Net changes since the last drain: publish `saved`, unpublish `dropped`."""

    saved: list[tuple[str, int]]  # (block_hash, slot)
    dropped: list[str]


@dataclass(frozen=True)
class StoreStats:
    capacity_blocks: int
    block_bytes: int
    ready_blocks: int
    filling_blocks: int
    pinned_slots: int
    saved_total: int
    dropped_total: int


class HostBlockStore:
    def __init__(self, config: StoreConfig, eviction_policy: EvictionPolicy | None = None) -> None:
        self.config = config
        self.block_bytes = config.block_bytes
        self.capacity_blocks = config.capacity_blocks
        self.buffer = host_buffer(config.total_bytes, pin_memory=config.pin_memory, huge_pages=config.huge_pages)
        self.data = self.buffer[: config.data_bytes].view(config.capacity_blocks, config.block_bytes)
        self.tags = self.buffer[config.data_bytes :].view(config.capacity_blocks, HASH_BYTES)
        self.tags_offset = config.data_bytes
        self._policy = eviction_policy or lru_policy
        self._lock = threading.Lock()
        self._free = list(range(config.capacity_blocks))  # min-heap: low slots first keeps runs contiguous
        self._state = [SlotState.FREE] * config.capacity_blocks
        self._hash_of: list[str | None] = [None] * config.capacity_blocks
        self._slot_of: dict[str, int] = {}  # FILLING and READY
        self._lru: OrderedDict[str, None] = OrderedDict()  # READY, oldest first
        self._pins: dict[int, int] = {}
        self._pending: dict[str, int | None] = {}  # hash -> saved slot | None (dropped)
        self._saved_total = 0
        self._dropped_total = 0

    # -- reads ---------------------------------------------------------
    def lookup(self, block_hash: str) -> int | None:
        """Slot of a READY block, else None. No side effects."""
        with self._lock:
            slot = self._slot_of.get(block_hash)
            return slot if slot is not None and self._state[slot] is SlotState.READY else None

    def lookup_prefix(self, block_hashes: Sequence[str], *, touch: bool = True) -> list[int]:
        """Slots of the longest prefix of READY blocks; marks them recently used."""
        with self._lock:
            out: list[int] = []
            for h in block_hashes:
                slot = self._slot_of.get(h)
                if slot is None or self._state[slot] is not SlotState.READY:
                    break
                out.append(slot)
                if touch:
                    self._lru.move_to_end(h)
            return out

    def hash_of(self, slot: int) -> str | None:
        with self._lock:
            return self._hash_of[slot] if self._state[slot] is SlotState.READY else None

    def get_view(self, slot: int) -> torch.Tensor:
        """The slot's bytes (a view, no copy). Pin the slot while you use it."""
        return self.data[slot]

    def touch(self, block_hashes: Sequence[str]) -> None:
        with self._lock:
            for h in block_hashes:
                if h in self._lru:
                    self._lru.move_to_end(h)

    def pin(self, slots: Sequence[int]) -> None:
        """Keep slots from eviction until unpin (counted; FILLING/READY only)."""
        with self._lock:
            for s in slots:
                if self._state[s] is SlotState.FREE:
                    raise StoreError(f"cannot pin free slot {s}")
                self._pins[s] = self._pins.get(s, 0) + 1

    def unpin(self, slots: Sequence[int]) -> None:
        with self._lock:
            for s in slots:
                left = self._pins.get(s, 0) - 1
                if left > 0:
                    self._pins[s] = left
                else:
                    self._pins.pop(s, None)

    # -- writes --------------------------------------------------------
    def allocate(self, block_hashes: Sequence[str]) -> list[int | None]:
        """Reserve a FILLING slot per hash not already stored (None for those).

        All or nothing: raises StoreFull and reserves nothing when the free
        plus evictable slots are too few. The caller then fills each slot
        (data only) and calls commit or abort.
        """
        with self._lock:
            wanted = [h for h in dict.fromkeys(block_hashes) if h not in self._slot_of]
            self._make_room(len(wanted))
            got: dict[str, int] = {}
            for h in wanted:
                slot = heapq.heappop(self._free)
                self._state[slot] = SlotState.FILLING
                self._hash_of[slot] = h
                self._slot_of[h] = slot
                self.tags[slot].zero_()
                got[h] = slot
            return [got.pop(h, None) for h in block_hashes]

    def commit(self, slots: Sequence[int], *, verify: bool = False) -> list[bool]:
        """FILLING -> READY. verify=True: accept only slots whose tag (copied
        from the peer after the data) names the slot's hash; rejected slots
        are freed. Otherwise stamps the tag. Returns acceptance per slot."""
        with self._lock:
            out = []
            for s in slots:
                if self._state[s] is not SlotState.FILLING:
                    raise StoreError(f"slot {s} is {self._state[s].value}, not filling")
                h = self._hash_of[s]
                assert h is not None
                tag = hash_tag(h)
                if verify and self.tags[s].numpy().tobytes() != tag:
                    self._free_slot(s)
                    out.append(False)
                    continue
                self.tags[s].copy_(torch.frombuffer(bytearray(tag), dtype=torch.uint8))
                self._state[s] = SlotState.READY
                self._lru[h] = None
                self._pending[h] = s
                self._saved_total += 1
                out.append(True)
            return out

    def abort(self, slots: Sequence[int]) -> None:
        """FILLING -> FREE (a failed fill)."""
        with self._lock:
            for s in slots:
                if self._state[s] is SlotState.FILLING:
                    self._free_slot(s)

    def put(self, block_hash: str, src: torch.Tensor | np.ndarray | bytes) -> int:
        """Store one block (copy of `block_bytes` bytes); an existing copy wins."""
        (slot,) = self.allocate([block_hash])
        if slot is None:
            existing = self.lookup(block_hash)
            if existing is not None:
                self.touch([block_hash])
                return existing
            raise StoreError(f"block {block_hash} is being filled by another caller")
        try:
            _copy_into(self.data[slot], src)
        except BaseException:
            self.abort([slot])
            raise
        self.commit([slot])
        return slot

    def drop(self, block_hashes: Sequence[str]) -> list[str]:
        """Evict these READY, unpinned blocks now; returns those dropped."""
        with self._lock:
            done = []
            for h in block_hashes:
                s = self._slot_of.get(h)
                if s is not None and self._state[s] is SlotState.READY and s not in self._pins:
                    self._evict(h)
                    done.append(h)
            return done

    def drain_events(self) -> StoreEvents:
        """Net saved/dropped blocks since the last drain (last event per hash wins)."""
        with self._lock:
            pending, self._pending = self._pending, {}
        saved = [(h, s) for h, s in pending.items() if s is not None]
        return StoreEvents(saved, [h for h, s in pending.items() if s is None])

    def stats(self) -> StoreStats:
        with self._lock:
            filling = len(self._slot_of) - len(self._lru)
            return StoreStats(
                self.capacity_blocks,
                self.block_bytes,
                len(self._lru),
                filling,
                len(self._pins),
                self._saved_total,
                self._dropped_total,
            )

    # -- internals (lock held) -------------------------------------------
    def _make_room(self, n: int) -> None:
        need = n - len(self._free)
        if need <= 0:
            return
        window = max(need * 4, self.config.eviction_window)
        candidates: list[str] = []
        for h in self._lru:
            if self._slot_of[h] not in self._pins:
                candidates.append(h)
                if len(candidates) >= window:
                    break
        if len(candidates) < need:
            raise StoreFull(f"need {need} more slots, only {len(candidates)} evictable")
        chosen = set(candidates)
        victims = [h for h in dict.fromkeys(self._policy(list(candidates), need)) if h in chosen][:need]
        if len(victims) < need:
            picked = set(victims)
            victims += [h for h in candidates if h not in picked][: need - len(victims)]
        for h in victims:
            self._evict(h)

    def _evict(self, h: str) -> None:
        self._free_slot(self._slot_of[h])
        self._pending[h] = None
        self._dropped_total += 1

    def _free_slot(self, s: int) -> None:
        h = self._hash_of[s]
        self.tags[s].zero_()
        self._state[s] = SlotState.FREE
        self._hash_of[s] = None
        if h is not None:
            self._slot_of.pop(h, None)
            self._lru.pop(h, None)
        self._pins.pop(s, None)
        heapq.heappush(self._free, s)


def host_buffer(nbytes: int, *, pin_memory: bool = False, huge_pages: bool = True) -> torch.Tensor:
    """A zeroed uint8 tensor of `nbytes` for a store (see the module doc)."""
    if pin_memory or not huge_pages or nbytes < HUGE_PAGE:
        return torch.zeros(nbytes, dtype=torch.uint8, pin_memory=pin_memory)
    region = mmap.mmap(-1, nbytes + HUGE_PAGE, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
    if hasattr(mmap, "MADV_HUGEPAGE"):
        region.madvise(mmap.MADV_HUGEPAGE)
    whole = torch.frombuffer(region, dtype=torch.uint8)  # the tensor keeps the mapping alive
    skip = -whole.data_ptr() % HUGE_PAGE
    return whole[skip : skip + nbytes]  # zero-filled by the kernel, pages committed on first touch


def _copy_into(dst: torch.Tensor, src: torch.Tensor | np.ndarray | bytes) -> None:
    """Copy one block into a slot view. Host bytes go through numpy's single
    memcpy: torch's threaded copy stalled badly on oversubscribed cores."""
    if isinstance(src, torch.Tensor):
        src = src.contiguous().view(torch.uint8).reshape(-1)
        if src.device.type != "cpu":
            dst.copy_(src)  # shape mismatch raises in torch
            return
        src = src.numpy()
    arr = np.frombuffer(src, np.uint8) if isinstance(src, (bytes, bytearray, memoryview)) else src
    arr = np.ascontiguousarray(arr).view(np.uint8).reshape(-1)
    if arr.size != dst.numel():
        raise ValueError(f"block is {arr.size} bytes, store blocks are {dst.numel()}")
    np.copyto(dst.numpy(), arr)
