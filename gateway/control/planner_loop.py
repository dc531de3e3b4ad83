"""The planner's live loop: a thin shell around a pure `planner.types.Planner`.

Each tick reads as decide -> one I/O step -> apply:

1. gather: iteration records the registry collected since the last tick
   (busy steps given their wall time and runs of decode steps averaged,
   `planner.cadence`: what a node can serve follows its step cadence, not
   the forward pass alone), finished-
   request samples from the OpenAI service, the cluster view (nodes, phases,
   pins, mode, the engines' own limits);
2. decide: `planner.decide(view)` (pure);
3. apply: record the decision (admin API state; the event store except in
   mode `manual`, where the planner only predicts for the operator's eyes
   and decides nothing worth keeping), and in mode `auto` carry out its
   switches through the cluster runtime, which records each switch.

The planner never sees HTTP or the database; a failing switch is recorded
and the next tick decides again from what actually happened.

With several replicas only the leader (`runtime.leads()`) decides and acts;
a follower still feeds its planner the iteration records and the cluster's
workload samples each tick, so it takes over with warm models, but records
no decision of its own. The lease is checked once per tick; an order that a
worker refuses as stale (`fenced`: a newer leader exists) ends the tick's
remaining orders.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import TYPE_CHECKING

from gateway.control.workload_feed import WorkloadFeed
from planner.cadence import StepCadence, coalesce_decode_steps
from planner.decision import move_actions, protected_ids
from planner.types import SLO, ClusterView, Decision, Planner, PlannerMode, SwitchAction

if TYPE_CHECKING:
    from gateway.control.runtime import ClusterRuntime

log = logging.getLogger(__name__)

DecisionSink = Callable[[Decision, str], None]


class PlannerLoop:
    """`tick(runtime)` is the `planner_tick` the gateway's cluster loop calls."""

    def __init__(
        self,
        planner: Planner,
        *,
        workload: WorkloadFeed,
        slo: SLO = SLO(),
        sink: DecisionSink | None = None,
        kv_capacity_tokens: int = 0,  # per node, for workers that do not report theirs
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.planner = planner
        self.workload = workload  # the OpenAI service adds a RequestSample per finished request
        self.slo = slo
        self.sink = sink
        self.kv_capacity_tokens = kv_capacity_tokens
        self.clock = clock
        self.cadence = StepCadence()
        self.last_switch_t: float | None = None

    def view(self, runtime: ClusterRuntime) -> ClusterView:
        nodes = runtime.node_states(self.kv_capacity_tokens)
        pin = runtime.pin()
        arrived, rejected = self.workload.counts()
        return ClusterView(
            now=self.clock(),
            nodes=nodes,
            mode=PlannerMode(runtime.mode.value),
            pin=pin,
            slo=self.slo,
            last_switch_t=self.last_switch_t,
            requests_arrived=arrived,
            requests_rejected=rejected,
        )

    async def tick(self, runtime: ClusterRuntime) -> None:
        records = coalesce_decode_steps(self.cadence.apply(runtime.registry.drain_iterations()))
        self.planner.observe_iterations(records)
        self.planner.observe_requests(self.workload.drain())
        if not runtime.leads():
            return
        view = self.view(runtime)
        if not view.nodes:
            return
        decision = self.planner.decide(view)
        # a span (when it moves or holds requests); the switches ordered below are its children
        with runtime.tracing.decision(decision, held_moves(decision, view)):
            await self._apply(runtime, decision, view)

    async def _apply(self, runtime: ClusterRuntime, decision: Decision, view: ClusterView) -> None:
        runtime.planner_name = self.planner.name
        runtime.record_decision(decision)
        if view.mode is not PlannerMode.MANUAL:
            self._persist(decision, view.mode.value)
        if not (decision.acted and view.mode is PlannerMode.AUTO):
            return
        for action in decision.actions:
            try:
                outcome = await runtime.switch(
                    action.node_id,
                    action.to_phase,
                    reason=f"planner: {decision.reason}",
                    who=f"planner:{self.planner.name}",
                )
                self.last_switch_t = self.clock()
            except Exception as exc:  # noqa: BLE001 - one failed switch must not stop the loop
                log.warning("planner switch of %s failed: %s", action.node_id, exc)
                continue
            if outcome.outcome == "fenced":
                break

    def _persist(self, decision: Decision, mode: str) -> None:
        """Every auto/advisory decision, acted on or not, goes to the event store (buffered)."""
        if self.sink is not None:
            self.sink(decision, mode)


def held_moves(decision: Decision, view: ClusterView) -> tuple[SwitchAction, ...]:
    """The switches a decision that chose another split but did not act would
    have ordered (its planner returns none then), by the planners' own rule
    (`planner.decision.move_actions` over the unprotected nodes): what its
    trace span links as the requests it holds. Empty when it acted or keeps
    the split."""
    if decision.acted or decision.chosen_split == decision.current_split:
        return ()
    protected = protected_ids(view.nodes, view.pin)
    return move_actions(view.nodes, decision.current_split[0], decision.chosen_split[0], protected)
