"""lanes: ordered delivery per user (deliveries.lane, the lanes table)

Revision ID: 0010
Revises: 0009
Create Date: 2026-11-25

A delivery to a destination with `ordering = "per_user"` names its lane; the lanes table
names each busy lane's head, the one delivery of the lane that may be claimed. The others
wait with status `queued`, found through a partial index lowest id first. Adding a nullable
column without a default rewrites no rows on either backend; existing deliveries have no
lane and are sent as before.
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0010"
down_revision = "0009"
branch_labels = None
depends_on = None

_ID = sa.BigInteger().with_variant(sa.Integer(), "sqlite")


def upgrade() -> None:
    op.add_column("deliveries", sa.Column("lane", sa.Text()))
    op.create_index(
        "ix_deliveries_queued",
        "deliveries",
        ["destination", "lane", "id"],
        sqlite_where=sa.text("status = 'queued'"),
        postgresql_where=sa.text("status = 'queued'"),
    )
    op.create_table(
        "lanes",
        sa.Column("destination", sa.String(200), primary_key=True),
        sa.Column("lane", sa.Text(), primary_key=True),
        sa.Column("head", _ID, nullable=False),
    )
    op.create_index("ix_lanes_head", "lanes", ["head"], unique=True)


def downgrade() -> None:
    op.drop_index("ix_lanes_head", table_name="lanes")
    op.drop_table("lanes")
    op.drop_index("ix_deliveries_queued", table_name="deliveries")
    with op.batch_alter_table("deliveries") as batch:
        batch.drop_column("lane")
