"""The switch procedure: the pure `plan_switch`, and `change_phase` over a fake engine."""

from __future__ import annotations

from dataclasses import dataclass, field
from types import SimpleNamespace
from typing import Any

import pytest

from core import Phase, Role
from workers.phase import InvalidTransition, PhaseEvent, PhaseState
from workers.protocol import PhaseChangeRequest
from workers.switch import SwitchPlan, WorkerState, change_phase, plan_switch


@pytest.mark.parametrize(
    ("state", "to", "plan"),
    [
        (PhaseState.PREFILL, Phase.PREFILL, None),
        (PhaseState.DECODE, Phase.DECODE, None),
        (PhaseState.PREFILL, Phase.DECODE, SwitchPlan(PhaseEvent.BEGIN_TO_DECODE, Role.PREFILL)),
        (PhaseState.DECODE, Phase.PREFILL, SwitchPlan(PhaseEvent.BEGIN_TO_PREFILL, Role.DECODE)),
    ],
)
def test_plan_switch(state: PhaseState, to: Phase, plan: SwitchPlan | None) -> None:
    assert plan_switch(state, to) == plan


@pytest.mark.parametrize(
    ("state", "to"),
    [
        (PhaseState.DRAINING_TO_DECODE, Phase.PREFILL),
        (PhaseState.DRAINING_TO_DECODE, Phase.DECODE),
        (PhaseState.DRAINING_TO_PREFILL, Phase.PREFILL),
        (PhaseState.DRAINING_TO_PREFILL, Phase.DECODE),
    ],
)
def test_plan_switch_refuses_while_draining(state: PhaseState, to: Phase) -> None:
    with pytest.raises(InvalidTransition):
        plan_switch(state, to)


@dataclass
class FakeEngine:
    """The four engine members `change_phase` uses; `idle` scripts wait_idle's answers."""

    idle: list[bool] = field(default_factory=list)
    inflight: dict[str, Any] = field(default_factory=dict)
    calls: list[tuple[Any, ...]] = field(default_factory=list)

    async def wait_idle(self, role: Role, deadline: float) -> bool:
        self.calls.append(("wait_idle", role))
        return self.idle.pop(0)

    async def migrate(self, request_ids: list[str]) -> list[str]:
        self.calls.append(("migrate", request_ids))
        return sorted(rid for rid, r in self.inflight.items() if r.role is Role.DECODE)

    async def abort(self, request_id: str) -> bool:
        self.calls.append(("abort", request_id))
        return True


def _calls(**roles: Role) -> dict[str, Any]:
    return {rid: SimpleNamespace(role=role) for rid, role in roles.items()}


def _worker(eng: FakeEngine, phase: Phase) -> WorkerState:
    return WorkerState(eng, phase)  # type: ignore[arg-type]  # a duck-typed fake of WorkerEngine


def _untimed(result: Any) -> dict[str, Any]:
    body = result.model_dump()
    assert body.pop("drain_s") >= 0 and body.pop("migrate_s") >= 0 and body.pop("total_s") >= 0
    return body


async def test_change_to_the_current_phase_is_a_noop() -> None:
    eng = FakeEngine()
    worker = _worker(eng, Phase.PREFILL)
    res = await change_phase(worker, "n0", PhaseChangeRequest(phase=Phase.PREFILL))
    assert res.model_dump() == {
        "node_id": "n0",
        "from_phase": Phase.PREFILL,
        "to_phase": Phase.PREFILL,
        "drain_s": 0,
        "migrate_s": 0,
        "total_s": 0,
        "migrated": [],
    }
    assert eng.calls == [] and worker.state is PhaseState.PREFILL


async def test_drained_in_time_flips_without_migrating() -> None:
    eng = FakeEngine(idle=[True])
    worker = _worker(eng, Phase.DECODE)
    res = await change_phase(worker, "n1", PhaseChangeRequest(phase=Phase.PREFILL))
    assert _untimed(res) == {"node_id": "n1", "from_phase": Phase.DECODE, "to_phase": Phase.PREFILL, "migrated": []}
    assert eng.calls == [("wait_idle", Role.DECODE)]
    assert worker.state is PhaseState.PREFILL and worker.draining_to is None


async def test_decodes_past_the_deadline_are_migrated() -> None:
    eng = FakeEngine(idle=[False, True], inflight=_calls(b=Role.DECODE, a=Role.DECODE, p=Role.PREFILL))
    worker = _worker(eng, Phase.DECODE)
    res = await change_phase(worker, "n1", PhaseChangeRequest(phase=Phase.PREFILL, deadline_s=0.0))
    assert _untimed(res) == {
        "node_id": "n1",
        "from_phase": Phase.DECODE,
        "to_phase": Phase.PREFILL,
        "migrated": ["a", "b"],
    }
    assert eng.calls == [("wait_idle", Role.DECODE), ("migrate", []), ("wait_idle", Role.DECODE)]
    assert worker.state is PhaseState.PREFILL


async def test_decodes_past_the_deadline_are_aborted_without_migration() -> None:
    eng = FakeEngine(idle=[False, True], inflight=_calls(a=Role.DECODE, p=Role.PREFILL, b=Role.DECODE))
    worker = _worker(eng, Phase.DECODE)
    res = await change_phase(worker, "n1", PhaseChangeRequest(phase=Phase.PREFILL, deadline_s=0.0, migrate=False))
    assert _untimed(res)["migrated"] == []
    assert eng.calls == [("wait_idle", Role.DECODE), ("abort", "a"), ("abort", "b"), ("wait_idle", Role.DECODE)]
    assert worker.state is PhaseState.PREFILL


async def test_prefills_past_the_deadline_are_aborted_even_with_migrate() -> None:
    eng = FakeEngine(idle=[False, True], inflight=_calls(p=Role.PREFILL, d=Role.DECODE))
    worker = _worker(eng, Phase.PREFILL)
    res = await change_phase(worker, "n0", PhaseChangeRequest(phase=Phase.DECODE, deadline_s=0.0))
    assert _untimed(res) == {"node_id": "n0", "from_phase": Phase.PREFILL, "to_phase": Phase.DECODE, "migrated": []}
    assert eng.calls == [("wait_idle", Role.PREFILL), ("abort", "p"), ("wait_idle", Role.PREFILL)]
    assert worker.state is PhaseState.DECODE


async def test_a_switch_while_draining_is_refused_before_touching_the_engine() -> None:
    eng = FakeEngine()
    worker = _worker(eng, Phase.PREFILL)
    worker.state = PhaseState.DRAINING_TO_DECODE
    with pytest.raises(InvalidTransition):
        await change_phase(worker, "n0", PhaseChangeRequest(phase=Phase.PREFILL))
    assert eng.calls == [] and worker.state is PhaseState.DRAINING_TO_DECODE
