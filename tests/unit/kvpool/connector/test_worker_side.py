"""`WorkerSide`: when it copies a finished request's blocks to the host store,
and its pulls from peers (the cluster token, deadlines, quarantine notices
for the scheduler half, recovery).

On the CPU backend vLLM's "after the forward launch" is after the whole
(synchronous) forward pass, so saves and load submissions run before it;
on a GPU they stay after the launch, overlapping the forward.
"""

from __future__ import annotations

import base64
import dataclasses
import time

import pytest
import torch

from kvpool.agent_info import CLUSTER_TOKEN_ENV, AgentInfo
from kvpool.connector.peer_book import Backoff
from kvpool.connector.worker_side import WorkerSide
from kvpool.hashing import block_hashes
from kvpool.plan import LoadItem, RemoteRead, SaveItem, StepPlan
from kvpool.store import HostBlockStore, StoreConfig
from kvpool.transport import FakeFabric, FakeTransport
from testing.fake_agent_server import FakeAgentServer

BLOCKS, BLOCK_BYTES = 8, 64


def _side(tmp_path) -> tuple[WorkerSide, torch.Tensor]:
    side = WorkerSide("n0", BLOCK_BYTES, capacity=4, extra={"nixl": False, "run_dir": str(tmp_path)})
    kv = torch.arange(BLOCKS * BLOCK_BYTES, dtype=torch.int32).to(torch.uint8).reshape(BLOCKS, BLOCK_BYTES)
    side.register({"layer0": kv})
    return side, kv


def _plan() -> StepPlan:
    return StepPlan(
        saves=[SaveItem("r1", device_blocks=(3, 5), slots=(0, 1), hashes=("ab" * 16, "cd" * 16))],
        shape={"uncached_prompt_tokens": 0, "generated_tokens": 1},
    )


def test_cpu_caches_save_before_the_forward_pass(tmp_path) -> None:
    side, kv = _side(tmp_path)
    assert side.before_forward
    plan = _plan()
    side.begin_step(plan)  # bound right before the forward pass
    assert side.store is not None
    assert torch.equal(side.store.data[0], kv[3]) and torch.equal(side.store.data[1], kv[5])
    side.start_step(plan)  # after the forward: nothing left to do, nothing done twice
    assert side.finished(set()) == ({"r1"}, None)
    side.close()


def test_without_the_cpu_rule_the_save_waits_for_the_forward_pass(tmp_path) -> None:
    side, kv = _side(tmp_path)
    side.before_forward = False  # as with GPU caches
    plan = _plan()
    side.begin_step(plan)
    assert side.finished(set()) == (None, None)
    side.start_step(plan)
    assert side.store is not None and torch.equal(side.store.data[1], kv[5])
    assert side.finished(set()) == ({"r1"}, None)
    side.close()


# -- pulls from a peer (FakeTransport, a fake agent endpoint) ---------------------

PEER_BLOCK = 16  # BLOCK_BYTES of a peer store in these tests equals ours
H = block_hashes(list(range(4)), 1, "worker-side-pull")


def _pulling_side(tmp_path, monkeypatch, fabric: FakeFabric, timeout_s: float = 0.3):
    monkeypatch.setenv(CLUSTER_TOKEN_ENV, "tok")
    side = WorkerSide(
        "n0", BLOCK_BYTES, capacity=4, extra={"nixl": False, "run_dir": str(tmp_path), "pull_timeout_s": timeout_s}
    )
    kv = torch.zeros(BLOCKS, BLOCK_BYTES, dtype=torch.uint8)
    side.register({"layer0": kv})
    assert side.store is not None  # register() made it
    side.attach(FakeTransport("n0", side.store, fabric, timeout_s=timeout_s))
    assert side.links is not None  # attach() made them
    side.links.book.backoff = Backoff(first_s=0.01, max_s=0.05)
    return side, kv


def _peer_store(fabric: FakeFabric, server: FakeAgentServer) -> HostBlockStore:
    store = HostBlockStore(StoreConfig(BLOCK_BYTES, 4))
    for i, h in enumerate(H):
        store.put(h, torch.full((BLOCK_BYTES,), 40 + i, dtype=torch.uint8))
    t = FakeTransport("peer", store, fabric)
    server.info = AgentInfo("peer", "peer", base64.b64encode(t.local_descriptor()).decode(), 0, BLOCK_BYTES, 4)
    return store


def _load(rid: str, url: str, device=(2, 3), staging=(0, 1)) -> StepPlan:
    item = LoadItem(
        rid,
        device_blocks=device,
        local_slots=staging,
        hashes=tuple(H[: len(device)]),
        remote=tuple(RemoteRead("peer", i, s) for i, s in enumerate(staging)),
    )
    return StepPlan(loads=[item], peers={"peer": url})


def _finished_recv(side: WorkerSide, rid: str, timeout_s: float = 5.0) -> float:
    start = time.monotonic()
    while True:
        _, recv = side.finished(set())
        if recv and rid in recv:
            return time.monotonic() - start
        assert time.monotonic() - start < timeout_s, f"{rid} never finished"
        time.sleep(0.005)


@pytest.fixture
def agent_server():
    server = FakeAgentServer(token="tok")
    yield server
    server.close()


