"""Cluster runtime: the live implementation of `gateway.control.ports`'s ports.

`ClusterRuntime` implements `ClusterControl` (snapshot, mode, pins, switch)
and `ClusterHistory` (split samples in a ring buffer) over the registry, the
switch orchestrator and the KV directory. The admin API depends only on the
ports.

Planner seam: `ClusterRuntime(planner_tick=...)` takes a coroutine function
`planner_tick(runtime) -> None` called every `run()` interval. It reads
`runtime.view()` / `registry.drain_iterations()`, decides, calls
`runtime.record_decision(...)`, and, in mode "auto", `runtime.switch(...)`.
Pins always win: `switch` refuses a switch that contradicts a node pin, and
`enforce_pins` realises pins with switches (the planner's rule,
`planner.decision.pin_actions`).

Leadership (`leadership`, a `ports.Leadership`; None: a lone gateway that
always leads): only the leader realises pins and runs the planner's
decisions; a follower keeps the pins and mode it is told about (admin API,
overrides bus) and shows the leader's latest decision (`leader_decision`,
read from the store) instead of one of its own. `on_elected(term)` is the
leadership hook: announce the term to every worker, realise the pins, and
run the planner tick at once.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import logging
import time
from collections.abc import Awaitable, Callable

from core import Phase
from gateway.control.phase_switch import PhaseSwitcher
from gateway.control.ports import ClusterSnapshot, Leadership, NodeSnapshot, PlannerState, SplitSample
from gateway.control.registry import WorkerRegistry
from gateway.http.errors import Conflict, GatewayError, InvalidRequest
from gateway.kv.directory import Directory
from gateway.store.records import SwitchOutcome
from gateway.telemetry import Tracing
from planner.decision import pin_actions
from planner.types import Decision, NodeState, Pin, PlannerMode, SplitPrediction, SwitchAction
from workers.protocol import EngineState

log = logging.getLogger(__name__)

PIN_RETRY_S = 5.0  # between attempts at pins a failed switch left unrealised
PlannerTick = Callable[["ClusterRuntime"], Awaitable[None]]
DecisionSource = Callable[[], Awaitable[Decision | None]]


class ClusterRuntime:
    def __init__(
        self,
        registry: WorkerRegistry,
        switcher: PhaseSwitcher,
        directory: Directory,
        *,
        mode: PlannerMode = PlannerMode.ADVISORY,
        planner_name: str = "none",
        planner_tick: PlannerTick | None = None,
        history_len: int = 7200,
        clock: Callable[[], float] = time.time,
        leadership: Leadership | None = None,
        leader_decision: DecisionSource | None = None,
        tracing: Tracing | None = None,
    ) -> None:
        self.tracing = tracing or Tracing.off()  # the planner loop's decision spans
        self.registry = registry
        self.switcher = switcher
        self.directory = directory
        self.mode = mode
        self.planner_name = planner_name
        self.planner_tick = planner_tick
        self.split_pin: int | None = None
        self.node_pins: dict[str, Phase] = {}
        self.last_decision: Decision | None = None
        # The newest prediction per split and when it was made: kept while later
        # decisions (no data, say) carry none, so an idle planner still shows it.
        self.last_predictions: tuple[SplitPrediction, ...] = ()
        self.predictions_t: float | None = None
        self._history: collections.deque[SplitSample] = collections.deque(maxlen=history_len)
        self._clock = clock
        self.leadership = leadership
        self._leader_decision = leader_decision
        self._wake = asyncio.Event()
        # Pins this replica was told to realise (a pin, a restore, its election)
        # and has not seen realised yet: a node was draining, a switch failed.
        self._pins_due = False
        self._pins_retry_at = 0.0  # the loop's next attempt no sooner (set when a switch of one failed)
        self._members: frozenset[str] = frozenset()  # the healthy workers at the loop's last tick

    def leads(self) -> bool:
        """Does this replica's planner act (decide, switch, realise pins) now?"""
        return self.leadership is None or self.leadership.is_leader()

    # -- ClusterControl ---------------------------------------------------------
    async def snapshot(self) -> ClusterSnapshot:
        nodes = [
            NodeSnapshot(
                node_id=n.node_id,
                url=n.url,
                phase=n.phase,
                draining_to=n.draining_to,
                healthy=n.healthy,
                pinned_phase=self.node_pins.get(n.node_id),
                queue=n.num_waiting,
                running=n.running,
                kv_usage=n.kv_usage,
                tokens_per_s=n.tokens_per_s,
                health=n.health,
                engine=EngineState(n.engine),
            )
            for n in self.registry.nodes()
        ]
        return ClusterSnapshot(
            nodes=nodes,
            split=self.split(),
            split_pin=self.split_pin,
            directory=await self.directory.stats(),
            top_branches=await self.directory.top_branches(),
        )

    def split(self) -> tuple[int, int]:
        healthy = [n for n in self.registry.nodes() if n.healthy]
        prefill = sum(1 for n in healthy if n.phase is Phase.PREFILL)
        return prefill, len(healthy) - prefill

    async def planner_state(self) -> PlannerState:
        d = self.last_decision
        if not self.leads() and self._leader_decision is not None:
            d = await self._leader_decision()  # the leader's, never a follower's own
            if d is not None and d.predictions:
                self.seed_predictions(d.predictions, d.t)
        return PlannerState(
            mode=self.mode,
            planner=self.planner_name,
            last_decision=d,
            predictions=self.last_predictions,
            predictions_t=self.predictions_t,
            leadership=self.leadership.status() if self.leadership is not None else None,
        )

    async def set_mode(self, mode: str) -> None:
        try:
            self.mode = PlannerMode(mode)
        except ValueError as exc:
            raise InvalidRequest(f"mode must be one of auto/advisory/manual, not {mode!r}", param="mode") from exc

    async def pin_split(self, prefill_nodes: int | None) -> None:
        if prefill_nodes is not None and not 0 <= prefill_nodes <= len(self.registry.nodes()):
            raise InvalidRequest("prefill_nodes must be between 0 and the number of nodes", param="prefill_nodes")
        self.split_pin = prefill_nodes
        if self.leads():
            await self.enforce_pins(who="pin")

    async def pin_node(self, node_id: str, phase: Phase | None) -> None:
        self.registry.get(node_id)
        if phase is None:
            self.node_pins.pop(node_id, None)
            return
        if phase not in ("prefill", "decode"):
            raise InvalidRequest(f"phase must be 'prefill' or 'decode', not {phase!r}", param="phase")
        self.node_pins[node_id] = Phase(phase)
        if self.leads():
            await self.enforce_pins(who="pin")

    async def restore_pins(
        self, split_pin: int | None, node_pins: dict[str, Phase], *, who: str
    ) -> list[SwitchOutcome]:
        known = {n.node_id for n in self.registry.nodes()}
        for node in sorted(set(node_pins) - known):
            log.warning("persisted pin for unknown node %s ignored (not among the workers)", node)
        self.split_pin = split_pin
        self.node_pins = {n: Phase(p) for n, p in node_pins.items() if n in known}
        return await self.enforce_pins(who=who) if self.leads() else []

    async def switch(self, node_id: str, to_phase: Phase, *, reason: str, who: str) -> SwitchOutcome:
        pinned = self.node_pins.get(node_id)
        if pinned is not None and pinned != to_phase:
            raise Conflict(f"node {node_id} is pinned to {pinned}; unpin it first", code="node_pinned")
        return await self.switcher.switch(node_id, to_phase, reason=reason, who=who)

    def pins_realised(self) -> bool:
        return not self.pin_switches()

    def pin_switches(self) -> list[SwitchAction]:
        return pin_actions(self.node_states(), self.pin())

    def pin(self) -> Pin | None:
        """The operator's pins as the planner reads them (None: no pin)."""
        if self.split_pin is None and not self.node_pins:
            return None
        return Pin(prefill_nodes=self.split_pin, node_phases=dict(self.node_pins))

    def node_states(self, kv_capacity_tokens: int = 0) -> tuple[NodeState, ...]:
        """The healthy workers as the planner sees them; `kv_capacity_tokens`
        stands in for a worker that does not report its device KV."""
        return tuple(
            NodeState(
                node_id=n.node_id,
                phase=n.phase,
                draining=n.draining_to is not None,
                pinned=n.node_id in self.node_pins,
                queue=n.num_waiting,
                running=n.running,
                kv_usage=n.kv_usage,
                kv_capacity_tokens=n.kv_capacity_tokens or kv_capacity_tokens,
                max_batch=n.max_num_seqs,
                token_budget=n.max_num_batched_tokens,
            )
            for n in self.registry.nodes()
            if n.healthy
        )

    async def enforce_pins(self, *, who: str) -> list[SwitchOutcome]:
        """Realise the pins with switches; stops at an order a worker fenced
        (this replica no longer leads). The lease is checked by the caller,
        once per batch: orders of a batch interrupted by a pause go out with
        the old term and the workers refuse them. What it cannot do now (a
        node drains, a switch fails) the loop retries (`realise_due_pins`)."""
        self._pins_due = True  # also while it runs: the loop must not take it for done
        out: list[SwitchOutcome] = []
        busy = self.switcher.switching()
        try:
            for action in self.pin_switches():
                if action.node_id in busy:
                    continue
                outcome = await self.switcher.switch(action.node_id, action.to_phase, reason="pin", who=who)
                out.append(outcome)
                if outcome.outcome == "fenced":
                    break
        except GatewayError:
            self._pins_retry_at = self._clock() + PIN_RETRY_S
            raise
        if any(o.outcome not in ("ok", "noop") for o in out):
            self._pins_retry_at = self._clock() + PIN_RETRY_S
        self._pins_due = not self._pins_settled()
        return out

    def _draining(self) -> bool:
        return any(n.draining for n in self.registry.nodes() if n.healthy)

    def _pins_settled(self) -> bool:
        """No node drains (the split pin waits for it) and the pins call for no switch."""
        return not self._draining() and not self.pin_switches()

    async def realise_due_pins(self) -> list[SwitchOutcome]:
        """The leader's loop, each tick: pins it was told to realise and has
        not seen realised are realised once no node drains (a new leader
        finds its predecessor's switch still running; the pin rule waits for
        it); an attempt with a failed switch is retried after `PIN_RETRY_S`.
        Once realised, they are not enforced again until the next pin,
        restore or election, or until a worker joins the healthy ones."""
        self._note_joined()
        if not self._pins_due or not self.leads() or self.switcher.switching() or self._draining():
            return []
        if not self.pin_switches():
            self._pins_due = False
            return []
        if self._clock() < self._pins_retry_at:
            return []
        try:
            return await self.enforce_pins(who="pin")
        except GatewayError as exc:
            log.warning("could not realise the pins: %s", exc.message)
            return []

    def _note_joined(self) -> None:
        """A worker that joined the healthy ones since the last tick (new, or
        back after a restart, in whatever phase it came up in) makes the pins
        due again, in every planner mode: they hold for it too."""
        members = frozenset(n.node_id for n in self.registry.nodes() if n.healthy)
        if members - self._members and self.pin() is not None:
            self._pins_due = True
        self._members = members

    async def on_elected(self, term: int) -> None:
        """Leadership hook: tell the workers the new term, realise pins, decide now."""
        confirmed = await self.registry.announce_term(term)
        log.info("term %d announced to %d workers", term, confirmed)
        try:
            await self.enforce_pins(who="leader")
        except GatewayError as exc:  # e.g. a pinned node unhealthy: retried by the loop
            log.warning("could not realise the pins at election: %s", exc.message)
        self.wake()

    def wake(self) -> None:
        """Run the cluster loop's next tick now."""
        self._wake.set()

    # -- ClusterHistory -----------------------------------------------------------
    async def split_history(self, since_s: float) -> list[SplitSample]:
        cutoff = self._clock() - since_s
        return [s for s in self._history if s.t >= cutoff]

    def sample(self) -> None:
        prefill, decode = self.split()
        tps = sum(n.tokens_per_s for n in self.registry.nodes() if n.healthy)
        self._history.append(SplitSample(t=self._clock(), prefill=prefill, decode=decode, tokens_per_s=tps))

    # -- planner seam ---------------------------------------------------------------
    def record_decision(self, decision: Decision) -> None:
        self.last_decision = decision
        if decision.predictions:
            self.seed_predictions(decision.predictions, decision.t)

    def seed_predictions(self, predictions: tuple[SplitPrediction, ...], t: float) -> None:
        """Keep `predictions` (made at `t`) unless newer ones are already kept."""
        if predictions and (self.predictions_t is None or t >= self.predictions_t):
            self.last_predictions, self.predictions_t = predictions, t

    async def run(self, interval_s: float = 1.0) -> None:
        """Sample the split and run the planner tick forever (cancel to stop);
        `wake()` runs the next tick at once."""
        while True:
            self.sample()
            if self.planner_tick is not None:
                try:
                    await self.planner_tick(self)
                except Exception:  # a planner bug must not stop sampling or serving
                    log.exception("planner tick failed")
            try:
                await self.realise_due_pins()
            except Exception:  # like a planner bug: logged, the loop goes on
                log.exception("realising the pins failed")
            self._wake.clear()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._wake.wait(), interval_s)
