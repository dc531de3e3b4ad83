"""Repository functions for the event history: planner decisions, switch
events, the audit log, per-minute usage and operator overrides.

Keyword-only, take a session, never commit.
"""

from __future__ import annotations

import dataclasses
import math
import time
from typing import Any

import sqlalchemy as sa
from sqlalchemy.dialects import postgresql, sqlite
from sqlalchemy.orm import Session

from core import Phase
from gateway.store.records import NODE_PIN_PREFIX, PLANNER_MODE, SPLIT_PIN, Overrides, SwitchOutcome
from gateway.store.tables import AuditEntry, Override, PlannerDecision, SwitchEvent, UsageMinute
from planner.types import Decision, SplitPrediction, SwitchAction

_PHASES = {p.value for p in Phase}  # what a stored action's to_phase may hold
_PREDICTION_FIELDS = {f.name for f in dataclasses.fields(SplitPrediction)}


def json_safe(value: Any) -> Any:
    """Plain JSON: dataclasses/enums/tuples flattened, non-finite floats -> None
    (PostgreSQL rejects NaN in JSON, and one bad row must not block a batch)."""
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        value = dataclasses.asdict(value)
    if isinstance(value, dict):
        return {str(k): json_safe(v) for k, v in value.items()}
    if isinstance(value, (list, tuple, set, frozenset)):
        return [json_safe(v) for v in value]
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if value is None or isinstance(value, (bool, int, str)):
        return value
    if hasattr(value, "value"):  # enums
        return json_safe(value.value)
    return str(value)


def _window(stmt: sa.Select, column: Any, since: float | None, until: float | None) -> sa.Select:
    if since is not None:
        stmt = stmt.where(column >= since)
    if until is not None:
        stmt = stmt.where(column < until)
    return stmt


def _page(session: Session, stmt: sa.Select, *, limit: int, offset: int) -> tuple[list, int]:
    total = session.scalar(sa.select(sa.func.count()).select_from(stmt.order_by(None).subquery())) or 0
    return list(session.scalars(stmt.limit(limit).offset(offset))), int(total)


# -- planner decisions -------------------------------------------------------


def add_decision(session: Session, *, decision: Decision, mode: str) -> PlannerDecision:
    row = PlannerDecision(
        t=decision.t,
        planner=decision.planner,
        mode=mode,
        current_prefill=decision.current_split[0],
        current_decode=decision.current_split[1],
        chosen_prefill=decision.chosen_split[0],
        chosen_decode=decision.chosen_split[1],
        acted=decision.acted,
        confidence=json_safe(decision.confidence) or 0.0,
        reason=decision.reason,
        inputs=json_safe(decision.inputs),
        predictions=json_safe(decision.predictions),
        actions=json_safe(decision.actions),
        predicted_gain=_gain(decision.inputs, "predicted_gain_frac", "move_predicted_gain_frac"),
        realized_gain=_gain(decision.inputs, "realized_gain_frac"),
    )
    session.add(row)
    return row


def _gain(inputs: dict[str, float], *keys: str) -> float | None:
    """The first of ``keys`` the decision's inputs carry, if finite (planner.verification's keys)."""
    for key in keys:
        value = inputs.get(key)
        if isinstance(value, (int, float)) and math.isfinite(value):
            return float(value)
    return None


def list_decisions(
    session: Session,
    *,
    since: float | None = None,
    until: float | None = None,
    acted: bool | None = None,
    checked: bool | None = None,
    limit: int = 100,
    offset: int = 0,
) -> tuple[list[PlannerDecision], int]:
    """Newest first. ``checked``: only the decisions that checked a move
    (they carry its realized gain), or only the others."""
    stmt = _window(sa.select(PlannerDecision), PlannerDecision.t, since, until)
    if acted is not None:
        stmt = stmt.where(PlannerDecision.acted.is_(acted))
    if checked is not None:
        col = PlannerDecision.realized_gain
        stmt = stmt.where(col.is_not(None) if checked else col.is_(None))
    return _page(
        session, stmt.order_by(PlannerDecision.t.desc(), PlannerDecision.id.desc()), limit=limit, offset=offset
    )


