"""Transport contract on FakeTransport: batching, tag check, errors, no hangs."""

from __future__ import annotations

import pytest
import torch

from kvpool.hashing import block_hashes
from kvpool.store import HostBlockStore, StoreConfig
from kvpool.transport import (
    FakeFabric,
    FakeTransport,
    PeerUnavailable,
    TransferError,
    TransferState,
    TransferTimeout,
    contiguous_runs,
)
from kvpool.transport.base import PeerLayout, decode_descriptor, encode_descriptor

H = block_hashes(list(range(8)), 1, "transport-test")


def pair(**fabric_kw: object) -> tuple[FakeFabric, HostBlockStore, HostBlockStore, FakeTransport]:
    # fabric_kw: the fake fabric's keywords, passed through untyped by the tests.
    fabric = FakeFabric(**fabric_kw)  # type: ignore[arg-type]
    a = HostBlockStore(StoreConfig(16, 8))
    b = HostBlockStore(StoreConfig(16, 8))
    ta, tb = FakeTransport("a", a, fabric), FakeTransport("b", b, fabric)
    tb.add_peer("a", ta.local_descriptor())
    for i in range(4):
        a.put(H[i], torch.full((16,), i + 1, dtype=torch.uint8))
    return fabric, a, b, tb


def _descriptor(node: str, store: HostBlockStore) -> bytes:
    return encode_descriptor(PeerLayout(node, store.block_bytes, store.capacity_blocks, 0, store.tags_offset), b"fake")


def test_contiguous_runs() -> None:
    assert contiguous_runs([3, 4, 5, 9, 10, 2], [0, 1, 2, 3, 4, 7]) == [(3, 0, 3), (9, 3, 2), (2, 7, 1)]
    assert contiguous_runs([], []) == []


def test_descriptor_roundtrip_and_layout_check() -> None:
    fabric = FakeFabric()
    t = FakeTransport("x", HostBlockStore(StoreConfig(16, 8)), fabric)
    layout, payload = decode_descriptor(t.local_descriptor())
    assert (layout.node_id, layout.block_bytes, layout.capacity_blocks, payload) == ("x", 16, 8, b"fake")
    other = FakeTransport("y", HostBlockStore(StoreConfig(32, 8)), fabric)
    with pytest.raises(ValueError, match="peer x blocks are 16 B, ours 32 B"):
        other.add_peer("x", t.local_descriptor())
    with pytest.raises(ValueError, match="descriptor is for 'x', not 'z'"):
        other.add_peer("z", t.local_descriptor())


def test_read_then_commit_verified() -> None:
    fabric, a, b, tb = pair(polls_to_complete=2)
    wanted = [H[0], H[1], H[2]]
    remote = a.lookup_prefix(wanted)
    local = b.allocate(wanted)
    # lookup_prefix / allocate return slots typed as `int | None`; here every one is found.
    handle = tb.read_blocks("a", remote, local)  # type: ignore[arg-type]
    assert handle.poll() is TransferState.PENDING
    handle.wait(1.0)
    assert handle.poll() is TransferState.DONE
    assert b.commit(local, verify=True) == [True, True, True]  # type: ignore[arg-type]
    assert [b.get_view(s)[0].item() for s in b.lookup_prefix(wanted)] == [1, 2, 3]


def test_slot_reused_during_read_is_rejected() -> None:
    fabric, a, b, tb = pair()

    def reuse(peer: str, slots: list[int]) -> None:  # peer evicts H1 and fills its slot with H7
        a.drop([H[1]])
        a.put(H[7], torch.zeros(16, dtype=torch.uint8))

    fabric.between_data_and_tags = reuse
    local = b.allocate([H[0], H[1]])
    # allocate returns slots typed as `int | None`; here every one is allocated.
    tb.read_blocks_sync("a", [0, 1], local)  # type: ignore[arg-type]
    assert b.commit(local, verify=True) == [True, False]  # type: ignore[arg-type]
    assert b.lookup(H[1]) is None


