"""The planner's live loop: a thin shell around a pure `planner.types.Planner`.

Each tick reads as decide -> one I/O step -> apply:

1. gather: iteration records the registry collected since the last tick,
   finished-request samples from the OpenAI service, the cluster view
   (nodes, phases, pins, mode);
2. decide: `planner.decide(view)` (pure);
3. apply: record the decision (admin API state, event store), and in mode
   `auto` carry out its switches through the cluster runtime, which
   records each switch.

The planner never sees HTTP or the database; a failing switch is recorded
and the next tick decides again from what actually happened.
"""

from __future__ import annotations

import dataclasses
import logging
import time
from typing import Any, Callable

from planner.types import (
    SLO, ClusterView, Decision, NodePhase, NodeState, Pin, Planner, PlannerMode, RequestSample,
)

log = logging.getLogger(__name__)

DecisionSink = Callable[[Decision, str], None]


def decision_dict(d: Decision) -> dict[str, Any]:
    return {"t": d.t, "planner": d.planner, "current_split": list(d.current_split),
            "chosen_split": list(d.chosen_split), "acted": d.acted, "reason": d.reason,
            "confidence": d.confidence, "actions": [{"node_id": a.node_id, "to_phase": a.to_phase.value}
                                                    for a in d.actions]}


def prediction_dicts(d: Decision) -> list[dict[str, Any]]:
    return [dataclasses.asdict(p) for p in d.predictions]


class PlannerLoop:
    """`tick(runtime)` is the `planner_tick` the gateway's cluster loop calls."""

    def __init__(self, planner: Planner, *, samples, slo: SLO = SLO(), sink: DecisionSink | None = None,
                 kv_capacity_tokens: int = 0, clock: Callable[[], float] = time.time) -> None:
        self.planner = planner
        self.samples = samples  # a deque the OpenAI service appends RequestSamples to
        self.slo = slo
        self.sink = sink
        self.kv_capacity_tokens = kv_capacity_tokens
        self.clock = clock
        self.last_switch_t: float | None = None

    def _drain_samples(self) -> list[RequestSample]:
        out = []
        while self.samples:
            out.append(self.samples.popleft())
        return out

    def view(self, runtime) -> ClusterView:
        nodes = tuple(
            NodeState(node_id=n.node_id, phase=NodePhase(n.phase.value), draining=n.draining_to is not None,
                      pinned=n.node_id in runtime.node_pins, queue=n.num_waiting,
                      running=max(n.num_running, n.inflight), kv_usage=n.kv_usage,
                      kv_capacity_tokens=self.kv_capacity_tokens)
            for n in runtime.registry.nodes() if n.healthy)
        pin = None
        if runtime.split_pin is not None or runtime.node_pins:
            pin = Pin(prefill_nodes=runtime.split_pin,
                      node_phases={k: NodePhase(v) for k, v in runtime.node_pins.items()})
        return ClusterView(now=self.clock(), nodes=nodes, mode=PlannerMode(runtime.mode.value), pin=pin,
                           slo=self.slo, last_switch_t=self.last_switch_t)

    async def tick(self, runtime) -> None:
        self.planner.observe_iterations(runtime.registry.drain_iterations())
        self.planner.observe_requests(self._drain_samples())
        view = self.view(runtime)
        if not view.nodes:
            return
        decision = self.planner.decide(view)
        runtime.planner_name = self.planner.name
        runtime.record_decision(decision_dict(decision), prediction_dicts(decision))
        self._persist(decision, view.mode.value)
        if not (decision.acted and view.mode is PlannerMode.AUTO):
            return
        for action in decision.actions:
            try:
                await runtime.switch(action.node_id, action.to_phase.value, reason=f"planner: {decision.reason}",
                                     who=f"planner:{self.planner.name}")
                self.last_switch_t = self.clock()
            except Exception as exc:  # noqa: BLE001 - one failed switch must not stop the loop
                log.warning("planner switch of %s failed: %s", action.node_id, exc)

    def _persist(self, decision: Decision, mode: str) -> None:
        """Every decision, acted on or not, goes to the event store (buffered)."""
        if self.sink is not None:
            self.sink(decision, mode)
