"""The planner's live loop over the real cluster runtime (fake workers): what
it stores per mode, what it acts on, and the predictions the admin API shows."""

from __future__ import annotations

from dataclasses import dataclass, field

from core import Phase
from gateway.control.phase_switch import PhaseSwitcher
from gateway.control.planner_loop import PlannerLoop
from gateway.control.registry import WorkerRegistry
from gateway.control.runtime import ClusterRuntime
from gateway.control.workload_feed import LocalWorkloadFeed
from gateway.kv.directory import GatewayDirectory
from kvpool.directory import MemoryDirectory
from planner.types import (
    ClusterView,
    Decision,
    IterationRecord,
    PlannerMode,
    RequestSample,
    SplitPrediction,
    SwitchAction,
)
from testing.fake_worker import FakeWorker, InProcessWorkerClient


def _prediction(prefill: int) -> SplitPrediction:
    return SplitPrediction(prefill, 2 - prefill, 1.0, 0.8, 1.2, 100.0, 0.1, 0.02, True, 0.5)


@dataclass
class ScriptedPlanner:
    """A fake `Planner`: returns the scripted decisions in order (acted only in auto)."""

    script: list[tuple[str, bool, tuple[SplitPrediction, ...]]]  # reason, wants a move, predictions
    name: str = "scripted"
    views: list[ClusterView] = field(default_factory=list)

    def observe_iterations(self, records: list[IterationRecord]) -> None:
        pass

    def observe_requests(self, samples: list[RequestSample]) -> None:
        pass

    def decide(self, view: ClusterView) -> Decision:
        self.views.append(view)
        reason, move, preds = self.script[len(self.views) - 1]
        acted = move and view.mode is PlannerMode.AUTO
        actions = (SwitchAction("w0", Phase.DECODE),) if acted else ()
        return Decision(view.now, self.name, (1, 1), (0, 2) if move else (1, 1), actions, acted, reason, 0.9, preds)


async def _runtime() -> ClusterRuntime:
    workers = {"http://w0": FakeWorker("w0", phase=Phase.PREFILL), "http://w1": FakeWorker("w1", phase=Phase.DECODE)}
    client = InProcessWorkerClient(workers)
    directory = GatewayDirectory(MemoryDirectory(), block_size=16)
    registry = WorkerRegistry(client, directory)
    for url in workers:
        await registry.add(url)
    return ClusterRuntime(registry, PhaseSwitcher(registry, client), directory)


async def test_manual_mode_stores_no_decision_but_keeps_the_prediction_for_the_page() -> None:
    rt = await _runtime()
    rt.mode = PlannerMode.MANUAL
    stored: list[tuple[Decision, str]] = []
    planner = ScriptedPlanner([("manual: would move", True, (_prediction(0), _prediction(1)))])
    loop = PlannerLoop(
        planner, workload=LocalWorkloadFeed(), sink=lambda d, m: stored.append((d, m)), clock=lambda: 50.0
    )
    await loop.tick(rt)
    assert stored == []  # manual: nothing stored, nothing switched
    assert rt.split() == (1, 1)
    state = await rt.planner_state()
    assert state.last_decision is not None and state.last_decision.reason == "manual: would move"
    assert [p.prefill_nodes for p in state.predictions] == [0, 1] and state.predictions_t == 50.0


async def test_advisory_stores_every_decision_and_auto_acts() -> None:
    rt = await _runtime()
    rt.mode = PlannerMode.ADVISORY
    stored: list[tuple[str, str]] = []
    now = [10.0]
    script: list[tuple[str, bool, tuple[SplitPrediction, ...]]] = [
        ("advisory: would move", True, (_prediction(1),)),
        ("gain", True, (_prediction(0),)),
    ]
    loop = PlannerLoop(
        ScriptedPlanner(script),
        workload=LocalWorkloadFeed(),
        sink=lambda d, m: stored.append((d.reason, m)),
        clock=lambda: now[0],
    )
    await loop.tick(rt)
    assert rt.split() == (1, 1)
    rt.mode = PlannerMode.AUTO
    now[0] = 11.0
    await loop.tick(rt)
    assert stored == [("advisory: would move", "advisory"), ("gain", "auto")]
    assert rt.split() == (0, 2) and loop.last_switch_t == 11.0


async def test_predictions_outlive_decisions_without_any() -> None:
    rt = await _runtime()
    rt.mode = PlannerMode.ADVISORY
    now = [100.0]
    script = [("hold", False, (_prediction(0), _prediction(1))), ("hold: insufficient data", False, ())]
    loop = PlannerLoop(ScriptedPlanner(script), workload=LocalWorkloadFeed(), clock=lambda: now[0])
    await loop.tick(rt)
    now[0] = 160.0
    await loop.tick(rt)
    state = await rt.planner_state()
    assert state.last_decision is not None and state.last_decision.t == 160.0
    assert state.predictions_t == 100.0 and len(state.predictions) == 2
    rt.seed_predictions((_prediction(1),), 90.0)  # an older stored one never replaces a newer live one
    assert (await rt.planner_state()).predictions_t == 100.0


async def test_the_view_carries_the_offered_counts() -> None:
    rt = await _runtime()
    rt.mode = PlannerMode.ADVISORY
    feed = LocalWorkloadFeed()
    for _ in range(2):
        feed.count_arrival()
    feed.count_rejection()
    planner = ScriptedPlanner([("hold", False, ())])
    await PlannerLoop(planner, workload=feed, clock=lambda: 5.0).tick(rt)
    view = planner.views[0]
    assert (view.requests_arrived, view.requests_rejected, view.now) == (2, 1, 5.0)
