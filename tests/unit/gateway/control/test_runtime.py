"""Cluster runtime: pins, switches through the switcher, split history."""

from __future__ import annotations

from typing import Any

import pytest

from core import Phase
from gateway.control.phase_switch import PhaseSwitcher
from gateway.control.registry import WorkerRegistry
from gateway.control.runtime import PIN_RETRY_S, ClusterRuntime
from gateway.http.errors import Conflict, InvalidRequest
from gateway.kv.directory import GatewayDirectory
from kvpool.directory import MemoryDirectory
from planner.types import PlannerMode
from testing.fake_worker import FakeWorker, InProcessWorkerClient

# The pin rule itself: planner.decision.pin_actions (tests/unit/planner/test_decision.py).


async def runtime(phases: list[Phase], **kw: Any) -> tuple[ClusterRuntime, dict[str, FakeWorker], list]:
    workers = {f"http://w{i}": FakeWorker(f"w{i}", phase=p) for i, p in enumerate(phases)}
    client = InProcessWorkerClient(workers)
    directory = GatewayDirectory(MemoryDirectory(), block_size=16)
    registry = WorkerRegistry(client, directory)
    for url in workers:
        await registry.add(url)
    events: list = []
    switcher = PhaseSwitcher(registry, client, sinks=[lambda o, r, w: events.append((o, r, w))])
    return ClusterRuntime(registry, switcher, directory, **kw), workers, events


async def test_switch_records_outcome_and_flips_phase():
    rt, workers, events = await runtime([Phase.PREFILL, Phase.DECODE])
    out = await rt.switch("w1", Phase.PREFILL, reason="test", who="alice")
    assert out.outcome == "ok" and (out.from_phase, out.to_phase) == (Phase.DECODE, Phase.PREFILL)
    assert workers["http://w1"].phase is Phase.PREFILL and rt.split() == (2, 0)
    assert events[0][1:] == ("test", "alice")
    noop = await rt.switch("w1", Phase.PREFILL, reason="again", who="alice")
    assert noop.outcome == "noop"


async def test_failed_switch_restores_phase():
    rt, workers, events = await runtime([Phase.DECODE, Phase.DECODE])
    workers["http://w0"].kill()
    out = await rt.switch("w0", Phase.PREFILL, reason="x", who="y")
    assert out.outcome == "failed"
    node = rt.registry.get("w0")
    assert node.phase is Phase.DECODE and not node.draining


async def test_pins_win():
    rt, workers, _ = await runtime([Phase.PREFILL, Phase.DECODE, Phase.DECODE])
    await rt.pin_node("w0", Phase.DECODE)
    assert rt.registry.get("w0").phase is Phase.DECODE
    with pytest.raises(Conflict):
        await rt.switch("w0", Phase.PREFILL, reason="x", who="y")
    await rt.pin_split(1)
    assert rt.split() == (1, 2)
    snap = await rt.snapshot()
    assert snap.split_pin == 1 and [n.pinned_phase for n in snap.nodes] == ["decode", None, None]
    with pytest.raises(InvalidRequest):
        await rt.pin_split(9)
    with pytest.raises(InvalidRequest):
        await rt.set_mode("chaos")
    await rt.set_mode("auto")
    assert (await rt.planner_state()).mode is PlannerMode.AUTO


async def test_a_drain_another_replica_drives_is_the_workers_to_report():
    rt, workers, _ = await runtime([Phase.DECODE, Phase.DECODE])
    w0, w1 = workers["http://w0"], workers["http://w1"]
    w0.draining_to = Phase.PREFILL  # an order of another replica (a leader before this one) under way
    await rt.registry.poll_once()
    assert rt.registry.get("w0").draining_to is Phase.PREFILL
    w0.phase, w0.draining_to = Phase.PREFILL, None  # done: the next heartbeat says so
    await rt.registry.poll_once()
    node = rt.registry.get("w0")
    assert node.phase is Phase.PREFILL and not node.draining and rt.split() == (1, 1)
    rt.registry.mark_draining("w1", Phase.PREFILL)  # this replica's own switch, not started on the worker yet
    await rt.registry.poll_once()
    assert rt.registry.get("w1").draining_to is Phase.PREFILL and w1.draining_to is None  # its mark wins


