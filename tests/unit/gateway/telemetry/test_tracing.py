"""gateway.telemetry.tracing: the control plane's spans reach the same export
queue as the requests'; a planner tick that keeps the split makes no span."""

from __future__ import annotations

from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider

from core import Phase
from core.tracing import TraceSettings
from gateway.telemetry import Tracing
from gateway.telemetry._export import SpanQueue, SpanQueueProcessor
from planner.types import Decision, SwitchAction
from testing.fake_span_post import FakeSpanPost as Posts

SETTINGS = TraceSettings(endpoint="http://collector:4318/v1/traces")


def tracing(posts: Posts) -> Tracing:
    queue = SpanQueue(posts, resource={"service.name": "gw"}, scope="evolving-infra.gateway", delay_s=60)
    provider = TracerProvider(resource=Resource.create({"service.name": "gw"}))
    provider.add_span_processor(SpanQueueProcessor(queue))
    return Tracing(provider, queue, SETTINGS)


def decision(current: tuple[int, int], chosen: tuple[int, int], *, acted: bool) -> Decision:
    actions = (SwitchAction("w1", Phase.PREFILL),) if acted else ()
    return Decision(0.0, "evolving", current, chosen, actions, acted, "test")


def test_only_decisions_that_move_or_hold_requests_are_spans() -> None:
    posts = Posts()
    t = tracing(posts)
    for d in (
        decision((1, 3), (1, 3), acted=False),  # the split stays: every quiet tick, no span
        decision((1, 3), (2, 2), acted=True),  # moves
        decision((1, 3), (2, 2), acted=False),  # would move, held (advisory)
    ):
        with t.decision(d):
            pass
    t.flush()
    spans = posts.spans()
    assert [s.name for s in spans] == ["planner.decision", "planner.decision"]
    acted = [a.value.bool_value for s in spans for a in s.attributes if a.key == "evolving.planner.acted"]
    assert acted == [True, False]
    t.shutdown()


def test_a_switch_inside_a_decision_is_its_child() -> None:
    posts = Posts()
    t = tracing(posts)
    with t.decision(decision((1, 3), (2, 2), acted=True)), t.switch("w1", Phase.PREFILL, reason="r", who="planner"):
        pass
    t.flush()
    spans = {s.name: s for s in posts.spans()}
    assert spans["phase.switch"].parent_span_id == spans["planner.decision"].span_id
    assert spans["phase.switch"].trace_id == spans["planner.decision"].trace_id
    t.shutdown()


def test_off_makes_nothing() -> None:
    t = Tracing.off()
    assert not t.enabled and t.flush()
    with t.decision(decision((1, 3), (2, 2), acted=True)), t.switch("w1", Phase.PREFILL, reason="r", who="x") as sw:
        sw.migrated(["a"])
