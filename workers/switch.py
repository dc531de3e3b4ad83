"""The worker's switch procedure, beside its phase table (`workers.phase`).

`change_phase(worker, node_id, request)` reads as decide -> drain/migrate ->
apply:

1. decide (`plan_switch`, pure): nothing to do if the node already is in
   the asked phase and not draining; otherwise the phase machine's BEGIN
   event, which refuses an impossible transition (`InvalidTransition`).
   From then on the node takes work of its target phase only.
2. drain and migrate (I/O on the engine): in-flight calls of the role being
   left get `deadline_s` to finish; what outlives it is migrated (decodes,
   `migrate=True`: their KV is saved and their streams end "migrated", so
   the gateway resumes them elsewhere) or aborted.
3. apply: the DRAINED event flips the phase; the timings are returned.
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass

from core import Phase, Role
from workers import phase as ph
from workers.engine import WorkerEngine
from workers.fence import TermFence
from workers.protocol import HostStoreStats, PhaseChangeRequest, PhaseChangeResult

# After the deadline's migrations/aborts, how long the last calls may take to end.
SETTLE_S = 30.0


class WorkerState:
    """Phase + engine: the only mutable state of the worker's server."""

    def __init__(self, engine: WorkerEngine, initial: Phase) -> None:
        self.engine = engine
        self.state = ph.from_phase(initial)
        self.switch_lock = asyncio.Lock()
        self.fence = TermFence()  # orders of a superseded leadership term are refused
        self.store_stats: HostStoreStats | None = None  # host store layout, once known

    @property
    def phase(self) -> Phase:
        return ph.stable_phase(self.state)

    @property
    def draining_to(self) -> Phase | None:
        return ph.stable_phase(self.state) if ph.leaving_phase(self.state) else None


@dataclass(frozen=True)
class SwitchPlan:
    begin: ph.PhaseEvent
    leaving: Role  # the role of the calls that must drain


def plan_switch(state: ph.PhaseState, to: Phase) -> SwitchPlan | None:
    """None when there is nothing to do; raises `InvalidTransition` when the
    machine refuses (e.g. a switch back while draining)."""
    if ph.stable_phase(state) is to and ph.leaving_phase(state) is None:
        return None
    begin = ph.begin_event(to)
    ph.next_state(state, begin)  # raises InvalidTransition
    current = ph.leaving_phase(state) or ph.stable_phase(state)
    return SwitchPlan(begin=begin, leaving=Role(current.value))


async def change_phase(worker: WorkerState, node_id: str, req: PhaseChangeRequest) -> PhaseChangeResult:
    """Drain the phase being left, migrate what outlives the deadline, flip."""
    eng, start, frm = worker.engine, time.monotonic(), worker.phase
    plan = plan_switch(worker.state, req.phase)
    if plan is None:
        return PhaseChangeResult(node_id=node_id, from_phase=frm, to_phase=frm, drain_s=0, migrate_s=0, total_s=0)
    worker.state = ph.next_state(worker.state, plan.begin)
    drained = await eng.wait_idle(plan.leaving, start + req.deadline_s)
    drain_s = time.monotonic() - start
    migrated: list[str] = []
    if not drained:
        if plan.leaving is Role.DECODE and req.migrate:
            migrated = await eng.migrate([])
        else:
            for rid, r in list(eng.inflight.items()):
                if r.role is plan.leaving:
                    await eng.abort(rid)
        await eng.wait_idle(plan.leaving, time.monotonic() + SETTLE_S)
    migrate_s = time.monotonic() - start - drain_s
    worker.state = ph.next_state(worker.state, ph.PhaseEvent.DRAINED)
    return PhaseChangeResult(
        node_id=node_id,
        from_phase=frm,
        to_phase=req.phase,
        drain_s=drain_s,
        migrate_s=migrate_s,
        total_s=time.monotonic() - start,
        migrated=migrated,
    )
