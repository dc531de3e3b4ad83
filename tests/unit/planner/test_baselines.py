"""Baselines (static, schedule, Dynamo-like) and the registry."""

from __future__ import annotations

import pytest

from core import Phase
from planner.baselines import DynamoConfig, DynamoPlanner, ScheduledPlanner, StaticPlanner
from planner.evolving import EvolvingPlanner
from planner.registry import PLANNERS, make_planner
from planner.types import ClusterView, NodeState, PlannerMode


def _view(now: float, prefill: int, n: int, queue: int, kv: float, mode: PlannerMode = PlannerMode.AUTO) -> ClusterView:
    nodes = tuple(
        NodeState(
            f"n{i}",
            Phase.PREFILL if i < prefill else Phase.DECODE,
            queue=queue if i < prefill else 0,
            kv_usage=0.0 if i < prefill else kv,
            running=i,
        )
        for i in range(n)
    )
    return ClusterView(now=now, nodes=nodes, mode=mode)


def test_static_never_switches() -> None:
    planner = StaticPlanner(3)
    d = planner.decide(_view(10.0, 3, 8, queue=100, kv=1.0))
    assert not d.acted and d.actions == () and d.chosen_split == d.current_split == (3, 5)


def test_dynamo_step_behaviour() -> None:
    cfg = DynamoConfig(adjustment_interval_s=10.0, relaunch_delay_s=100.0)
    planner = DynamoPlanner(cfg)
    assert planner.switch_kind == "relaunch" and planner.relaunch_delay_s == 100.0
    # Metrics are averaged over the interval; nothing happens before it ends.
    assert planner.decide(_view(0.0, 2, 8, queue=3, kv=0.7)).reason == "collecting metrics"
    assert not planner.decide(_view(5.0, 2, 8, queue=3, kv=0.7)).acted
    # Queue per prefill worker 3 > 0.5 with KV in band: +1 prefill, by relaunching one decode node.
    up = planner.decide(_view(10.0, 2, 8, queue=3, kv=0.7))
    assert up.acted and up.chosen_split == (3, 5) and "relaunch" in up.reason
    assert [(a.node_id, a.to_phase) for a in up.actions] == [("n2", Phase.PREFILL)]  # least loaded decode
    # Blocked while the relaunch is in progress, however large the queue.
    for t in (20.0, 60.0, 109.0):
        d = planner.decide(_view(t, 3, 8, queue=50, kv=0.7))
        assert not d.acted and d.reason.startswith("blocked")
    # After the block a fresh interval of metrics is needed.
    assert not planner.decide(_view(110.0, 3, 8, queue=0, kv=0.7)).acted
    # Queue 0 < 0.2: −1 prefill (relaunched as decode).
    down = planner.decide(_view(120.0, 3, 8, queue=0, kv=0.7))
    assert down.acted and down.chosen_split == (2, 6)
    assert down.actions[0].to_phase == Phase.DECODE


def test_dynamo_kv_pressure_and_ties() -> None:
    planner = DynamoPlanner(DynamoConfig(adjustment_interval_s=10.0))
    planner.decide(_view(0.0, 3, 8, queue=0, kv=0.95))
    d = planner.decide(_view(10.0, 3, 8, queue=0, kv=0.95))
    assert d.acted and d.chosen_split == (2, 6)
    both = DynamoPlanner(DynamoConfig(adjustment_interval_s=10.0))
    both.decide(_view(0.0, 3, 8, queue=5, kv=0.95))
    d = both.decide(_view(10.0, 3, 8, queue=5, kv=0.95))
    assert not d.acted and d.inputs["prefill_demand"] == 1 and d.inputs["decode_demand"] == 1


def test_dynamo_respects_minimum_and_modes() -> None:
    planner = DynamoPlanner(DynamoConfig(adjustment_interval_s=10.0))
    planner.decide(_view(0.0, 1, 4, queue=0, kv=0.7))
    assert not planner.decide(_view(10.0, 1, 4, queue=0, kv=0.7)).acted  # keeps 1 prefill worker
    advisory = DynamoPlanner(DynamoConfig(adjustment_interval_s=10.0))
    advisory.decide(_view(0.0, 2, 8, queue=3, kv=0.7, mode=PlannerMode.ADVISORY))
    d = advisory.decide(_view(10.0, 2, 8, queue=3, kv=0.7, mode=PlannerMode.ADVISORY))
    assert not d.acted and d.actions == () and d.chosen_split == (3, 5) and d.reason.startswith("advisory")
    # No relaunch happened, so nothing is blocked.
    assert not advisory.decide(_view(11.0, 2, 8, queue=3, kv=0.7)).reason.startswith("blocked")


def test_dynamo_config_validation() -> None:
    with pytest.raises(ValueError, match="prefill_queue_scale_down < prefill_queue_scale_up"):
        DynamoConfig(prefill_queue_scale_up=0.1, prefill_queue_scale_down=0.2)
    with pytest.raises(ValueError, match="decode_kv_scale_up <= 1"):
        DynamoConfig(decode_kv_scale_up=1.5)


def test_registry() -> None:
    assert set(PLANNERS) == {"evolving", "static", "dynamo", "schedule"}
    evolving = make_planner("evolving", cooldown_s=5.0)
    assert isinstance(evolving, EvolvingPlanner) and evolving.config.cooldown_s == 5.0
    assert evolving.switch_kind == "inplace"
    assert make_planner("static", prefill_nodes=2).name == "static"
    dynamo = make_planner("dynamo", relaunch_delay_s=10.0)
    assert isinstance(dynamo, DynamoPlanner) and dynamo.relaunch_delay_s == 10.0
    assert make_planner("schedule", schedule=[(0.0, 2)]).name == "schedule"
    with pytest.raises(ValueError, match="known: dynamo, evolving, schedule, static"):
        make_planner("nope")


def test_schedule_moves_the_split_when_its_time_comes_and_only_then() -> None:
    planner = ScheduledPlanner([(3600.0, 5), (0.0, 2)])  # unsorted on purpose
    assert planner.target(0.0) == 2 and planner.target(3599.9) == 2 and planner.target(3600.0) == 5
    hold = planner.decide(_view(100.0, 2, 9, queue=0, kv=0.0))
    assert hold.actions == () and hold.chosen_split == (2, 7)
    move = planner.decide(_view(3600.0, 2, 9, queue=0, kv=0.0))
    assert move.acted and len(move.actions) == 3 and move.chosen_split == (5, 4)
    assert all(a.to_phase == Phase.PREFILL for a in move.actions)
    advisory = planner.decide(_view(3600.0, 2, 9, queue=0, kv=0.0, mode=PlannerMode.ADVISORY))
    assert not advisory.acted and advisory.actions == () and advisory.chosen_split == (5, 4)
    with pytest.raises(ValueError, match="schedule needs at least one"):
        ScheduledPlanner([])
