"""Initial schema of the gateway store.

Revision ID: 0001
Revises:
Create Date: 2026-01-01

Tenants, API keys, tenant policies, planner decisions, switch events,
overrides (pins, planner mode), audit log, per-minute usage, admin tokens.
Kept in step with `gateway/store/tables.py` (a test compares them).
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

revision = "0001"
down_revision = None
branch_labels = None
depends_on = None


def _json() -> sa.types.TypeEngine:
    return sa.JSON(none_as_null=True).with_variant(postgresql.JSONB(none_as_null=True), "postgresql")


def _big_id() -> sa.Column:
    return sa.Column("id", sa.BigInteger().with_variant(sa.Integer(), "sqlite"), autoincrement=True,
                     nullable=False)


def _secret_columns() -> list[sa.Column]:
    return [sa.Column("prefix", sa.String(32), nullable=False),
            sa.Column("salt", sa.String(64), nullable=False),
            sa.Column("secret_hash", sa.String(128), nullable=False),
            sa.Column("created_at", sa.Float(), nullable=False),
            sa.Column("revoked_at", sa.Float(), nullable=True)]


def upgrade() -> None:
    op.create_table(
        "tenants",
        sa.Column("id", sa.String(64), nullable=False),
        sa.Column("name", sa.String(200), nullable=False),
        sa.Column("cache_salt", sa.String(64), nullable=False),
        sa.Column("created_at", sa.Float(), nullable=False),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_tenants")),
        sa.UniqueConstraint("name", name=op.f("uq_tenants_name")),
    )
    op.create_table(
        "api_keys",
        sa.Column("id", sa.String(64), nullable=False),
        sa.Column("tenant_id", sa.String(64), nullable=False),
        sa.Column("name", sa.String(200), nullable=False),
        *_secret_columns(),
        sa.ForeignKeyConstraint(["tenant_id"], ["tenants.id"], name=op.f("fk_api_keys_tenant_id_tenants"),
                                ondelete="CASCADE"),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_api_keys")),
    )
    op.create_index(op.f("ix_api_keys_prefix"), "api_keys", ["prefix"])
    op.create_index(op.f("ix_api_keys_tenant_id"), "api_keys", ["tenant_id"])
    op.create_table(
        "tenant_policies",
        sa.Column("tenant_id", sa.String(64), nullable=False),
        sa.Column("requests_per_minute", sa.Integer(), nullable=True),
        sa.Column("tokens_per_minute", sa.Integer(), nullable=True),
        sa.Column("max_concurrent", sa.Integer(), nullable=True),
        sa.Column("priority", sa.Integer(), nullable=False),
        sa.Column("allowed_models", _json(), nullable=True),
        sa.Column("max_active_branches", sa.Integer(), nullable=True),
        sa.Column("kv_retention_blocks", sa.Integer(), nullable=True),
        sa.Column("cache_isolation", sa.Boolean(), nullable=False),
        sa.Column("updated_at", sa.Float(), nullable=False),
        sa.CheckConstraint("priority >= 0 AND priority <= 3", name=op.f("ck_tenant_policies_priority_range")),
        sa.ForeignKeyConstraint(["tenant_id"], ["tenants.id"],
                                name=op.f("fk_tenant_policies_tenant_id_tenants"), ondelete="CASCADE"),
        sa.PrimaryKeyConstraint("tenant_id", name=op.f("pk_tenant_policies")),
    )
    op.create_table(
        "planner_decisions",
        _big_id(),
        sa.Column("t", sa.Float(), nullable=False),
        sa.Column("planner", sa.String(64), nullable=False),
        sa.Column("mode", sa.String(16), nullable=False),
        sa.Column("current_prefill", sa.Integer(), nullable=False),
        sa.Column("current_decode", sa.Integer(), nullable=False),
        sa.Column("chosen_prefill", sa.Integer(), nullable=False),
        sa.Column("chosen_decode", sa.Integer(), nullable=False),
        sa.Column("acted", sa.Boolean(), nullable=False),
        sa.Column("confidence", sa.Float(), nullable=False),
        sa.Column("reason", sa.Text(), nullable=False),
        sa.Column("inputs", _json(), nullable=True),
        sa.Column("predictions", _json(), nullable=True),
        sa.Column("actions", _json(), nullable=True),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_planner_decisions")),
    )
    op.create_index(op.f("ix_planner_decisions_t"), "planner_decisions", ["t"])
    op.create_table(
        "switch_events",
        _big_id(),
        sa.Column("t", sa.Float(), nullable=False),
        sa.Column("node_id", sa.String(200), nullable=False),
        sa.Column("from_phase", sa.String(16), nullable=False),
        sa.Column("to_phase", sa.String(16), nullable=False),
        sa.Column("reason", sa.Text(), nullable=False),
        sa.Column("who", sa.String(200), nullable=False),
        sa.Column("drain_s", sa.Float(), nullable=False),
        sa.Column("migrate_s", sa.Float(), nullable=False),
        sa.Column("total_s", sa.Float(), nullable=False),
        sa.Column("outcome", sa.String(16), nullable=False),
        sa.Column("detail", sa.Text(), nullable=False),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_switch_events")),
    )
    op.create_index(op.f("ix_switch_events_t"), "switch_events", ["t"])
    op.create_index(op.f("ix_switch_events_node_id"), "switch_events", ["node_id"])
    op.create_table(
        "overrides",
        sa.Column("key", sa.String(250), nullable=False),
        sa.Column("value", _json(), nullable=True),
        sa.Column("updated_at", sa.Float(), nullable=False),
        sa.Column("updated_by", sa.String(200), nullable=False),
        sa.PrimaryKeyConstraint("key", name=op.f("pk_overrides")),
    )
    op.create_table(
        "audit_log",
        _big_id(),
        sa.Column("t", sa.Float(), nullable=False),
        sa.Column("actor", sa.String(200), nullable=False),
        sa.Column("action", sa.String(100), nullable=False),
        sa.Column("target", sa.String(300), nullable=False),
        sa.Column("before", _json(), nullable=True),
        sa.Column("after", _json(), nullable=True),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_audit_log")),
    )
    op.create_index(op.f("ix_audit_log_t"), "audit_log", ["t"])
    op.create_table(
        "usage_minutes",
        sa.Column("tenant_id", sa.String(64), nullable=False),
        sa.Column("minute", sa.BigInteger(), nullable=False),
        sa.Column("model", sa.String(200), nullable=False),
        sa.Column("requests", sa.BigInteger(), nullable=False),
        sa.Column("prompt_tokens", sa.BigInteger(), nullable=False),
        sa.Column("cached_tokens", sa.BigInteger(), nullable=False),
        sa.Column("completion_tokens", sa.BigInteger(), nullable=False),
        sa.PrimaryKeyConstraint("tenant_id", "minute", "model", name=op.f("pk_usage_minutes")),
    )
    op.create_table(
        "admin_tokens",
        sa.Column("id", sa.String(64), nullable=False),
        sa.Column("name", sa.String(200), nullable=False),
        sa.Column("role", sa.String(16), nullable=False),
        *_secret_columns(),
        sa.CheckConstraint("role IN ('viewer', 'operator')", name=op.f("ck_admin_tokens_role_known")),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_admin_tokens")),
    )
    op.create_index(op.f("ix_admin_tokens_prefix"), "admin_tokens", ["prefix"])


def downgrade() -> None:
    op.drop_index(op.f("ix_admin_tokens_prefix"), table_name="admin_tokens")
    op.drop_table("admin_tokens")
    op.drop_table("usage_minutes")
    op.drop_index(op.f("ix_audit_log_t"), table_name="audit_log")
    op.drop_table("audit_log")
    op.drop_table("overrides")
    op.drop_index(op.f("ix_switch_events_node_id"), table_name="switch_events")
    op.drop_index(op.f("ix_switch_events_t"), table_name="switch_events")
    op.drop_table("switch_events")
    op.drop_index(op.f("ix_planner_decisions_t"), table_name="planner_decisions")
    op.drop_table("planner_decisions")
    op.drop_table("tenant_policies")
    op.drop_index(op.f("ix_api_keys_tenant_id"), table_name="api_keys")
    op.drop_index(op.f("ix_api_keys_prefix"), table_name="api_keys")
    op.drop_table("api_keys")
    op.drop_table("tenants")
