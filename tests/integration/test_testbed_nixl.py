"""NIXL across hosts of the testbed, UCX limited to TCP: reads cross the cable,
a pulled cable times out within the deadline and quarantines the slots until
the read finishes, and the reader recovers from a restored link, a killed
peer and a restarted peer without restarting itself.

The peer is `bench kvpool`'s serving process in host w1; the reader runs in
this process on a thread inside host gw (every socket UCX opens is gw's).
"""

from __future__ import annotations

import base64
import json
import pathlib
import subprocess
import sys
import time
from collections.abc import Iterator
from typing import Any

import pytest

from cli.testbed.netns import Testbed
from cli.testbed.plan import NETWORK_UCX_ENV, parse_ucx_transport
from kvpool.store import HostBlockStore, StoreConfig
from kvpool.transport import PeerUnavailable, TransferTimeout

pytest.importorskip("nixl._api")
pytestmark = [pytest.mark.testbed, pytest.mark.nixl, pytest.mark.timeout(300)]

MIB = 1 << 20
REPO = str(pathlib.Path(__file__).resolve().parents[2])


class Peer:
    """`bench kvpool --serve-peer` in a host: 1 MiB blocks over a 64 MiB region."""

    def __init__(self, tb: Testbed, host: str, log: pathlib.Path, n: int) -> None:
        self.tb, self.desc = tb, tb.run_dir / f"peer-{n}.json"
        self.desc.unlink(missing_ok=True)  # an earlier test's peer (the testbed is shared): its agent is gone
        argv = [sys.executable, "-m", "bench.kvpool_bench", "--serve-peer", str(self.desc), "--region-mib", "64"]
        with open(log, "wb") as out:
            env = {**NETWORK_UCX_ENV, "UCX_LOG_LEVEL": "info"}
            self.proc = tb.popen(host, argv, env=env, stdout=out, stderr=subprocess.STDOUT, cwd=REPO)
        end = time.monotonic() + 120
        while not self.desc.exists():
            assert self.proc.poll() is None and time.monotonic() < end, log.read_text()[-2000:]
            time.sleep(0.1)
        served = {int(n.rsplit("-", 1)[1]): (n, d, h) for n, d, h in json.loads(self.desc.read_text())}
        self.node_id, desc_b64, self.hashes = served[MIB]
        self.descriptor = base64.b64decode(desc_b64)

    def stop(self, kill: bool = False) -> None:
        if self.proc.poll() is None:
            self.proc.kill() if kill else self.proc.terminate()
        self.proc.wait(30)


@pytest.fixture
def ucx_tcp(monkeypatch: pytest.MonkeyPatch) -> None:
    for k, v in NETWORK_UCX_ENV.items():
        monkeypatch.setenv(k, v)


@pytest.fixture
def peer(netns_testbed: Testbed, tmp_path: pathlib.Path) -> Iterator[Peer]:
    p = Peer(netns_testbed, "w1", tmp_path / "peer.log", 1)
    yield p
    p.stop()


def test_reads_cross_the_cable_over_tcp(netns_testbed: Testbed, peer: Peer, ucx_tcp: None, tmp_path) -> None:
    from kvpool.transport.nixl import NixlTransport, NixlTransportConfig

    tb = netns_testbed

    def read() -> list[bool]:
        store = HostBlockStore(StoreConfig(MIB, 64))
        t = NixlTransport("xreader", store, NixlTransportConfig(timeout_s=10.0))
        try:
            t.add_peer(peer.node_id, peer.descriptor)
            t.read_blocks_sync(peer.node_id, list(range(32)), list(range(32)))
            return [bytes(store.tags[s].numpy()) == bytes.fromhex(peer.hashes[s]) for s in range(32)]
        finally:
            t.close()

    before = tb.link_bytes("w1")
    assert tb.call_in("gw", read) == [True] * 32
    sent = tb.link_bytes("w1")["tx_bytes"] - before["tx_bytes"]
    assert sent >= 32 * MIB  # the blocks went over w1's cable, not through shared memory
    ucx = parse_ucx_transport((tmp_path / "peer.log").read_text(errors="replace"))
    assert ucx is not None and ucx.peer_kind == "inter-node" and ucx.lanes == ("tcp/eth0",), ucx
    assert ucx.shared_memory_free


