"""kvpool.store.HostBlockStore: slots, LRU eviction, policy, events, tags."""

from __future__ import annotations

import threading

import numpy as np
import pytest
import torch

from kvpool.directory.eviction import referenced_last
from kvpool.hashing import block_hashes
from kvpool.store import HostBlockStore, StoreConfig, StoreFull

H = block_hashes(list(range(16)), 1, "store-test")  # 16 distinct hashes


def block(v: int, n: int = 8) -> torch.Tensor:
    return torch.full((n,), v, dtype=torch.uint8)


def make(cap: int = 4, **kw: object) -> HostBlockStore:
    # kw: the store's optional keywords, passed through untyped by the tests.
    return HostBlockStore(StoreConfig(block_bytes=8, capacity_blocks=cap), **kw)  # type: ignore[arg-type]


def test_layout_is_one_contiguous_region() -> None:
    s = make(4)
    assert s.buffer.numel() == 4 * 8 + 4 * 16 and s.buffer.is_contiguous()
    assert s.data.data_ptr() == s.buffer.data_ptr()
    assert s.tags.data_ptr() == s.buffer.data_ptr() + s.tags_offset == s.buffer.data_ptr() + 32
    assert StoreConfig.from_gib(1 << 20, 0.5).capacity_blocks == 512


def test_put_lookup_view_and_tag() -> None:
    s = make()
    assert s.put(H[0], block(1)) == 0 and s.put(H[1], np.full(8, 2, np.uint8)) == 1
    assert s.put(H[0], block(9)) == 0  # existing copy wins
    assert s.lookup(H[0]) == 0 and s.lookup(H[5]) is None
    assert s.get_view(1).tolist() == [2] * 8
    assert bytes(s.tags[0].numpy()).hex() == H[0]
    assert s.lookup_prefix([H[0], H[1], H[2], H[0]]) == [0, 1]
    with pytest.raises(ValueError, match="block is 5 bytes, store blocks are 8"):
        s.put(H[3], b"short")


def test_lru_eviction_and_events() -> None:
    s = make(3)
    for i in range(3):
        s.put(H[i], block(i))
    s.touch([H[0]])  # H1 is now least recently used
    assert s.put(H[3], block(3)) == 1
    assert s.lookup(H[1]) is None and s.lookup(H[0]) == 0
    assert bytes(s.tags[1].numpy()).hex() == H[3]
    ev = s.drain_events()
    assert ev.saved == [(H[0], 0), (H[2], 2), (H[3], 1)] and ev.dropped == [H[1]]
    assert s.drain_events().saved == []


def test_events_collapse_to_net_state() -> None:
    s = make(1)
    s.put(H[0], block(0))
    s.put(H[1], block(1))  # evicts H0
    s.put(H[0], block(0))  # evicts H1, H0 back in slot 0
    ev = s.drain_events()
    assert ev.saved == [(H[0], 0)] and ev.dropped == [H[1]]


def test_policy_keeps_referenced_blocks_last() -> None:
    refs = {H[0]: 1}
    s = make(2, eviction_policy=referenced_last(lambda hs: [refs.get(h, 0) for h in hs]))
    s.put(H[0], block(0))
    s.put(H[1], block(1))
    s.put(H[2], block(2))  # H0 is LRU but referenced -> H1 goes
    assert s.lookup(H[0]) == 0 and s.lookup(H[1]) is None


def test_bad_policy_answers_are_ignored_and_topped_up() -> None:
    s = make(2, eviction_policy=lambda cands, n: ["not-a-candidate"])
    s.put(H[0], block(0))
    s.put(H[1], block(1))
    s.put(H[2], block(2))
    assert s.lookup(H[0]) is None and s.stats().ready_blocks == 2


def test_pinned_and_filling_slots_are_never_evicted() -> None:
    s = make(2)
    s.put(H[0], block(0))
    s.pin([0])
    (slot,) = s.allocate([H[1]])
    assert slot == 1
    with pytest.raises(StoreFull):
        s.allocate([H[2]])
    s.abort([1])
    s.unpin([0])
    assert s.allocate([H[2]]) == [1]


def test_allocate_is_all_or_nothing_and_skips_present() -> None:
    s = make(2)
    s.put(H[0], block(0))
    with pytest.raises(StoreFull):
        s.pin([0])
        s.allocate([H[1], H[2]])
    assert s.stats().filling_blocks == 0
    s.unpin([0])
    assert s.allocate([H[0], H[1]]) == [None, 1]


def test_commit_verify_rejects_wrong_tag() -> None:
    s = make(2)
    a, b = s.allocate([H[0], H[1]])
    assert a is not None and b is not None
    s.tags[a].copy_(torch.tensor(list(bytes.fromhex(H[0])), dtype=torch.uint8))  # as a peer read would
    s.tags[b].copy_(torch.tensor(list(bytes.fromhex(H[5])), dtype=torch.uint8))  # slot was reused
    assert s.commit([a, b], verify=True) == [True, False]
    assert s.lookup(H[0]) == a and s.lookup(H[1]) is None
    assert s.drain_events().saved == [(H[0], a)]


def test_drop_and_stats() -> None:
    s = make(3)
    s.put(H[0], block(0))
    s.put(H[1], block(1))
    s.pin([1])
    assert s.drop([H[0], H[1], H[9]]) == [H[0]]
    st = s.stats()
    assert (st.ready_blocks, st.pinned_slots, st.saved_total, st.dropped_total) == (1, 1, 2, 1)


def test_concurrent_puts_keep_the_map_consistent() -> None:
    s = HostBlockStore(StoreConfig(block_bytes=64, capacity_blocks=32))
    hashes = block_hashes(list(range(400)), 1, "threads")

    def worker(k: int) -> None:
        for i in range(k, 400, 4):
            slot = s.put(hashes[i], torch.full((64,), i % 256, dtype=torch.uint8))
            assert slot is not None

    threads = [threading.Thread(target=worker, args=(k,)) for k in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    live = [h for h in hashes if s.lookup(h) is not None]
    assert len(live) == 32
    for h in live:
        slot = s.lookup(h)
        assert slot is not None and bytes(s.tags[slot].numpy()).hex() == h
        assert s.get_view(slot)[0].item() == hashes.index(h) % 256