def latest_decision(session: Session) -> Decision | None:
    """The newest stored decision as the planner made it (what followers show)."""
    row = session.scalars(
        sa.select(PlannerDecision).order_by(PlannerDecision.t.desc(), PlannerDecision.id.desc()).limit(1)
    ).first()
    if row is None:
        return None
    predictions = tuple(
        _prediction(p) for p in row.predictions or [] if isinstance(p, dict) and p.keys() >= _PREDICTION_FIELDS
    )
    actions = tuple(
        SwitchAction(node_id=str(a["node_id"]), to_phase=Phase(a["to_phase"]))
        for a in row.actions or []
        if isinstance(a, dict) and "node_id" in a and a.get("to_phase") in _PHASES
    )
    inputs = {str(k): float(v) for k, v in (row.inputs or {}).items() if isinstance(v, (int, float))}
    return Decision(
        t=row.t,
        planner=row.planner,
        current_split=(row.current_prefill, row.current_decode),
        chosen_split=(row.chosen_prefill, row.chosen_decode),
        actions=actions,
        acted=row.acted,
        reason=row.reason,
        confidence=row.confidence,
        predictions=predictions,
        inputs=inputs,
    )


def latest_predictions(session: Session) -> tuple[float, tuple[SplitPrediction, ...]] | None:
    """(t, prediction per split) of the newest decision that carries any (a
    planner without enough data stores decisions with none), or None.
    Floats stored as null (they were not finite) come back as infinity."""
    dialect = session.get_bind().dialect.name
    length = sa.func.jsonb_array_length if dialect == "postgresql" else sa.func.json_array_length
    stmt = (
        sa.select(PlannerDecision)
        .where(PlannerDecision.predictions.is_not(None), length(PlannerDecision.predictions) > 0)
        .order_by(PlannerDecision.t.desc(), PlannerDecision.id.desc())
        .limit(1)
    )
    row = session.scalars(stmt).first()
    if row is None or not row.predictions:
        return None
    return row.t, tuple(_prediction(p) for p in row.predictions)


def _prediction(stored: dict[str, Any]) -> SplitPrediction:
    """A stored prediction: json_safe wrote non-finite numbers (an infeasible
    split's TTFT) as null, and fields a newer planner added are left out."""
    fields: dict[str, Any] = {k: (math.inf if v is None else v) for k, v in stored.items() if k in _PREDICTION_FIELDS}
    return SplitPrediction(**fields)


# -- switch events -----------------------------------------------------------


def add_switch_event(session: Session, *, t: float, outcome: SwitchOutcome, reason: str, who: str) -> SwitchEvent:
    row = SwitchEvent(
        t=t,
        node_id=outcome.node_id,
        from_phase=outcome.from_phase.value,
        to_phase=outcome.to_phase.value,
        reason=reason,
        who=who,
        drain_s=json_safe(outcome.drain_s) or 0.0,
        migrate_s=json_safe(outcome.migrate_s) or 0.0,
        total_s=json_safe(outcome.total_s) or 0.0,
        outcome=outcome.outcome,
        detail=outcome.detail,
    )
    session.add(row)
    return row


def list_switch_events(
    session: Session,
    *,
    since: float | None = None,
    until: float | None = None,
    node_id: str | None = None,
    reason: str | None = None,
    outcome: str | None = None,
    limit: int = 100,
    offset: int = 0,
) -> tuple[list[SwitchEvent], int]:
    """Newest first; `reason` matches as a case-insensitive substring."""
    stmt = _window(sa.select(SwitchEvent), SwitchEvent.t, since, until)
    if node_id is not None:
        stmt = stmt.where(SwitchEvent.node_id == node_id)
    if outcome is not None:
        stmt = stmt.where(SwitchEvent.outcome == outcome)
    if reason is not None:
        stmt = stmt.where(sa.func.lower(SwitchEvent.reason).contains(reason.lower(), autoescape=True))
    return _page(session, stmt.order_by(SwitchEvent.t.desc(), SwitchEvent.id.desc()), limit=limit, offset=offset)


# -- audit log ---------------------------------------------------------------


def add_audit(
    session: Session,
    *,
    actor: str,
    action: str,
    target: str,
    before: Any = None,
    after: Any = None,
    t: float | None = None,
    actor_id: str | None = None,
) -> AuditEntry:
    """`actor`: the admin token's name (or "system"); `actor_id`: its id (or "system")."""
    row = AuditEntry(
        t=time.time() if t is None else t,
        actor=actor,
        actor_id=actor_id,
        action=action,
        target=target,
        before=json_safe(before),
        after=json_safe(after),
    )
    session.add(row)
    return row


