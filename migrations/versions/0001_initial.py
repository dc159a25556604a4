"""messages, deliveries and attempts

Revision ID: 0001
Revises:
Create Date: 2026-11-21
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0001"
down_revision = None
branch_labels = None
depends_on = None

Id = sa.BigInteger().with_variant(sa.Integer(), "sqlite")


def upgrade() -> None:
    op.create_table(
        "messages",
        sa.Column("id", Id, primary_key=True, autoincrement=True),
        sa.Column("source", sa.String(200), nullable=False),
        sa.Column("message_id", sa.String(100), nullable=False),
        sa.Column("type", sa.String(16), nullable=False),
        sa.Column("user_id", sa.Text()),
        sa.Column("anonymous_id", sa.Text()),
        sa.Column("event", sa.Text()),
        sa.Column("timestamp", sa.Float(), nullable=False),
        sa.Column("received_at", sa.Float(), nullable=False),
        sa.Column("body", sa.Text()),
    )
    op.create_index("ix_messages_source_message_id", "messages", ["source", "message_id"])
    op.create_index("ix_messages_received_at", "messages", ["received_at"])

    op.create_table(
        "deliveries",
        sa.Column("id", Id, primary_key=True, autoincrement=True),
        sa.Column(
            "message_pk", Id, sa.ForeignKey("messages.id", ondelete="CASCADE"), nullable=False
        ),
        sa.Column("destination", sa.String(200), nullable=False),
        sa.Column("status", sa.String(10), nullable=False),
        sa.Column("attempts", sa.Integer(), nullable=False, server_default=sa.text("0")),
        sa.Column("created_at", sa.Float(), nullable=False),
        sa.Column("first_attempt_at", sa.Float()),
        sa.Column("next_attempt_at", sa.Float()),
        sa.Column("finished_at", sa.Float()),
        sa.Column("failed_hooks", sa.Text()),
        sa.Column("last_error", sa.Text()),
        sa.Column("lease_owner", sa.String(80)),
        sa.Column("lease_token", sa.Integer(), nullable=False, server_default=sa.text("0")),
    )
    op.create_index(
        "ix_deliveries_due",
        "deliveries",
        ["destination", "next_attempt_at"],
        sqlite_where=sa.text("status = 'pending'"),
        postgresql_where=sa.text("status = 'pending'"),
    )
    op.create_index("ix_deliveries_message_pk", "deliveries", ["message_pk"])
    op.create_index("ix_deliveries_status_finished_at", "deliveries", ["status", "finished_at"])

    op.create_table(
        "attempts",
        sa.Column("id", Id, primary_key=True, autoincrement=True),
        sa.Column(
            "delivery_id", Id, sa.ForeignKey("deliveries.id", ondelete="CASCADE"), nullable=False
        ),
        sa.Column("hook_url", sa.Text(), nullable=False),
        sa.Column("attempted_at", sa.Float(), nullable=False),
        sa.Column("duration_ms", sa.Float(), nullable=False),
        sa.Column("outcome", sa.String(8), nullable=False),
        sa.Column("status_code", sa.Integer()),
        sa.Column("error_class", sa.String(16)),
        sa.Column("error", sa.Text()),
        sa.Column("response_head", sa.Text()),
    )
    op.create_index("ix_attempts_delivery_id", "attempts", ["delivery_id"])
    op.create_index("ix_attempts_attempted_at", "attempts", ["attempted_at"])


def downgrade() -> None:
    op.drop_table("attempts")
    op.drop_table("deliveries")
    op.drop_table("messages")