def test_a_pull_sends_the_cluster_token_and_fills_the_device_blocks(tmp_path, monkeypatch, agent_server) -> None:
    fabric = FakeFabric()
    _peer_store(fabric, agent_server)
    side, kv = _pulling_side(tmp_path, monkeypatch, fabric)
    side.begin_step(_load("r1", agent_server.url))
    _finished_recv(side, "r1")
    assert side.take_load_errors() == set()
    assert (kv[2, 0].item(), kv[3, 0].item()) == (40, 41)
    assert agent_server.seen_auth == ["Bearer tok"]
    side.close()


def test_blocks_the_plan_could_not_stage_are_reported_as_load_errors(tmp_path, monkeypatch, agent_server) -> None:
    fabric = FakeFabric()
    _peer_store(fabric, agent_server)
    side, kv = _pulling_side(tmp_path, monkeypatch, fabric)
    plan = _load("r1", agent_server.url)
    plan.loads[0] = dataclasses.replace(plan.loads[0], unloaded=(4, 5))
    side.begin_step(plan)
    _finished_recv(side, "r1")
    # The pulled blocks landed; the two vLLM counted but nobody filled are recomputed.
    assert (kv[2, 0].item(), kv[3, 0].item()) == (40, 41)
    assert side.take_load_errors() == {4, 5}
    side.close()


def test_a_cut_link_times_out_quarantines_recomputes_and_heals(tmp_path, monkeypatch, agent_server) -> None:
    fabric = FakeFabric()
    _peer_store(fabric, agent_server)
    side, kv = _pulling_side(tmp_path, monkeypatch, fabric, timeout_s=0.3)
    side.begin_step(_load("warm", agent_server.url))
    _finished_recv(side, "warm")
    fabric.cut_link("peer")
    side.begin_step(_load("r1", agent_server.url))
    stalled = _finished_recv(side, "r1")
    assert 0.25 <= stalled < 1.3  # the deadline, not more
    assert side.take_load_errors() == {2, 3}  # recomputed
    assert side.slot_notices() == ([0, 1], [])  # staging slots held back from the scheduler's index
    side.begin_step(_load("r2", agent_server.url, staging=(2, 3)))
    assert _finished_recv(side, "r2") < 0.2  # the peer is down: recompute at once
    assert side.take_load_errors() == {2, 3}
    fabric.restore_link("peer")
    deadline = time.monotonic() + 5
    released: list[int] = []
    while not (released and side.links.book.usable("peer")):
        assert time.monotonic() < deadline
        released += side.slot_notices()[1]
        time.sleep(0.02)
    assert sorted(released) == [0, 1]
    side.begin_step(_load("r3", agent_server.url, staging=(2, 3)))
    _finished_recv(side, "r3")
    assert side.take_load_errors() == set()
    side.close()


# -- a reused slot never shows new data under its old tag ------------------------------


def test_a_save_into_a_reused_slot_zeroes_its_tag_while_the_data_changes(tmp_path) -> None:
    """The scheduler reuses slot 0 (it held block `ab..`) for a new block while
    peers may still be offered the old one: a peer reads data then tag, so
    during the data write the tag must name no block."""
    side, kv = _side(tmp_path)
    store = side.store
    assert store is not None
    tags = store.tags
    side.begin_step(_plan())  # slot 0 holds "ab"*16 (device block 3)
    side.finished(set())
    seen: list[bytes] = []
    real_layers = side.layers

    class Watched:  # the layer view's index_select: the moment the data is about to change
        def __init__(self, view):
            self.view, self.shape = view, view.shape

        def index_select(self, dim, index):
            seen.append(tags[0].numpy().tobytes())
            return self.view.index_select(dim, index)

    side.layers = [(name, Watched(view), off) for name, view, off in real_layers]  # type: ignore[misc]  # a view that reports when it is read
    save = SaveItem("r2", device_blocks=(6,), slots=(0,), hashes=("ef" * 16,))
    side.begin_step(StepPlan(saves=[save], shape={"uncached_prompt_tokens": 0, "generated_tokens": 1}))
    assert seen == [bytes(16)]  # no tag while the data changed ("ab"*16 there would pass a peer's check)
    assert store.tags[0].numpy().tobytes() == bytes.fromhex("ef" * 16)
    assert torch.equal(store.data[0], kv[6])
    side.close()


def test_a_staging_slot_loses_its_old_tag_before_a_pull_lands(tmp_path, monkeypatch, agent_server) -> None:
    """Staging slot 0 held a block peers were offered; a pull into it that
    never lands (a cut link) must not leave that block's tag over it."""
    fabric = FakeFabric()
    _peer_store(fabric, agent_server)
    side, _ = _pulling_side(tmp_path, monkeypatch, fabric, timeout_s=0.2)
    assert side.store is not None
    side.begin_step(_load("warm", agent_server.url))
    _finished_recv(side, "warm")
    old = side.store.tags[0].numpy().tobytes()
    assert old == bytes.fromhex(H[0])  # slot 0 holds a block
    fabric.cut_link("peer")
    side.begin_step(_load("r1", agent_server.url, staging=(0, 1)))
    _finished_recv(side, "r1")
    assert side.store.tags[0].numpy().tobytes() == bytes(16)
    side.close()
