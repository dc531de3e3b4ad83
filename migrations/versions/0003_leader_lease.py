"""Planner leadership lease.

Revision ID: 0003
Revises: 0002
Create Date: 2026-02-01

One row per lease (`name`, "planner" is the only one): who holds it, the
leadership term (only ever grows: workers fence orders by it) and when it
expires on the database's clock. Seeded with the "planner" row at term 0 so
claiming it is always a single conditional UPDATE.
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0003"
down_revision = "0002"
branch_labels = None
depends_on = None


def upgrade() -> None:
    table = op.create_table(
        "leader_lease",
        sa.Column("name", sa.String(64), nullable=False),
        sa.Column("holder", sa.String(200), nullable=False),
        sa.Column("term", sa.BigInteger(), nullable=False),
        sa.Column("expires_at", sa.Float(), nullable=False),
        sa.Column("renewed_at", sa.Float(), nullable=False),
        sa.PrimaryKeyConstraint("name", name=op.f("pk_leader_lease")),
    )
    op.bulk_insert(table, [{"name": "planner", "holder": "", "term": 0, "expires_at": 0.0, "renewed_at": 0.0}])


def downgrade() -> None:
    op.drop_table("leader_lease")
