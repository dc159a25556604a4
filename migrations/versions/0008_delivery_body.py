"""deliveries: body, the body a destination's field filters made for it

Revision ID: 0008
Revises: 0007
Create Date: 2026-11-25

A drop_fields or allow_fields filter (docs/filters.md) gives that destination a body of its
own, decided at routing time and signed as stored. NULL, the common case: the delivery sends
its message's body. Adding a nullable column without a default rewrites no rows on either
backend.
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


def downgrade() -> None:
    with op.batch_alter_table("deliveries") as batch:
        batch.drop_column("body")