async def test_a_split_pin_met_while_a_node_drains_is_realised_once_it_settles():
    rt, workers, _ = await runtime([Phase.PREFILL, Phase.DECODE, Phase.DECODE, Phase.DECODE])
    w1 = workers["http://w1"]
    w1.draining_to = Phase.PREFILL  # a switch this replica does not drive: its predecessor's
    await rt.registry.poll_once()
    assert await rt.restore_pins(3, {}, who="leader") == []  # w1 counted as decode would move w2 and w3
    assert await rt.realise_due_pins() == [] and rt.split() == (1, 3)  # still draining
    w1.phase, w1.draining_to = Phase.PREFILL, None
    await rt.registry.poll_once()
    out = await rt.realise_due_pins()
    assert [(o.node_id, o.outcome) for o in out] == [("w2", "ok")] and rt.split() == (3, 1)
    rt.registry.finish_switch("w2", Phase.DECODE)  # realised, then changed by hand: not enforced again
    assert await rt.realise_due_pins() == [] and rt.split() == (2, 2)


async def test_pins_a_failed_switch_left_are_retried_after_a_pause():
    now = [1000.0]
    rt, workers, _ = await runtime([Phase.PREFILL, Phase.DECODE], clock=lambda: now[0])
    workers["http://w1"].dead = True  # refuses the switch; the registry has not noticed yet
    await rt.pin_node("w1", Phase.PREFILL)
    assert rt.registry.get("w1").phase is Phase.DECODE and not rt.pins_realised()
    workers["http://w1"].dead = False
    assert await rt.realise_due_pins() == []
    now[0] += PIN_RETRY_S - 0.5
    assert await rt.realise_due_pins() == []  # not yet
    now[0] += 0.5
    assert [o.outcome for o in await rt.realise_due_pins()] == ["ok"]
    assert rt.split() == (2, 0) and rt.pins_realised()


async def test_a_pinned_node_back_from_a_restart_in_the_other_phase_is_switched_back():
    rt, workers, _ = await runtime([Phase.PREFILL, Phase.DECODE, Phase.DECODE])
    await rt.pin_node("w1", Phase.PREFILL)
    assert rt.split() == (2, 1) and await rt.realise_due_pins() == []  # realised: nothing due
    w1 = workers["http://w1"]
    w1.dead = True
    for _ in range(3):
        await rt.registry.poll_once()
    assert not rt.registry.get("w1").healthy
    assert await rt.realise_due_pins() == []  # gone: nothing to switch
    w1.dead, w1.phase = False, Phase.DECODE  # restarted in the phase it was launched with
    await rt.registry.poll_once()
    assert rt.registry.get("w1").phase is Phase.DECODE
    out = await rt.realise_due_pins()
    assert [(o.node_id, o.to_phase, o.outcome) for o in out] == [("w1", Phase.PREFILL, "ok")]
    assert rt.split() == (2, 1) and await rt.realise_due_pins() == []


async def test_a_worker_joining_without_pins_switches_nothing():
    rt, workers, _ = await runtime([Phase.PREFILL, Phase.DECODE])
    assert await rt.realise_due_pins() == []
    workers["http://w2"] = FakeWorker("w2", phase=Phase.DECODE)
    await rt.registry.add("http://w2")
    assert await rt.realise_due_pins() == [] and rt.split() == (1, 2)


async def test_split_history_samples():
    rt, _, _ = await runtime([Phase.PREFILL, Phase.DECODE])
    rt.sample()
    rt.sample()
    hist = await rt.split_history(60)
    assert len(hist) == 2 and hist[0].prefill == 1 and hist[0].decode == 1


async def test_registry_publishes_saved_blocks_and_buffers_iterations():
    rt, workers, _ = await runtime([Phase.DECODE])
    w = workers["http://w0"]
    from gateway.serving.jobs import Job
    from gateway.serving.orchestrator import Orchestrator
    from workers.protocol import SamplingOptions

    orch = Orchestrator(rt.registry, InProcessWorkerClient(workers), rt.directory)
    async for _ in orch.stream(Job("r", list(range(20)), SamplingOptions(max_tokens=2), "s")):
        pass
    w._save_blocks(list(range(100, 164)), "s")  # 4 blocks of 16, reported by the next heartbeat
    await rt.registry.poll_once()
    assert (await rt.directory.stats()).blocks == 4
    its = rt.registry.drain_iterations()
    assert len(its) == 1 and its[0].node_id == "w0" and rt.registry.drain_iterations() == []
    w.kill()
    for _ in range(3):
        await rt.registry.poll_once()
    assert not rt.registry.get("w0").healthy and (await rt.directory.stats()).blocks == 0
