"""Admin routes over the live cluster: state, planner, pins, manual switch,
and the stored switch and decision history.

Control actions work during a store outage: their audit entries and the
persisted pins/mode go through the buffered `EventSink`.
"""

# No `from __future__ import annotations`: FastAPI must resolve the local
# `Annotated` dependency aliases at definition time.

import dataclasses
import math
from typing import Annotated, Any

from fastapi import APIRouter, Depends, Query

from gateway.admin import schemas
from gateway.admin._deps import (
    CSV_RESPONSES,
    AdminContext,
    Format,
    Limit,
    Offset,
    RoleDependency,
    Since,
    Until,
    csv_response,
    unix_s,
)
from gateway.admin.auth import AdminPrincipal
from gateway.control.overrides import Pins
from gateway.control.ports import PlannerState
from gateway.http import errors
from gateway.store import repository
from gateway.store.tables import PlannerDecision


def _decision_out(row: PlannerDecision) -> schemas.DecisionOut:
    return schemas.DecisionOut(
        id=row.id,
        t=row.t,
        planner=row.planner,
        mode=row.mode,
        current_split=(row.current_prefill, row.current_decode),
        chosen_split=(row.chosen_prefill, row.chosen_decode),
        acted=row.acted,
        confidence=row.confidence,
        reason=row.reason,
        inputs=row.inputs,
        predictions=row.predictions,
        actions=row.actions,
        predicted_gain=row.predicted_gain,
        realized_gain=row.realized_gain,
    )


def planner_out(state: PlannerState) -> schemas.PlannerOut:
    d = state.last_decision
    last = (
        None
        if d is None
        else schemas.LastDecisionOut(
            t=d.t,
            planner=d.planner,
            current_split=d.current_split,
            chosen_split=d.chosen_split,
            acted=d.acted,
            reason=d.reason,
            confidence=d.confidence,
            actions=[schemas.ActionOut(node_id=a.node_id, to_phase=a.to_phase) for a in d.actions],
            inputs={k: float(v) for k, v in d.inputs.items() if isinstance(v, (int, float)) and math.isfinite(v)},
        )
    )
    lead = state.leadership
    return schemas.PlannerOut(
        mode=state.mode.value,
        planner=state.planner,
        last_decision=last,
        predictions=[schemas.PredictionOut(**dataclasses.asdict(p)) for p in state.predictions],
        predictions_t=state.predictions_t,
        leadership=None if lead is None else schemas.LeadershipOut(**dataclasses.asdict(lead)),
    )


