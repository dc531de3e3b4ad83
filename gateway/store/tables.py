"""SQLAlchemy 2 table models of the control-plane store.

Portable across SQLite and PostgreSQL: times are unix seconds in floats (the
unit the planner and the cluster use), JSON columns are JSONB on PostgreSQL
and JSON text on SQLite, ids are short strings or integer sequences. The
migrations in `migrations/versions/` (0001, 0002, then 0003) create exactly these.
"""

from __future__ import annotations

from typing import Any

import sqlalchemy as sa
from sqlalchemy.dialects import postgresql
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column

JSONValue = sa.JSON(none_as_null=True).with_variant(postgresql.JSONB(none_as_null=True), "postgresql")
# SQLite only auto-increments INTEGER PRIMARY KEY; PostgreSQL gets a bigint.
BigId = sa.BigInteger().with_variant(sa.Integer(), "sqlite")

NAMING = {
    "ix": "ix_%(column_0_label)s",
    "uq": "uq_%(table_name)s_%(column_0_name)s",
    "ck": "ck_%(table_name)s_%(constraint_name)s",
    "fk": "fk_%(table_name)s_%(column_0_name)s_%(referred_table_name)s",
    "pk": "pk_%(table_name)s",
}


class Base(DeclarativeBase):
    metadata = sa.MetaData(naming_convention=NAMING)


class Tenant(Base):
    __tablename__ = "tenants"
    id: Mapped[str] = mapped_column(sa.String(64), primary_key=True)
    name: Mapped[str] = mapped_column(sa.String(200), unique=True)
    cache_salt: Mapped[str] = mapped_column(sa.String(64))
    created_at: Mapped[float] = mapped_column(sa.Float)


class ApiKey(Base):
    __tablename__ = "api_keys"
    id: Mapped[str] = mapped_column(sa.String(64), primary_key=True)
    tenant_id: Mapped[str] = mapped_column(sa.ForeignKey("tenants.id", ondelete="CASCADE"), index=True)
    name: Mapped[str] = mapped_column(sa.String(200), default="")
    prefix: Mapped[str] = mapped_column(sa.String(32), index=True)
    salt: Mapped[str] = mapped_column(sa.String(64))
    secret_hash: Mapped[str] = mapped_column(sa.String(128))
    created_at: Mapped[float] = mapped_column(sa.Float)
    revoked_at: Mapped[float | None] = mapped_column(sa.Float, nullable=True)


class TenantPolicy(Base):
    __tablename__ = "tenant_policies"
    __table_args__ = (sa.CheckConstraint("priority >= 0 AND priority <= 3", name="priority_range"),)
    tenant_id: Mapped[str] = mapped_column(sa.ForeignKey("tenants.id", ondelete="CASCADE"), primary_key=True)
    requests_per_minute: Mapped[int | None] = mapped_column(sa.Integer, nullable=True)
    tokens_per_minute: Mapped[int | None] = mapped_column(sa.Integer, nullable=True)
    max_concurrent: Mapped[int | None] = mapped_column(sa.Integer, nullable=True)
    priority: Mapped[int] = mapped_column(sa.Integer, default=1)
    allowed_models: Mapped[list[str] | None] = mapped_column(JSONValue, nullable=True)
    max_active_branches: Mapped[int | None] = mapped_column(sa.Integer, nullable=True)
    kv_retention_blocks: Mapped[int | None] = mapped_column(sa.Integer, nullable=True)
    cache_isolation: Mapped[bool] = mapped_column(sa.Boolean, default=True)
    updated_at: Mapped[float] = mapped_column(sa.Float)


class PlannerDecision(Base):
    __tablename__ = "planner_decisions"
    id: Mapped[int] = mapped_column(BigId, primary_key=True, autoincrement=True)
    t: Mapped[float] = mapped_column(sa.Float, index=True)
    planner: Mapped[str] = mapped_column(sa.String(64))
    mode: Mapped[str] = mapped_column(sa.String(16))
    current_prefill: Mapped[int] = mapped_column(sa.Integer)
    current_decode: Mapped[int] = mapped_column(sa.Integer)
    chosen_prefill: Mapped[int] = mapped_column(sa.Integer)
    chosen_decode: Mapped[int] = mapped_column(sa.Integer)
    acted: Mapped[bool] = mapped_column(sa.Boolean)
    confidence: Mapped[float] = mapped_column(sa.Float)
    reason: Mapped[str] = mapped_column(sa.Text)
    inputs: Mapped[dict[str, Any] | None] = mapped_column(JSONValue, nullable=True)
    predictions: Mapped[list[Any] | None] = mapped_column(JSONValue, nullable=True)
    actions: Mapped[list[Any] | None] = mapped_column(JSONValue, nullable=True)
    # A model move's predicted gain (fraction), and on the decision that checked it once
    # settled, also the realized one (planner.verification); null on other decisions.
    predicted_gain: Mapped[float | None] = mapped_column(sa.Float, nullable=True)
    realized_gain: Mapped[float | None] = mapped_column(sa.Float, nullable=True)


