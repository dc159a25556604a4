"""Alembic environment: efd passes the connection in (see efd.store.migrate)."""

from __future__ import annotations

from alembic import context

from efd.store.schema import metadata

connection = context.config.attributes.get("connection")
if connection is None:
    raise RuntimeError("run migrations with `efd migrate`, which supplies the connection")

context.configure(
    connection=connection,
    target_metadata=metadata,
    render_as_batch=connection.dialect.name == "sqlite",
)
with context.begin_transaction():
    context.run_migrations()
