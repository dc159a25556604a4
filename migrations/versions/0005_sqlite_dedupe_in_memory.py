"""messages: on SQLite, the writer indexes message_key in memory, not on disk

Revision ID: 0005
Revises: 0004
Create Date: 2026-11-21

Message ids are random, so an on-disk index of their keys takes a write at a random page
per message: with a million messages stored, SQLite ingested at 78-80 % of the empty
store's rate (paired runs). The SQLite writer now keeps the last 24 hours of keys in memory,
rebuilt from this table when it connects (efd/store/dedupe.py). PostgreSQL keeps the table
index: several processes share it.
"""

from __future__ import annotations

from alembic import op

revision = "0005"
down_revision = "0004"
branch_labels = None
depends_on = None


def upgrade() -> None:
    if op.get_bind().dialect.name == "sqlite":
        op.drop_index("ix_messages_message_key", table_name="messages")


def downgrade() -> None:
    if op.get_bind().dialect.name == "sqlite":
        op.create_index("ix_messages_message_key", "messages", ["message_key"])
