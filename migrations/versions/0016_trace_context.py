"""messages: trace_context, the W3C trace context a message was accepted under

Revision ID: 0016
Revises: 0015
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

REVISION = "0016"

revision = REVISION
down_revision = "0015"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.add_column("messages", sa.Column("trace_context", sa.Text()))


def downgrade() -> None:
    with op.batch_alter_table("messages") as batch:
        batch.drop_column("trace_context")
