"""messages: original_timestamp, the client's timestamp before the clock-skew correction

Revision ID: 0007
Revises: 0006
Create Date: 2026-11-25

`timestamp` holds the corrected time (timestamp + receivedAt - sentAt); the client's own is
kept beside it, as Segment's originalTimestamp. Nullable: NULL where no correction was made,
and for the rows stored before this revision, whose client time was not kept. Adding a
nullable column without a default rewrites no rows on either backend.
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0007"
down_revision = "0006"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.add_column("messages", sa.Column("original_timestamp", sa.Float()))


def downgrade() -> None:
    with op.batch_alter_table("messages") as batch:
        batch.drop_column("original_timestamp")
