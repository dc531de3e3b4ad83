"""Fencing through the switcher and the registry: orders carry the term, a
stale one is refused and deposes the sender, heartbeats announce newer terms."""

from __future__ import annotations

from core import Phase
from gateway.control.phase_switch import PhaseSwitcher
from gateway.control.registry import WorkerRegistry
from gateway.kv.directory import GatewayDirectory
from kvpool.directory import MemoryDirectory
from testing.fake_worker import FakeWorker, InProcessWorkerClient


async def cluster(term: list[int]) -> tuple[WorkerRegistry, PhaseSwitcher, dict[str, FakeWorker], list[str]]:
    workers = {f"http://w{i}": FakeWorker(f"w{i}", phase=Phase.DECODE) for i in range(2)}
    client = InProcessWorkerClient(workers)
    registry = WorkerRegistry(client, GatewayDirectory(MemoryDirectory(), block_size=16), term_source=lambda: term[0])
    for url in workers:
        await registry.add(url)
    deposed: list[str] = []
    switcher = PhaseSwitcher(registry, client, term_source=lambda: term[0], on_fenced=deposed.append)
    return registry, switcher, workers, deposed


async def test_orders_carry_the_term_and_a_stale_one_changes_nothing() -> None:
    term = [3]
    registry, switcher, workers, deposed = await cluster(term)
    ok = await switcher.switch("w0", Phase.PREFILL, reason="t", who="planner")
    assert ok.outcome == "ok" and workers["http://w0"].switches[0][0] == 3
    workers["http://w1"].fence.observe(4)  # another replica leads at term 4
    out = await switcher.switch("w1", Phase.PREFILL, reason="t", who="planner")
    assert out.outcome == "fenced" and "stale_term" in out.detail
    assert workers["http://w1"].phase is Phase.DECODE and workers["http://w1"].switches == []
    assert registry.get("w1").phase is Phase.DECODE and not registry.get("w1").draining
    assert switcher.fenced == 1 and len(deposed) == 1 and "term 3 refused" in deposed[0]


async def test_heartbeats_tell_workers_a_newer_term() -> None:
    term = [0]
    registry, _, workers, _ = await cluster(term)
    assert [w.fence.newest for w in workers.values()] == [0, 0]
    term[0] = 5
    await registry.poll_once()
    assert [w.fence.newest for w in workers.values()] == [5, 5]
    assert registry.get("w0").fence_term == 0  # what the heartbeat reported before the announcement
    await registry.poll_once()
    assert registry.get("w0").fence_term == 5
    term[0] = 2  # a deposed replica's older term never lowers a worker's fence
    await registry.poll_once()
    assert [w.fence.newest for w in workers.values()] == [5, 5]
    assert await registry.announce_term(6) == 2 and [w.fence.newest for w in workers.values()] == [6, 6]
