"""batches: batched delivery (the batches and batch_routes tables, deliveries.batch_id,
attempts.batch_id)

Revision ID: 0014
Revises: 0013
Create Date: 2026-12-04

An action may send many of its deliveries in one request (docs/actions.md#batches): a
`batches` row holds that request's exact body, webhook-id and state, found when due through a
partial index of pending rows, as deliveries are. Its members name it in deliveries.batch_id
and its requests in attempts.batch_id, each with a partial index of the rows that have one.
`batch_routes` holds a row per batched route, which forming locks. Adding nullable columns
without a default rewrites no rows on either backend; existing deliveries and attempts have
no batch and are sent as before.
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

REVISION = "0014"

revision = REVISION
down_revision = "0013"
branch_labels = None
depends_on = None

_ID = sa.BigInteger().with_variant(sa.Integer(), "sqlite")


def _partial(condition: str) -> dict[str, sa.TextClause]:
    return {"sqlite_where": sa.text(condition), "postgresql_where": sa.text(condition)}


def upgrade() -> None:
    op.create_table(
        "batches",
        sa.Column("id", _ID, primary_key=True, autoincrement=True),
        sa.Column("route", sa.String(200), nullable=False),
        sa.Column("body", sa.Text(), nullable=False),
        sa.Column("webhook_id", sa.String(40), nullable=False),
        sa.Column("status", sa.String(10), nullable=False),
        sa.Column("attempts", sa.Integer(), nullable=False, server_default=sa.text("0")),
        sa.Column("created_at", sa.Float(), nullable=False),
        sa.Column("first_attempt_at", sa.Float()),
        sa.Column("next_attempt_at", sa.Float()),
        sa.Column("finished_at", sa.Float()),
        sa.Column("last_error", sa.Text()),
        sa.Column("lease_owner", sa.String(80)),
        sa.Column("lease_token", sa.Integer(), nullable=False, server_default=sa.text("0")),
    )
    op.create_index(
        "ix_batches_due", "batches", ["route", "next_attempt_at"], **_partial("status = 'pending'")
    )
    op.create_table("batch_routes", sa.Column("route", sa.String(200), primary_key=True))
    op.add_column("deliveries", sa.Column("batch_id", _ID))
    op.create_index(
        "ix_deliveries_batch_id", "deliveries", ["batch_id"], **_partial("batch_id IS NOT NULL")
    )
    op.add_column("attempts", sa.Column("batch_id", _ID))
    op.create_index(
        "ix_attempts_batch_id", "attempts", ["batch_id"], **_partial("batch_id IS NOT NULL")
    )


def downgrade() -> None:
    op.drop_index("ix_attempts_batch_id", table_name="attempts")
    with op.batch_alter_table("attempts") as batch:
        batch.drop_column("batch_id")
    op.drop_index("ix_deliveries_batch_id", table_name="deliveries")
    with op.batch_alter_table("deliveries") as batch:
        batch.drop_column("batch_id")
    op.drop_table("batch_routes")
    op.drop_index("ix_batches_due", table_name="batches")
    op.drop_table("batches")
