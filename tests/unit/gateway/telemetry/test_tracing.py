"""gateway.telemetry.tracing: the control plane's spans reach the same export
queue as the requests'; a planner tick that keeps the split makes no span."""

from __future__ import annotations

from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider

from core import Phase
from core.tracing import TraceSettings
from gateway.control.planner_loop import held_moves
from gateway.telemetry import Tracing
from gateway.telemetry._export import SpanQueue, SpanQueueProcessor
from gateway.telemetry._lean import LeanSpan
from planner.types import ClusterView, Decision, NodeState, PlannerMode, SwitchAction
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


def test_a_decision_that_does_not_act_links_the_requests_it_holds() -> None:
    # advisory: the planner chose 2P2D and returned no actions; the loop derives the moves it held back
    nodes = (
        NodeState("p1", Phase.PREFILL),
        NodeState("d1", Phase.DECODE, running=3),
        NodeState("d2", Phase.DECODE),
        NodeState("d3", Phase.DECODE, pinned=True),
    )
    view = ClusterView(now=0.0, nodes=nodes, mode=PlannerMode.ADVISORY)
    held = decision((1, 3), (2, 2), acted=False)
    assert held_moves(held, view) == (SwitchAction("d2", Phase.PREFILL),)  # the idlest movable decode node
    assert held_moves(decision((1, 3), (2, 2), acted=True), view) == ()
    assert held_moves(decision((1, 3), (1, 3), acted=False), view) == ()

    posts = Posts()
    t = tracing(posts)
    on_d2, on_d1 = LeanSpan(None, "decode", 7, 1, 3, {}, 0), LeanSpan(None, "decode", 8, 1, 3, {}, 0)
    t.inflight.add("seg-d2", "d2", on_d2)
    t.inflight.add("seg-d1", "d1", on_d1)
    with t.decision(held, held_moves(held, view)):
        pass
    t.flush()
    (span,) = posts.spans()
    assert [(link.trace_id, link.span_id) for link in span.links] == [
        (on_d2.trace_id.to_bytes(16, "big"), on_d2.span_id.to_bytes(8, "big"))
    ]
    assert [a.value.string_value for a in span.links[0].attributes] == ["holds"]
    actions = [a.value for a in span.attributes if a.key == "evolving.planner.actions"]
    assert [v.string_value for v in actions[0].array_value.values] == ["d2->prefill"]
    t.shutdown()