def list_audit(
    session: Session,
    *,
    since: float | None = None,
    until: float | None = None,
    actor: str | None = None,
    actor_id: str | None = None,
    action: str | None = None,
    limit: int = 100,
    offset: int = 0,
) -> tuple[list[AuditEntry], int]:
    """Newest first."""
    stmt = _window(sa.select(AuditEntry), AuditEntry.t, since, until)
    if actor is not None:
        stmt = stmt.where(AuditEntry.actor == actor)
    if actor_id is not None:
        stmt = stmt.where(AuditEntry.actor_id == actor_id)
    if action is not None:
        stmt = stmt.where(AuditEntry.action == action)
    return _page(session, stmt.order_by(AuditEntry.t.desc(), AuditEntry.id.desc()), limit=limit, offset=offset)


# -- usage -------------------------------------------------------------------


def minute_of(t: float) -> int:
    """Start of the minute containing unix time `t`."""
    return int(t // 60) * 60


def add_usage(
    session: Session,
    *,
    tenant_id: str,
    minute: int,
    model: str,
    requests: int,
    prompt_tokens: int,
    cached_tokens: int,
    completion_tokens: int,
) -> None:
    """Add to the (tenant, minute, model) row, creating it if needed (upsert-add)."""
    counts = {
        "requests": requests,
        "prompt_tokens": prompt_tokens,
        "cached_tokens": cached_tokens,
        "completion_tokens": completion_tokens,
    }
    keys = {"tenant_id": tenant_id, "minute": minute, "model": model}
    dialect = session.get_bind().dialect.name
    if dialect in ("postgresql", "sqlite"):
        insert = (postgresql.insert if dialect == "postgresql" else sqlite.insert)(UsageMinute)
        stmt = insert.values(**keys, **counts)
        stmt = stmt.on_conflict_do_update(
            index_elements=list(keys),
            set_={name: getattr(UsageMinute, name) + getattr(stmt.excluded, name) for name in counts},
        )
        session.execute(stmt)
        return
    row = session.get(UsageMinute, (tenant_id, minute, model))
    if row is None:
        session.add(UsageMinute(**keys, **counts))
    else:
        for name, value in counts.items():
            setattr(row, name, getattr(row, name) + value)


def list_usage(
    session: Session, *, tenant_id: str, since: float | None = None, until: float | None = None
) -> list[UsageMinute]:
    """Oldest first."""
    stmt = _window(sa.select(UsageMinute).where(UsageMinute.tenant_id == tenant_id), UsageMinute.minute, since, until)
    return list(session.scalars(stmt.order_by(UsageMinute.minute, UsageMinute.model)))


# -- overrides ---------------------------------------------------------------


def set_override(session: Session, *, key: str, value: Any, who: str, t: float | None = None) -> None:
    """Set (or, with None, clear) one override at version `t` (default: now).

    A clear keeps the row as a tombstone (value null) so that replicas
    reconciling from the store see the clear and its version. A write older
    than the stored version (a replica's buffered write landing late) is
    ignored: the newest change wins, whichever replica flushes last.
    """
    at = time.time() if t is None else t
    row = session.get(Override, key)
    if row is not None and row.updated_at > at:
        return
    row = row or Override(key=key)
    row.value = None if value is None else json_safe(value)
    row.updated_at = at
    row.updated_by = who
    session.add(row)


def get_overrides(session: Session) -> Overrides:
    split_pin: int | None = None
    mode: str | None = None
    nodes: dict[str, str] = {}
    versions: dict[str, float] = {}
    for row in session.scalars(sa.select(Override)):
        versions[row.key] = float(row.updated_at)
        if row.value is None:  # a tombstone: cleared at updated_at
            continue
        if row.key == SPLIT_PIN:
            split_pin = int(row.value)
        elif row.key == PLANNER_MODE:
            mode = str(row.value)
        elif row.key.startswith(NODE_PIN_PREFIX):
            nodes[row.key[len(NODE_PIN_PREFIX) :]] = str(row.value)
    return Overrides(split_pin=split_pin, node_pins=nodes, planner_mode=mode, versions=versions)