def test_dead_peer_is_peer_unavailable_and_reader_keeps_working() -> None:
    fabric, a, b, tb = pair()
    c = HostBlockStore(StoreConfig(16, 8))
    tc = FakeTransport("c", c, fabric)
    c.put(H[5], torch.full((16,), 5, dtype=torch.uint8))
    tb.add_peer("c", tc.local_descriptor())
    handle = tb.read_blocks("a", [0], [0])
    fabric.kill("a")
    with pytest.raises(PeerUnavailable):
        handle.wait(1.0)
    with pytest.raises(PeerUnavailable):
        tb.read_blocks("a", [0], [0])
    with pytest.raises(PeerUnavailable):
        tb.read_blocks("nobody", [0], [0])
    (slot,) = b.allocate([H[5]])
    # allocate returns a slot typed as `int | None`; here it is allocated.
    tb.read_blocks_sync("c", [0], [slot])  # type: ignore[list-item]
    assert b.commit([slot], verify=True) == [True]  # type: ignore[list-item]


def test_injected_failure_and_timeout() -> None:
    fabric, a, b, tb = pair(fail_reads=1)
    with pytest.raises(TransferError):
        tb.read_blocks_sync("a", [0], [0])
    fabric.polls_to_complete = 10**9
    handle = tb.read_blocks("a", [0], [0])
    with pytest.raises(TransferTimeout):
        handle.wait(0.01)
    assert handle.poll() is TransferState.ERROR and isinstance(handle.error, TransferTimeout)


def test_bad_slot_lists_are_rejected_up_front() -> None:
    _, _, _, tb = pair()
    with pytest.raises(ValueError, match="2 remote slots but 1 local slots"):
        tb.read_blocks("a", [0, 1], [0])
    with pytest.raises(ValueError, match=r"remote slot 8 outside \[0, 8\)"):
        tb.read_blocks("a", [8], [0])
    with pytest.raises(ValueError, match="duplicate local slots"):
        tb.read_blocks("a", [0, 1], [3, 3])


def test_a_timed_out_read_keeps_its_slots_until_it_finishes_late() -> None:
    fabric, a, b, tb = pair()
    fabric.cut_link("a")
    with pytest.raises(TransferTimeout):
        tb.read_blocks_sync("a", [0, 1], [4, 5], timeout_s=0.01)
    assert tb.peers() == [] and tb.down_reason("a") == "timed out"
    assert (tb.quarantined("a"), tb.quarantined(), tb.drain_quarantine()) == (1, 1, [])
    with pytest.raises(PeerUnavailable):
        tb.read_blocks_sync("a", [2], [6])  # down until added again
    with pytest.raises(PeerUnavailable):
        tb.add_peer("a", _descriptor("a", a))
    fabric.restore_link("a")
    assert tb.drain_quarantine() == [4, 5]
    assert [b.get_view(s)[0].item() for s in (4, 5)] == [1, 2]  # what the network delivered late
    assert tb.quarantined() == 0


def test_a_stuck_read_to_a_peer_that_died_finishes_without_writing() -> None:
    fabric, a, b, tb = pair()
    fabric.cut_link("a")
    with pytest.raises(TransferTimeout):
        tb.read_blocks_sync("a", [0], [4], timeout_s=0.01)
    fabric.kill("a")
    fabric.restore_link("a")
    assert tb.drain_quarantine() == [4]
    assert b.get_view(4)[0].item() == 0


def test_add_peer_again_after_the_quarantine_brings_it_back_and_probe_answers() -> None:
    fabric, a, b, tb = pair()
    fabric.cut_link("a")
    with pytest.raises(TransferTimeout):
        tb.probe("a", 0.01)
    assert tb.quarantined("a") == 1
    fabric.restore_link("a")
    assert tb.drain_quarantine() == []  # a probe holds no slots
    tb.add_peer("a", _descriptor("a", a))
    tb.probe("a", 0.01)
    assert tb.peers() == ["a"]
