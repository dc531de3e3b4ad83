"""Planner decisions carry a move's predicted and realized gain.

Revision ID: 0004
Revises: 0003
Create Date: 2026-12-03

`predicted_gain`: the gain fraction the planner predicted for a model move
(on the decision that made it, and again on the one that checked it);
`realized_gain`: what the move delivered once it had settled, on the
decision that checked it (`planner.verification`). Null elsewhere.
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0004"
down_revision = "0003"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("planner_decisions") as batch:
        batch.add_column(sa.Column("predicted_gain", sa.Float(), nullable=True))
        batch.add_column(sa.Column("realized_gain", sa.Float(), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("planner_decisions") as batch:
        batch.drop_column("realized_gain")
        batch.drop_column("predicted_gain")