def test_link_faults_peer_death_and_restart_are_survived(
    netns_testbed: Testbed, peer: Peer, ucx_tcp: None, tmp_path: pathlib.Path
) -> None:
    from kvpool.transport.nixl import NixlTransport, NixlTransportConfig

    tb = netns_testbed
    peers = [peer]
    events: dict[str, Any] = {}

    def scenario() -> None:
        store = HostBlockStore(StoreConfig(MIB, 64))
        t = NixlTransport("xreader", store, NixlTransportConfig(timeout_s=10.0))
        try:
            p = peers[0]
            t.add_peer(p.node_id, p.descriptor)
            t.read_blocks_sync(p.node_id, [0], [0])
            # 1. The cable is pulled while 32 MiB are on their way (rate capped: ~1 s of transfer).
            tb.limit_rate("w1", "200mbit")
            store.data[32:64] = 0
            tx0 = tb.link_bytes("w1")["tx_bytes"]
            start = time.monotonic()
            handle = t.read_blocks(p.node_id, list(range(32)), list(range(32, 64)))
            while tb.link_bytes("w1")["tx_bytes"] - tx0 < 2 * MIB:
                assert time.monotonic() - start < 20
                time.sleep(0.005)
            tb.set_link("w1", False)
            with pytest.raises(TransferTimeout):
                handle.wait(timeout_s=2.0)
            events["timeout_after_s"] = time.monotonic() - start
            assert p.node_id not in t.peers() and t.quarantined(p.node_id) == 1
            with pytest.raises(PeerUnavailable):
                t.add_peer(p.node_id, p.descriptor)  # not while its stuck read may still land
            time.sleep(1.0)
            tb.set_link("w1", True)
            tb.limit_rate("w1", None)
            end = time.monotonic() + 30
            freed: list[int] = []
            while len(freed) < 32:  # UCX finishes the stuck read (delivered late, or failed)
                assert time.monotonic() < end, f"quarantine never drained: {freed}"
                freed += t.drain_quarantine()
                time.sleep(0.1)
            assert sorted(freed) == list(range(32, 64))
            snapshot = store.data[32:64].clone()
            t.add_peer(p.node_id, p.descriptor)  # a fresh connection; neither side restarted
            t.probe(p.node_id, 2.0)
            t.read_blocks_sync(p.node_id, [5], [5], timeout_s=5.0)
            assert bytes(store.tags[5].numpy()) == bytes.fromhex(p.hashes[5])
            time.sleep(1.0)
            assert bool((store.data[32:64] == snapshot).all())  # nothing lands after the quarantine ended
            # 2. The peer dies mid-read.
            tb.limit_rate("w1", "200mbit")
            handle = t.read_blocks(p.node_id, list(range(32)), list(range(32)))
            time.sleep(0.05)
            killed = time.monotonic()
            p.stop(kill=True)
            with pytest.raises(PeerUnavailable):
                handle.wait(timeout_s=5.0)
            events["dead_after_s"] = time.monotonic() - killed
            tb.limit_rate("w1", None)
            # 3. It restarts: a new process, a new NIXL agent, the same node id.
            fresh = Peer(tb, "w1", tmp_path / "peer2.log", 2)
            peers.append(fresh)
            assert fresh.node_id == p.node_id and fresh.descriptor != p.descriptor
            end = time.monotonic() + 30
            while t.quarantined(p.node_id):
                assert time.monotonic() < end
                time.sleep(0.1)
            t.add_peer(fresh.node_id, fresh.descriptor)
            t.read_blocks_sync(fresh.node_id, [7], [7], timeout_s=5.0)
            assert bytes(store.tags[7].numpy()) == bytes.fromhex(fresh.hashes[7])
        finally:
            t.close()

    try:
        tb.call_in("gw", scenario)
    finally:
        tb.set_link("w1", True)
        tb.limit_rate("w1", None)
        for p in peers[1:]:
            p.stop()
    assert events["timeout_after_s"] < 2.0 + 1.0  # the read's deadline, not the network's
    assert events["dead_after_s"] < 2.0
