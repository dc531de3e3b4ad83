"""PeerLinks over FakeTransport and a fake peer agent endpoint: first contact
with the cluster token, failures, quarantine, and recovery (link restored,
peer restarted with a new agent)."""

from __future__ import annotations

import base64
import time
from collections.abc import Iterator

import httpx
import pytest
import torch

from kvpool.agent_info import AgentInfo
from kvpool.connector.peer_book import Backoff, PeerState
from kvpool.connector.peers import PeerLinks, failure_reason
from kvpool.hashing import block_hashes
from kvpool.store import HostBlockStore, StoreConfig
from kvpool.transport import FakeFabric, FakeTransport, PeerUnavailable, TransferTimeout
from testing.fake_agent_server import FakeAgentServer

BB, CAP = 16, 8
H = block_hashes(list(range(CAP)), 1, "peers-test")
TOKEN = "cluster-secret"


def _peer(fabric: FakeFabric, node: str, fill: int) -> tuple[FakeTransport, AgentInfo]:
    store = HostBlockStore(StoreConfig(BB, CAP))
    for i in range(4):
        store.put(H[i], torch.full((BB,), fill + i, dtype=torch.uint8))
    t = FakeTransport(node, store, fabric)
    info = AgentInfo(node, node, base64.b64encode(t.local_descriptor()).decode(), 0, BB, CAP)
    return t, info


@pytest.fixture
def server() -> Iterator[FakeAgentServer]:
    s = FakeAgentServer(token=TOKEN)
    yield s
    s.close()


def _links(fabric: FakeFabric, url: str, token: str | None = TOKEN) -> PeerLinks:
    reader = FakeTransport("r", HostBlockStore(StoreConfig(BB, CAP)), fabric, timeout_s=0.2)
    links = PeerLinks(reader, cluster_token=token, timeout_s=0.5, backoff=Backoff(first_s=0.01, max_s=0.05))
    links.note_urls({"a": url})
    return links


def _heal_until(links: PeerLinks, cond, timeout_s: float = 3.0) -> list[int]:
    freed: list[int] = []
    end = time.monotonic() + timeout_s
    while not cond():
        assert time.monotonic() < end, "recovery did not happen"
        freed += links.heal()
        time.sleep(0.01)
    return freed


def test_first_contact_fetches_the_agent_info_with_the_cluster_token(server: FakeAgentServer) -> None:
    fabric = FakeFabric()
    _, server.info = _peer(fabric, "a", 1)
    links = _links(fabric, server.url)
    links.connect("a")
    assert links.transport.peers() == ["a"]
    assert server.seen_auth == [f"Bearer {TOKEN}"]
    links.connect("a")  # known: no second fetch
    assert len(server.seen_auth) == 1


def test_without_the_token_a_guarded_peer_refuses_first_contact(server: FakeAgentServer) -> None:
    fabric = FakeFabric()
    _, server.info = _peer(fabric, "a", 1)
    links = _links(fabric, server.url, token=None)
    with pytest.raises(httpx.HTTPStatusError) as err:
        links.connect("a")
    assert failure_reason(err.value) == "http 401"
    assert links.transport.peers() == []


def test_agent_info_of_another_node_is_refused(server: FakeAgentServer) -> None:
    fabric = FakeFabric()
    _, server.info = _peer(fabric, "b", 1)
    links = _links(fabric, server.url)
    with pytest.raises(ValueError, match="serves node 'b'"):
        links.connect("a")


def test_link_cut_mid_pull_is_quarantined_then_healed_once_restored(server: FakeAgentServer) -> None:
    fabric = FakeFabric()
    _, server.info = _peer(fabric, "a", 10)
    links = _links(fabric, server.url)
    reader = links.transport
    assert isinstance(reader, FakeTransport)  # _links builds it over the fake fabric
    links.connect("a")
    fabric.cut_link("a")
    assert links.begin("a")
    with pytest.raises(TransferTimeout) as err:
        reader.read_blocks_sync("a", [0, 1], [5, 6])
    links.end("a")
    links.failed("a", err.value)
    assert not links.begin("a")  # later loads skip it at once
    assert links.book.record("a").reason == "timeout"
    for _ in range(5):  # while the link is down the stuck read keeps its slots
        assert links.heal() == []
        time.sleep(0.02)
    assert reader.quarantined("a") == 1 and links.book.record("a").state is PeerState.DOWN
    fabric.restore_link("a")
    freed = _heal_until(links, lambda: links.book.usable("a"))
    assert sorted(freed) == [5, 6]
    assert reader.store.data[5, 0].item() == 10  # the late write landed, in quarantined slots only
    assert links.begin("a")
    reader.read_blocks_sync("a", [2], [0])
    links.end("a")
    assert reader.store.data[0, 0].item() == 12
    assert links.book.record("a").reconnects == 1


def test_a_restarted_peer_is_re_registered_from_its_new_agent_info(server: FakeAgentServer) -> None:
    fabric = FakeFabric()
    _, server.info = _peer(fabric, "a", 10)
    links = _links(fabric, server.url)
    reader = links.transport
    assert isinstance(reader, FakeTransport)  # _links builds it over the fake fabric
    links.connect("a")
    reader.read_blocks_sync("a", [0], [0])
    fabric.kill("a")
    with pytest.raises(PeerUnavailable) as err:
        reader.read_blocks_sync("a", [1], [1])
    links.failed("a", err.value)
    for _ in range(3):  # its agent info still names the dead process: the probe fails
        links.heal()
        time.sleep(0.02)
    assert not links.book.usable("a")
    _, server.info = _peer(fabric, "a", 50)  # a new process with a new store and agent
    _heal_until(links, lambda: links.book.usable("a"))
    reader.read_blocks_sync("a", [1], [1])
    assert reader.store.data[1, 0].item() == 51


def test_an_unreachable_peer_backs_off(server: FakeAgentServer) -> None:
    fabric = FakeFabric()
    _, server.info = _peer(fabric, "a", 1)
    links = _links(fabric, server.url)
    links.connect("a")
    fabric.kill("a")
    links.failed("a", PeerUnavailable("gone"))
    server.close()
    end = time.monotonic() + 0.5
    while time.monotonic() < end:
        links.heal()
        time.sleep(0.01)
    rec = links.book.record("a")
    assert rec.state is PeerState.DOWN and rec.tries >= 2 and rec.reason == "unreachable"
