"""deliveries: replay_of, a delivery that sends a message again

Revision ID: 0006
Revises: 0005
Create Date: 2026-11-24

A replay (`efd replay`, POST /admin/replay) is a new delivery row of the same message and
destination, pointing at the delivery it repeats. No constraint made (message, destination)
unique, so nothing else changes. No foreign key: a replay and its original share their
message, so retention deletes them together, and SQLite could only add one by copying the
table.
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0006"
down_revision = "0005"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.add_column(
        "deliveries",
        sa.Column("replay_of", sa.BigInteger().with_variant(sa.Integer(), "sqlite")),
    )


def downgrade() -> None:
    with op.batch_alter_table("deliveries") as batch:
        batch.drop_column("replay_of")