class SwitchEvent(Base):
    __tablename__ = "switch_events"
    id: Mapped[int] = mapped_column(BigId, primary_key=True, autoincrement=True)
    t: Mapped[float] = mapped_column(sa.Float, index=True)
    node_id: Mapped[str] = mapped_column(sa.String(200), index=True)
    from_phase: Mapped[str] = mapped_column(sa.String(16))
    to_phase: Mapped[str] = mapped_column(sa.String(16))
    reason: Mapped[str] = mapped_column(sa.Text)
    who: Mapped[str] = mapped_column(sa.String(200))
    drain_s: Mapped[float] = mapped_column(sa.Float)
    migrate_s: Mapped[float] = mapped_column(sa.Float)
    total_s: Mapped[float] = mapped_column(sa.Float)
    outcome: Mapped[str] = mapped_column(sa.String(16))
    detail: Mapped[str] = mapped_column(sa.Text, default="")


class Override(Base):
    """Operator pins and planner mode; key `split_pin`, `planner_mode`, `node_pin:<id>`."""

    __tablename__ = "overrides"
    key: Mapped[str] = mapped_column(sa.String(250), primary_key=True)
    value: Mapped[Any] = mapped_column(JSONValue, nullable=True)
    updated_at: Mapped[float] = mapped_column(sa.Float)
    updated_by: Mapped[str] = mapped_column(sa.String(200))


class AuditEntry(Base):
    __tablename__ = "audit_log"
    id: Mapped[int] = mapped_column(BigId, primary_key=True, autoincrement=True)
    t: Mapped[float] = mapped_column(sa.Float, index=True)
    actor: Mapped[str] = mapped_column(sa.String(200))  # the token's name (or "system"), for reading
    # The admin token id that acted ("system" at start-up; None before migration 0002):
    # names are unique only among active tokens of one role.
    actor_id: Mapped[str | None] = mapped_column(sa.String(64), nullable=True, index=True)
    action: Mapped[str] = mapped_column(sa.String(100))
    target: Mapped[str] = mapped_column(sa.String(300))
    before: Mapped[Any] = mapped_column(JSONValue, nullable=True)
    after: Mapped[Any] = mapped_column(JSONValue, nullable=True)


class UsageMinute(Base):
    """Usage rolled up per tenant, minute and model. No foreign key: usage
    buffered during an outage must land even if the tenant was deleted since."""

    __tablename__ = "usage_minutes"
    tenant_id: Mapped[str] = mapped_column(sa.String(64), primary_key=True)
    minute: Mapped[int] = mapped_column(sa.BigInteger, primary_key=True)  # unix s, multiple of 60
    model: Mapped[str] = mapped_column(sa.String(200), primary_key=True)
    requests: Mapped[int] = mapped_column(sa.BigInteger, default=0)
    prompt_tokens: Mapped[int] = mapped_column(sa.BigInteger, default=0)
    cached_tokens: Mapped[int] = mapped_column(sa.BigInteger, default=0)
    completion_tokens: Mapped[int] = mapped_column(sa.BigInteger, default=0)


class AdminToken(Base):
    __tablename__ = "admin_tokens"
    __table_args__ = (
        sa.CheckConstraint("role IN ('viewer', 'operator')", name="role_known"),
        # One active token per (role, name): the audit log and the console name tokens.
        sa.Index(
            "uq_admin_tokens_role_name_active",
            "role",
            "name",
            unique=True,
            postgresql_where=sa.text("revoked_at IS NULL"),
            sqlite_where=sa.text("revoked_at IS NULL"),
        ),
    )
    id: Mapped[str] = mapped_column(sa.String(64), primary_key=True)
    name: Mapped[str] = mapped_column(sa.String(200))
    role: Mapped[str] = mapped_column(sa.String(16))
    prefix: Mapped[str] = mapped_column(sa.String(32), index=True)
    salt: Mapped[str] = mapped_column(sa.String(64))
    secret_hash: Mapped[str] = mapped_column(sa.String(128))
    created_at: Mapped[float] = mapped_column(sa.Float)
    revoked_at: Mapped[float | None] = mapped_column(sa.Float, nullable=True)


class LeaderLease(Base):
    """Planner leadership (`gateway.store._lease_repo`): holder, term, expiry on the DB clock."""

    __tablename__ = "leader_lease"
    name: Mapped[str] = mapped_column(sa.String(64), primary_key=True)
    holder: Mapped[str] = mapped_column(sa.String(200))
    term: Mapped[int] = mapped_column(sa.BigInteger)
    expires_at: Mapped[float] = mapped_column(sa.Float)
    renewed_at: Mapped[float] = mapped_column(sa.Float)
