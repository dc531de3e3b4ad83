"""Real NIXL/UCX reads between processes: batches, tag checks, dead and silent peers."""

from __future__ import annotations

import multiprocessing as mp
import time
from collections.abc import Iterator
from typing import Any

import pytest

from bench.kvpool_bench import serve_peer
from kvpool.store import HostBlockStore, StoreConfig
from kvpool.transport import PeerUnavailable, TransferTimeout
from kvpool.transport.nixl import NixlTransport, NixlTransportConfig

pytest.importorskip("nixl._api")
pytestmark = [pytest.mark.nixl, pytest.mark.timeout(180)]

BB, CAP = 4096, 64


class Peer:
    def __init__(self, name: str, specs: list[tuple[int, int]], pumps: list[bool]) -> None:
        ctx = mp.get_context("spawn")
        self.conn, theirs = ctx.Pipe()
        self.proc = ctx.Process(target=serve_peer, args=(theirs, name, specs, pumps), daemon=True)
        self.proc.start()
        self.served: list[tuple[str, bytes, list[str]]] = self.conn.recv()

    def call(self, *cmd: Any) -> Any:
        self.conn.send(cmd)
        return self.conn.recv()

    def stop(self) -> None:
        if self.proc.is_alive():
            self.conn.send(("exit",))
            self.proc.join(timeout=10)
        if self.proc.is_alive():
            self.proc.kill()


@pytest.fixture(scope="module")
def peers() -> Iterator[tuple[Peer, Peer]]:
    live = Peer("live", [(BB, CAP)], [True])
    doomed = Peer("doomed", [(BB, CAP), (BB, CAP)], [True, False])
    yield live, doomed
    live.stop()
    doomed.stop()


@pytest.fixture
def reader(peers: tuple[Peer, Peer]) -> Iterator[tuple[HostBlockStore, NixlTransport]]:
    store = HostBlockStore(StoreConfig(BB, CAP))
    transport = NixlTransport("reader", store, NixlTransportConfig(timeout_s=3.0))
    for peer in peers:
        for node_id, descriptor, _ in peer.served:
            transport.add_peer(node_id, descriptor)
    yield store, transport
    transport.close()


def _expected_first_byte(slot: int) -> int:
    return slot % 256  # bench.kvpool_bench.fill_store stamps the slot number in byte 0


def test_batched_read_of_contiguous_and_scattered_blocks(peers: tuple[Peer, Peer], reader: Any) -> None:
    store, transport = reader
    node_id, _, hashes = peers[0].served[0]
    remote = [3, 4, 5, 6, 20, 40, 41]
    local = store.allocate([hashes[s] for s in remote])
    assert local == list(range(7))
    transport.read_blocks_sync(node_id, remote, local)
    assert store.commit(local, verify=True) == [True] * 7
    for r, loc in zip(remote, local, strict=False):
        view = store.get_view(loc)
        assert view[0].item() == _expected_first_byte(r)
        assert view[1:8].tolist() == list(range(1, 8))
    assert store.lookup_prefix([hashes[s] for s in remote]) == local


def test_async_handle_polls_to_done(peers: tuple[Peer, Peer], reader: Any) -> None:
    store, transport = reader
    node_id, _, hashes = peers[0].served[0]
    local = store.allocate(hashes[:32])
    handle = transport.read_blocks(node_id, list(range(32)), local)
    deadline = time.monotonic() + 5
    while handle.poll().value == "pending":
        assert time.monotonic() < deadline
    assert handle.poll().value == "done" and handle.error is None
    assert all(store.commit(local, verify=True))


def test_slot_reused_by_peer_is_rejected(peers: tuple[Peer, Peer], reader: Any) -> None:
    store, transport = reader
    live = peers[0]
    node_id, _, hashes = live.served[0]
    assert live.call("drop", 0, [hashes[50]]) == [hashes[50]]
    newcomer = hashes[51][:-4] + "beef"  # any other hash now lands in the freed slot
    assert live.call("refill", 0, [newcomer]) == [50]
    local = store.allocate([hashes[50]])
    transport.read_blocks_sync(node_id, [50], local)
    assert store.commit(local, verify=True) == [False]
    assert store.lookup(hashes[50]) is None


def test_silent_peer_times_out_and_dead_peer_is_unavailable(peers: tuple[Peer, Peer], reader: Any) -> None:
    store, transport = reader
    live, doomed = peers
    silent_id = doomed.served[1][0]
    t0 = time.monotonic()
    with pytest.raises(TransferTimeout):
        transport.read_blocks_sync(silent_id, [0], [60], timeout_s=1.0)
    assert time.monotonic() - t0 < 5

    doomed_id = doomed.served[0][0]
    transport.read_blocks_sync(doomed_id, [1], [61])  # connected and working
    doomed.proc.kill()
    doomed.proc.join(timeout=10)
    t0 = time.monotonic()
    with pytest.raises(PeerUnavailable):
        transport.read_blocks_sync(doomed_id, [2], [62])
    assert time.monotonic() - t0 < 5
    with pytest.raises(PeerUnavailable):  # marked dead: fails fast from now on
        transport.read_blocks(doomed_id, [2], [62])
    assert doomed_id not in transport.peers()

    # The reader keeps working with the live peer.
    node_id, _, hashes = live.served[0]
    local = store.allocate(hashes[10:12])
    transport.read_blocks_sync(node_id, [10, 11], local)
    assert store.commit(local, verify=True) == [True, True]
