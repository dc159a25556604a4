"""deliveries: body, the body a destination's field filters made for it; hook_tokens, the
token buckets of rate-limited hooks

Revision ID: 0008
Revises: 0007
Create Date: 2026-11-25

A drop_fields or allow_fields filter (docs/filters.md) gives that destination a body of its
own, decided at routing time and signed as stored. NULL, the common case: the delivery sends
its message's body. Adding a nullable column without a default rewrites no rows on either
backend.

hook_tokens holds one row per rate-limited hook (docs/delivery.md#rate-limits), keyed by a hash
of destination and URL.
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0008"
down_revision = "0007"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.add_column("deliveries", sa.Column("body", sa.Text()))
    op.create_table(
        "hook_tokens",
        sa.Column("key", sa.String(64), primary_key=True),
        sa.Column("tokens", sa.Float(), nullable=False),
        sa.Column("updated_at", sa.Float(), nullable=False),
    )


def downgrade() -> None:
    op.drop_table("hook_tokens")
    with op.batch_alter_table("deliveries") as batch:
        batch.drop_column("body")
