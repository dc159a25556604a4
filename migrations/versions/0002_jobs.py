"""jobs: once-per-cluster periodic jobs

Revision ID: 0002
Revises: 0001
Create Date: 2026-11-21
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0002"
down_revision = "0001"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "jobs",
        sa.Column("name", sa.String(100), primary_key=True),
        sa.Column("last_run_at", sa.Float(), nullable=False),
        sa.Column("owner", sa.String(80)),
    )


def downgrade() -> None:
    op.drop_table("jobs")
