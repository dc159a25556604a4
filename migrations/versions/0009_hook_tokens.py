"""hook_tokens: the token buckets of rate-limited hooks

Revision ID: 0009
Revises: 0008
Create Date: 2026-11-25

One row per hook with a max_per_second (docs/delivery.md#rate-limits), shared by every daemon
on the store, keyed by a hash of destination and URL (no URL is written). A new table: no
existing row is touched.
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0009"
down_revision = "0008"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "hook_tokens",
        sa.Column("key", sa.String(64), primary_key=True),
        sa.Column("tokens", sa.Float(), nullable=False),
        sa.Column("updated_at", sa.Float(), nullable=False),
    )


def downgrade() -> None:
    op.drop_table("hook_tokens")