def cluster_routes(ctx: AdminContext, viewer: RoleDependency, operator: RoleDependency) -> APIRouter:  # noqa: C901 - a route table
    router = APIRouter(tags=["cluster"])
    Viewer = Annotated[AdminPrincipal, Depends(viewer)]
    Operator = Annotated[AdminPrincipal, Depends(operator)]

    def audit(who: AdminPrincipal, action: str, target: str, before: Any, after: Any) -> None:
        ctx.sink.record_audit(
            actor=who.name, actor_id=who.token_id, action=action, target=target, before=before, after=after
        )
        ctx.sink.kick()

    @router.get(
        "/cluster", summary="Cluster state: nodes, phases, queues, KV use, split", response_model=schemas.ClusterOut
    )
    async def get_cluster(_: Viewer) -> dict[str, Any]:
        return dataclasses.asdict(await ctx.control.snapshot())

    @router.get("/cluster/history", summary="Split and throughput samples over time", response_model=schemas.HistoryOut)
    async def get_history(_: Viewer, minutes: Annotated[float, Query(gt=0, le=7 * 24 * 60)] = 60) -> dict[str, Any]:
        return {"items": [dataclasses.asdict(s) for s in await ctx.control.split_history(minutes * 60)]}

    @router.get(
        "/planner", summary="Planner mode, last decision, prediction per split", response_model=schemas.PlannerOut
    )
    async def get_planner(_: Viewer) -> schemas.PlannerOut:
        return planner_out(await ctx.control.planner_state())

    @router.put("/planner/mode", summary="Set the planner mode", response_model=schemas.PlannerModeIn)
    async def put_mode(body: schemas.PlannerModeIn, who: Operator) -> schemas.PlannerModeIn:
        await ctx.overrides.set_mode(body.mode, who=who.name, actor_id=who.token_id)
        return body

    def pins_out(pins: Pins) -> schemas.PinsOut:
        return schemas.PinsOut(split=pins.split, nodes=pins.nodes)

    @router.get("/pins", summary="Current split and node pins", response_model=schemas.PinsOut)
    async def get_pins(_: Viewer) -> schemas.PinsOut:
        return pins_out(await ctx.overrides.pins())

    @router.put("/pins/split", summary="Pin the number of prefill nodes", response_model=schemas.PinsOut)
    async def put_split_pin(body: schemas.SplitPinIn, who: Operator) -> schemas.PinsOut:
        return pins_out(await ctx.overrides.pin_split(body.prefill_nodes, who=who.name, actor_id=who.token_id))

    @router.delete("/pins/split", summary="Unpin the split", response_model=schemas.PinsOut)
    async def delete_split_pin(who: Operator) -> schemas.PinsOut:
        return pins_out(await ctx.overrides.pin_split(None, who=who.name, actor_id=who.token_id))

    @router.put("/pins/nodes/{node_id}", summary="Pin a node's phase", response_model=schemas.PinsOut)
    async def put_node_pin(node_id: str, body: schemas.NodePinIn, who: Operator) -> schemas.PinsOut:
        return pins_out(await ctx.overrides.pin_node(node_id, body.phase, who=who.name, actor_id=who.token_id))

    @router.delete("/pins/nodes/{node_id}", summary="Unpin a node", response_model=schemas.PinsOut)
    async def delete_node_pin(node_id: str, who: Operator) -> schemas.PinsOut:
        return pins_out(await ctx.overrides.pin_node(node_id, None, who=who.name, actor_id=who.token_id))

    @router.post("/switch", summary="Switch a node's phase now", response_model=schemas.SwitchOut)
    async def post_switch(body: schemas.SwitchIn, who: Operator) -> dict[str, Any]:
        snap = await ctx.control.snapshot()
        node = next((n for n in snap.nodes if n.node_id == body.node_id), None)
        if node is None:
            raise errors.NotFound(f"No node {body.node_id!r}.", param="node_id")
        outcome = await ctx.control.switch(body.node_id, body.to_phase, reason=body.reason, who=who.name)
        result = dataclasses.asdict(outcome)
        audit(who, "switch", f"node:{body.node_id}", {"phase": node.phase, "reason": body.reason}, result)
        return result

    @router.get(
        "/switches",
        summary="Switch history (filters, paging, CSV)",
        response_model=schemas.Page[schemas.SwitchEventOut],
        responses=CSV_RESPONSES,
    )
    async def get_switches(
        _: Viewer,
        since: Since = None,
        until: Until = None,
        node: str | None = None,
        reason: str | None = None,
        outcome: str | None = None,
        limit: Limit = 100,
        offset: Offset = 0,
        format: Format = "json",
    ) -> Any:
        rows, total = await ctx.db.run_async(
            lambda s: repository.list_switch_events(
                s,
                since=unix_s(since),
                until=unix_s(until),
                node_id=node,
                reason=reason,
                outcome=outcome,
                limit=limit,
                offset=offset,
            )
        )
        items = [schemas.SwitchEventOut.model_validate(r) for r in rows]
        if format == "csv":
            return csv_response(
                (i.model_dump() for i in items), list(schemas.SwitchEventOut.model_fields), "switches.csv"
            )
        return schemas.Page[schemas.SwitchEventOut](items=items, total=total)

    @router.get(
        "/decisions",
        summary="Planner decisions (filters, paging, CSV)",
        response_model=schemas.Page[schemas.DecisionOut],
        responses=CSV_RESPONSES,
    )
    async def get_decisions(
        _: Viewer,
        since: Since = None,
        until: Until = None,
        acted: bool | None = None,
        checked: Annotated[
            bool | None, Query(description="only decisions that checked a settled move (true) or the others")
        ] = None,
        limit: Limit = 100,
        offset: Offset = 0,
        format: Format = "json",
    ) -> Any:
        rows, total = await ctx.db.run_async(
            lambda s: repository.list_decisions(
                s,
                since=unix_s(since),
                until=unix_s(until),
                acted=acted,
                checked=checked,
                limit=limit,
                offset=offset,
            )
        )
        items = [_decision_out(r) for r in rows]
        if format == "csv":
            return csv_response(
                (i.model_dump() for i in items), list(schemas.DecisionOut.model_fields), "decisions.csv"
            )
        return schemas.Page[schemas.DecisionOut](items=items, total=total)

    return router
