"""`Tracing`: the gateway process's tracer, built once in `create_app`.

    tracing = Tracing.build(settings.tracing, replica=settings.replica)   # off: Tracing.off()

Request spans come from the middleware and the span sites (`_turn.py`);
this object also makes the control plane's spans, each a root of its own
trace and linked to the requests it touched:

- `decision(decision, held)`: a planner decision that moves requests or
  holds them (it acts, or chose another split and did not act; a tick that
  keeps the split makes no span): current and chosen split, the predicted
  gain, linked to the traced calls in flight on the nodes its actions name
  (the requests it moves), or, when it does not act, on the nodes it would
  have moved (`held`: the requests it holds where they are). The
  switches it orders run inside it, as its children.
- `switch(node, ...)`: one phase switch; `SwitchTrace.migrated(ids)` links
  it to the decodes the worker migrated.

Off (no endpoint): no provider, `enabled` False, every method a no-op.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Sequence
from typing import TYPE_CHECKING, Any

from opentelemetry import context as otel_context
from opentelemetry.trace import Link, Span, SpanKind, Status, StatusCode, Tracer, set_span_in_context

from core.tracing import TraceSettings
from gateway.telemetry._inflight import InflightSegments
from gateway.telemetry._lean import LeanSink

if TYPE_CHECKING:
    from opentelemetry.sdk.trace import TracerProvider

    from core import Phase
    from gateway.store.records import SwitchOutcome
    from gateway.telemetry._export import SpanQueue
    from planner.types import Decision, SwitchAction


class SwitchTrace:
    """The span of one phase switch while it runs (None span: not traced)."""

    def __init__(self, span: Span | None, inflight: InflightSegments) -> None:
        self.span = span
        self._inflight = inflight

    def migrated(self, segment_ids: list[str]) -> None:
        if self.span is None:
            return
        for ctx in self._inflight.context_of(segment_ids):
            self.span.add_link(ctx, {"evolving.link": "migrated"})
        self.span.set_attribute("evolving.switch.migrated", len(segment_ids))

    def outcome(self, outcome: SwitchOutcome) -> None:
        if self.span is None:
            return
        self.span.set_attributes(
            {
                "evolving.switch.from_phase": outcome.from_phase.value,
                "evolving.switch.outcome": outcome.outcome,
                "evolving.switch.detail": outcome.detail,
                "evolving.switch.drain_s": outcome.drain_s,
                "evolving.switch.migrate_s": outcome.migrate_s,
            }
        )
        if outcome.outcome not in ("ok", "noop"):
            self.span.set_status(Status(StatusCode.ERROR, outcome.detail))


class Tracing:
    def __init__(
        self,
        provider: TracerProvider | None = None,
        queue: SpanQueue | None = None,
        settings: TraceSettings | None = None,
    ) -> None:
        self._provider = provider
        self.queue = queue
        self.tracer: Tracer | None = provider.get_tracer("evolving-infra.gateway") if provider is not None else None
        # The request path's spans (`_lean.py`): the same sampling rule and export queue as the tracer's.
        self.sink: LeanSink | None = None
        if queue is not None and settings is not None:
            self.sink = LeanSink(queue.put, settings, queue.put_many)
        self.inflight = InflightSegments()

    @classmethod
    def off(cls) -> Tracing:
        return cls(None)

    @classmethod
    def build(cls, settings: TraceSettings, *, replica: str) -> Tracing:
        if not settings.enabled:
            return cls.off()
        from gateway.telemetry._provider import build_provider

        provider, queue = build_provider(
            settings, service_name="evolving-infra-gateway", attributes={"service.instance.id": replica}
        )
        return cls(provider, queue, settings)

    @property
    def enabled(self) -> bool:
        return self.sink is not None

    def flush(self, timeout_ms: int = 5000) -> bool:
        """Exports every span ended so far (blocking; tests and shutdown)."""
        return self.queue.flush() if self.queue is not None else True

    def shutdown(self) -> None:
        if self._provider is not None:
            self._provider.shutdown()

    @contextlib.contextmanager
    def decision(self, decision: Decision, held: Sequence[SwitchAction] = ()) -> Iterator[None]:
        """The span of one planner decision that moves requests or holds them
        (it acts, or would have and did not); the switches ordered inside are
        its children. A tick that keeps the split as it is makes no span.

        `held`: the switches a decision that did not act would have ordered
        (a planner returns no actions then: `Planner.decide`); the requests in
        flight on those nodes are the ones it holds, linked "holds"."""
        if self.tracer is None or not (decision.acted or decision.chosen_split != decision.current_split):
            yield
            return
        moves = decision.actions if decision.acted else tuple(held)
        links = [
            Link(ctx, {"evolving.link": "migrates" if decision.acted else "holds"})
            for ctx in self.inflight.on_nodes(a.node_id for a in moves)
        ]
        attrs: dict[str, Any] = {
            "evolving.planner": decision.planner,
            "evolving.planner.acted": decision.acted,
            "evolving.planner.reason": decision.reason,
            "evolving.planner.confidence": decision.confidence,
            "evolving.planner.current_split": f"{decision.current_split[0]}P{decision.current_split[1]}D",
            "evolving.planner.chosen_split": f"{decision.chosen_split[0]}P{decision.chosen_split[1]}D",
            "evolving.planner.actions": tuple(f"{a.node_id}->{a.to_phase.value}" for a in moves),
        }
        attrs.update(_gain(decision))
        span = self.tracer.start_span("planner.decision", kind=SpanKind.INTERNAL, attributes=attrs, links=links)
        token = otel_context.attach(set_span_in_context(span))
        try:
            yield
        finally:
            otel_context.detach(token)
            span.end()

    @contextlib.contextmanager
    def switch(self, node_id: str, to_phase: Phase, *, reason: str, who: str) -> Iterator[SwitchTrace]:
        """The span of one phase switch (a child of the planner decision that ordered it, if any)."""
        if self.tracer is None:
            yield SwitchTrace(None, self.inflight)
            return
        span = self.tracer.start_span(
            "phase.switch",
            kind=SpanKind.INTERNAL,
            attributes={
                "evolving.node": node_id,
                "evolving.switch.to_phase": to_phase.value,
                "evolving.switch.reason": reason,
                "evolving.switch.who": who,
            },
            links=[Link(ctx, {"evolving.link": "in_flight"}) for ctx in self.inflight.on_nodes([node_id])],
        )
        try:
            yield SwitchTrace(span, self.inflight)
        except BaseException as exc:
            span.record_exception(exc)
            span.set_status(Status(StatusCode.ERROR, type(exc).__name__))
            raise
        finally:
            span.end()


def _gain(decision: Decision) -> dict[str, float]:
    """The predicted gain of the chosen split over the current one (requests/s
    served of the offered load, and its lower confidence bound), from the
    decision's predictions; absent when the planner predicted nothing."""
    by_split = {(p.prefill_nodes, p.decode_nodes): p for p in decision.predictions}
    chosen, current = by_split.get(decision.chosen_split), by_split.get(decision.current_split)
    if chosen is None or current is None:
        return {}
    return {
        "evolving.planner.predicted_rps": chosen.throughput_rps,
        "evolving.planner.current_rps": current.throughput_rps,
        "evolving.planner.predicted_gain_rps": chosen.throughput_rps - current.throughput_rps,
        "evolving.planner.predicted_gain_lo_rps": chosen.throughput_lo_rps - current.throughput_rps,
        "evolving.planner.switch_cost_s": chosen.switch_cost_s,
    }
