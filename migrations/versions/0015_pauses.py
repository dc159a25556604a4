"""pauses: destinations and hooks an operator paused, or efd disabled

Revision ID: 0015
Revises: 0014
Create Date: 2026-12-04

One row per paused or disabled target (docs/operators.md#pause-resume-and-auto-disable): a
whole destination (hook NULL) or one of its hooks, by its position in the configuration
counted from 1. One row per target on both backends: a unique key on (destination, hook),
and, since NULLs never collide in one, a partial unique index on destination for the whole
destination's row. A new table: no rows are rewritten.
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0015"
down_revision = "0014"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "pauses",
        sa.Column(
            "id",
            sa.BigInteger().with_variant(sa.Integer(), "sqlite"),
            primary_key=True,
            autoincrement=True,
        ),
        sa.Column("destination", sa.String(200), nullable=False),
        sa.Column("hook", sa.Integer()),
        sa.Column("kind", sa.String(10), nullable=False),
        sa.Column("reason", sa.Text()),
        sa.Column("since", sa.Float(), nullable=False),
    )
    op.create_index("ux_pauses_hook", "pauses", ["destination", "hook"], unique=True)
    op.create_index(
        "ux_pauses_destination",
        "pauses",
        ["destination"],
        unique=True,
        sqlite_where=sa.text("hook IS NULL"),
        postgresql_where=sa.text("hook IS NULL"),
    )


def downgrade() -> None:
    op.drop_index("ux_pauses_destination", table_name="pauses")
    op.drop_index("ux_pauses_hook", table_name="pauses")
    op.drop_table("pauses")
