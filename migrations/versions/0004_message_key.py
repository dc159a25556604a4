"""messages: deduplicate on a 64-bit key instead of a text index

Revision ID: 0004
Revises: 0003
Create Date: 2026-11-21

The text index on (source, message_id) took a random page per insert and two thirds of
SQLite's insert rate; see efd/store/dedupe.py. Existing rows get their key here.
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

from efd.store.dedupe import message_key

revision = "0004"
down_revision = "0003"
branch_labels = None
depends_on = None

_BATCH = 10_000


def upgrade() -> None:
    op.add_column("messages", sa.Column("message_key", sa.BigInteger()))
    conn = op.get_bind()
    last = 0
    while True:
        rows = conn.execute(
            sa.text(
                "SELECT id, source, message_id FROM messages WHERE id > :last ORDER BY id LIMIT :n"
            ),
            {"last": last, "n": _BATCH},
        ).all()
        if not rows:
            break
        conn.execute(
            sa.text("UPDATE messages SET message_key = :key WHERE id = :id"),
            [{"key": message_key(source, mid), "id": pk} for pk, source, mid in rows],
        )
        last = rows[-1][0]
    op.create_index("ix_messages_message_key", "messages", ["message_key"])
    op.drop_index("ix_messages_source_message_id", table_name="messages")


def downgrade() -> None:
    op.create_index("ix_messages_source_message_id", "messages", ["source", "message_id"])
    op.drop_index("ix_messages_message_key", table_name="messages")
    op.drop_column("messages", "message_key")
