"""postgresql_keys: no declared foreign keys on deliveries.message_pk and attempts.delivery_id
(PostgreSQL only)

Revision ID: 0011
Revises: 0010
Create Date: 2026-11-29

On PostgreSQL each declared key made every insert of a delivery and of an attempt look up
and lock its parent row: two checks per delivered event, a large share of the server's work
(measured in bench/LOG.md, 2026-11-29). efd keeps the relation itself: a message's
deliveries are inserted in its transaction, retention deletes attempts, deliveries and
messages explicitly in one transaction, and a claim that finds a delivery's message gone
finishes it as failed (docs/decisions.md#no-foreign-keys-on-postgresql). Dropping a
constraint takes a brief exclusive lock and rewrites nothing. SQLite keeps its keys: checking
them costs nothing measurable there, and SQLite cannot drop one without rebuilding the table.
"""

from __future__ import annotations

from alembic import op

revision = "0011"
down_revision = "0010"
branch_labels = None
depends_on = None

# PostgreSQL's names for the keys 0001 declared without a name.
_KEYS = (
    ("attempts", "attempts_delivery_id_fkey", "delivery_id", "deliveries"),
    ("deliveries", "deliveries_message_pk_fkey", "message_pk", "messages"),
)


def upgrade() -> None:
    if op.get_bind().dialect.name != "postgresql":
        return
    for table, name, _, _ in _KEYS:
        op.execute(f"ALTER TABLE {table} DROP CONSTRAINT IF EXISTS {name}")


def downgrade() -> None:
    if op.get_bind().dialect.name != "postgresql":
        return
    # NOT VALID: rows written meanwhile are not checked (a full scan under lock); new ones are.
    for table, name, column, parent in _KEYS:
        op.execute(
            f"ALTER TABLE {table} ADD CONSTRAINT {name} FOREIGN KEY ({column})"
            f" REFERENCES {parent} (id) ON DELETE CASCADE NOT VALID"
        )
