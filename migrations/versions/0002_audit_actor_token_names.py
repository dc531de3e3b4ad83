"""Audit rows carry the admin token id; active admin token names unique per role.

Revision ID: 0002
Revises: 0001
Create Date: 2026-12-02

- `audit_log.actor_id`: the id of the admin token that acted (`system` for
  start-up actions; NULL on rows written before this revision). A name
  alone is ambiguous: two tokens could share one.
- A partial unique index on `admin_tokens (role, name)` over the active
  (unrevoked) tokens. Active duplicates that already exist are renamed
  first, the oldest keeping its name, the others getting their id appended
  (`ci` -> `ci (adm_...)`), so the upgrade never fails on existing data.
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0002"
down_revision = "0001"
branch_labels = None
depends_on = None

ACTIVE = sa.text("revoked_at IS NULL")
INDEX = "uq_admin_tokens_role_name_active"


def _rename_active_duplicates() -> None:
    conn = op.get_bind()
    tokens = sa.table(
        "admin_tokens",
        sa.column("id", sa.String),
        sa.column("name", sa.String),
        sa.column("role", sa.String),
        sa.column("created_at", sa.Float),
        sa.column("revoked_at", sa.Float),
    )
    rows = conn.execute(
        sa.select(tokens.c.id, tokens.c.name, tokens.c.role)
        .where(tokens.c.revoked_at.is_(None))
        .order_by(tokens.c.created_at, tokens.c.id)
    ).all()
    seen: set[tuple[str, str]] = set()
    for token_id, name, role in rows:
        if (role, name) in seen:
            suffix = f" ({token_id})"
            conn.execute(
                tokens.update().where(tokens.c.id == token_id).values(name=name[: 200 - len(suffix)] + suffix)
            )
        else:
            seen.add((role, name))


def upgrade() -> None:
    op.add_column("audit_log", sa.Column("actor_id", sa.String(64), nullable=True))
    op.create_index(op.f("ix_audit_log_actor_id"), "audit_log", ["actor_id"])
    _rename_active_duplicates()
    op.create_index(INDEX, "admin_tokens", ["role", "name"], unique=True, postgresql_where=ACTIVE, sqlite_where=ACTIVE)


def downgrade() -> None:
    op.drop_index(INDEX, table_name="admin_tokens")
    op.drop_index(op.f("ix_audit_log_actor_id"), table_name="audit_log")
    with op.batch_alter_table("audit_log") as batch:  # SQLite cannot drop a column in place
        batch.drop_column("actor_id")
