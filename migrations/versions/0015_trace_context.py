"""messages: trace_context, the W3C trace context a message was accepted under

Revision ID: 0015_trace_context
Revises: 0014_batches
Create Date: 2026-12-04

With OpenTelemetry traces on (docs/telemetry.md), ingestion stores with each message the
traceparent (and tracestate) of the span that accepted it, so that every delivery attempt's
span links to it however much later, and from whichever daemon, it is sent. NULL when
telemetry is off, and for the messages stored before. Adding a nullable column without a
default rewrites no rows on either backend.
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

# The revision's id, named once: a parallel migration may take this number at merge.
REVISION = "0015_trace_context"

revision = REVISION
down_revision = "0014_batches"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.add_column("messages", sa.Column("trace_context", sa.Text()))


def downgrade() -> None:
    with op.batch_alter_table("messages") as batch:
        batch.drop_column("trace_context")
