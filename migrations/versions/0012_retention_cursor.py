"""retention_cursor: retention walks messages from a cursor (jobs.cursor_pk) and keeps the ids
it had to leave (retention_kept)

Revision ID: 0012
Revises: 0011
Create Date: 2026-12-01

Retention's purge looked for finished messages from the start of the table at every batch,
reading every delivery of the messages it could not purge yet: its batches grew with the rows
stored. It now walks messages by primary key from a cursor, never from the start, and notes
the messages it passed with work still pending in retention_kept, which it looks at again at
each run (docs/decisions.md#retention-walks-from-a-cursor). Adding a nullable column without a
default and creating an empty table rewrite no rows on either backend: the upgrade holds an
exclusive lock on the small jobs table for as long as the ALTER takes, and none on messages,
deliveries or attempts. No cursor yet means the first run walks from the start, as before.
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0012"
down_revision = "0011"
branch_labels = None
depends_on = None

_ID = sa.BigInteger().with_variant(sa.Integer(), "sqlite")


def upgrade() -> None:
    op.add_column("jobs", sa.Column("cursor_pk", _ID))
    op.create_table(
        "retention_kept",
        sa.Column("message_pk", _ID, primary_key=True, autoincrement=False),
    )


def downgrade() -> None:
    op.drop_table("retention_kept")
    with op.batch_alter_table("jobs") as batch:
        batch.drop_column("cursor_pk")
