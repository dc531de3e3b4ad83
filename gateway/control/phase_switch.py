"""Switch orchestrator: flip one worker's phase in place.

`switch(node, to_phase, reason, who)`:

1. decide: no-op if the node already is in `to_phase`; refuse an unhealthy
   node or one already switching.
2. mark the node draining in the registry (the router stops sending it new
   work of its old phase at once);
3. one call: worker `POST /internal/phase` — the worker drains in-flight
   prefills and migrates in-flight decodes (their streams end with
   finish_reason "migrated"; the orchestrator resumes them elsewhere);
4. apply: set the new phase, clear draining, record drain/migrate/total
   timings, hand the `SwitchOutcome` to the optional sink (event store,
   metrics). A failed switch restores the old phase and is recorded too.

The worker's own drain/migrate timings are used; `total_s` is measured
here and includes the RPC.

Fencing: every order carries `term_source()` (the replica's leadership term,
`workers.fence`). A worker that has seen a newer term refuses it (409
`stale_term`): nothing changed on the node, the outcome is `fenced`, and
`on_fenced(detail)` tells the leadership that this replica has been deposed.
"""

from __future__ import annotations

import inspect
import logging
import time
from collections.abc import Awaitable, Callable

from core import Phase
from gateway.control.registry import WorkerRegistry
from gateway.http.errors import Conflict
from gateway.store.records import SwitchOutcome
from gateway.telemetry import SwitchTrace, Tracing
from gateway.upstream.port import WorkerAPI, WorkerError, WorkerRejected
from workers.protocol import PhaseChangeRequest

log = logging.getLogger(__name__)

# (outcome, reason, who) -> None or awaitable. Must not raise.
SwitchSink = Callable[[SwitchOutcome, str, str], Awaitable[None] | None]


class PhaseSwitcher:
    def __init__(
        self,
        registry: WorkerRegistry,
        client: WorkerAPI,
        *,
        deadline_s: float = 0.0,
        rpc_margin_s: float = 120.0,
        sinks: list[SwitchSink] | None = None,
        term_source: Callable[[], int | None] = lambda: None,
        on_fenced: Callable[[str], None] = lambda detail: None,
        tracing: Tracing | None = None,
    ) -> None:
        self.tracing = tracing or Tracing.off()  # one span per switch, linked to the decodes it migrated
        self.term_source = term_source
        self.on_fenced = on_fenced
        self.fenced = 0  # orders workers refused as stale
        self._registry = registry
        self._client = client
        self._deadline_s = deadline_s
        self._rpc_margin_s = rpc_margin_s
        self._sinks: list[SwitchSink] = list(sinks or [])

    def add_sink(self, sink: SwitchSink) -> None:
        self._sinks.append(sink)

    def switching(self) -> set[str]:
        """The nodes this replica is switching (the registry's `mark_draining` .. `finish_switch`)."""
        return {n.node_id for n in self._registry.nodes() if n.switching}

    async def switch(self, node_id: str, to_phase: Phase, *, reason: str, who: str) -> SwitchOutcome:
        target = Phase(to_phase)  # the member itself, also for an untyped caller that passed its value
        with self.tracing.switch(node_id, target, reason=reason, who=who) as trace:
            outcome = await self._switch(node_id, target, reason=reason, who=who, trace=trace)
            trace.outcome(outcome)
            return outcome

    async def _switch(
        self, node_id: str, to_phase: Phase, *, reason: str, who: str, trace: SwitchTrace
    ) -> SwitchOutcome:
        target = to_phase
        node = self._registry.get(node_id)
        from_phase = node.phase
        if node.switching:
            raise Conflict(f"node {node_id} is already switching", code="switch_in_progress")
        if node.phase is target and not node.draining:
            return await self._emit(
                SwitchOutcome(node_id, from_phase, target, 0.0, 0.0, 0.0, "noop", "already in phase"),
                reason,
                who,
            )
        if not node.healthy:
            raise Conflict(f"node {node_id} is unhealthy", code="node_unhealthy")
        start = time.monotonic()
        term = self.term_source()
        self._registry.mark_draining(node_id, target)
        try:
            result = await self._client.change_phase(
                node.url,
                PhaseChangeRequest(phase=target, deadline_s=self._deadline_s, migrate=True, term=term),
                timeout_s=self._deadline_s + self._rpc_margin_s,
            )
        except (TimeoutError, WorkerError) as exc:
            self._registry.finish_switch(node_id, from_phase)
            fenced = isinstance(exc, WorkerRejected) and exc.stale_term
            outcome = SwitchOutcome(
                node_id,
                from_phase,
                target,
                0.0,
                0.0,
                time.monotonic() - start,
                "fenced" if fenced else "failed",
                f"{type(exc).__name__}: {exc}",
            )
            if fenced:
                self.fenced += 1
                log.warning("switch of %s to %s refused: term %s is stale (%s)", node_id, target.value, term, exc)
                self.on_fenced(str(exc))
            else:
                log.warning("switch of %s to %s failed: %s", node_id, target.value, exc)
            return await self._emit(outcome, reason, who)
        finally:
            self._registry.release_switch(node_id)  # cancelled, say: the worker's heartbeat reports where it is
        self._registry.finish_switch(node_id, result.to_phase)
        trace.migrated(result.migrated)
        outcome = SwitchOutcome(
            node_id,
            from_phase,
            result.to_phase,
            result.drain_s,
            result.migrate_s,
            time.monotonic() - start,
            "ok",
            f"migrated {len(result.migrated)} decodes",
        )
        log.info(
            "switched %s %s->%s in %.3fs (%s, by %s)",
            node_id,
            from_phase.value,
            target.value,
            outcome.total_s,
            reason,
            who,
        )
        return await self._emit(outcome, reason, who)

    async def _emit(self, outcome: SwitchOutcome, reason: str, who: str) -> SwitchOutcome:
        for sink in self._sinks:
            try:
                result = sink(outcome, reason, who)
                if inspect.isawaitable(result):
                    await result
            except Exception:  # a broken recorder must not fail the switch it records
                log.exception("switch sink failed")
        return outcome
