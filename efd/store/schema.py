"""The tables. Times are UNIX seconds (float) so SQLite and PostgreSQL compare them alike.

messages    one row per accepted message; `body` is the exact webhook body (JSON text).
deliveries  one row per (message, destination): the delivery's state machine.
attempts    one row per POST to one hook URL: the audit log.
"""

from __future__ import annotations

from sqlalchemy import (
    BigInteger,
    Column,
    Float,
    ForeignKey,
    Index,
    Integer,
    MetaData,
    String,
    Table,
    Text,
    text,
)

metadata = MetaData()

# BIGINT on PostgreSQL, INTEGER (the rowid alias) on SQLite.
Id = BigInteger().with_variant(Integer(), "sqlite")

messages = Table(
    "messages",
    metadata,
    Column("id", Id, primary_key=True, autoincrement=True),
    Column("source", String(200), nullable=False),
    Column("message_id", String(100), nullable=False),  # Segment's messageId
    Column("type", String(16), nullable=False),
    Column("user_id", Text),
    Column("anonymous_id", Text),
    Column("event", Text),  # track: the event name
    Column("timestamp", Float, nullable=False),  # skew-corrected event time
    Column("received_at", Float, nullable=False),
    Column("body", Text),  # NULL once purged by a deletion request
    Index("ix_messages_source_message_id", "source", "message_id"),
    Index("ix_messages_received_at", "received_at"),
)

PENDING = "pending"
DELIVERED = "delivered"
FAILED = "failed"
EXPIRED = "expired"

deliveries = Table(
    "deliveries",
    metadata,
    Column("id", Id, primary_key=True, autoincrement=True),
    Column("message_pk", Id, ForeignKey("messages.id", ondelete="CASCADE"), nullable=False),
    Column("destination", String(200), nullable=False),
    Column("status", String(10), nullable=False),  # pending|delivered|failed|expired
    Column("attempts", Integer, nullable=False, server_default=text("0")),  # rounds sent
    Column("created_at", Float, nullable=False),
    Column("first_attempt_at", Float),
    # When pending: when the next round is due. A claim pushes it to the lease's end, so a
    # delivery whose worker died becomes due again by itself.
    Column("next_attempt_at", Float),
    Column("finished_at", Float),
    Column("failed_hooks", Text),  # JSON list of hook URLs that failed for good
    Column("last_error", Text),
    Column("lease_owner", String(80)),  # the process holding the claim, NULL when none
    Column("lease_token", Integer, nullable=False, server_default=text("0")),  # fencing
    Index(
        "ix_deliveries_due",
        "destination",
        "next_attempt_at",
        sqlite_where=text("status = 'pending'"),
        postgresql_where=text("status = 'pending'"),
    ),
    Index("ix_deliveries_message_pk", "message_pk"),
    Index("ix_deliveries_status_finished_at", "status", "finished_at"),
)

attempts = Table(
    "attempts",
    metadata,
    Column("id", Id, primary_key=True, autoincrement=True),
    Column("delivery_id", Id, ForeignKey("deliveries.id", ondelete="CASCADE"), nullable=False),
    Column("hook_url", Text, nullable=False),
    Column("attempted_at", Float, nullable=False),
    Column("duration_ms", Float, nullable=False),
    Column("outcome", String(8), nullable=False),  # success|retry|fail
    Column("status_code", Integer),
    Column("error_class", String(16)),  # timeout|connect|dns|reset|protocol|tls|blocked|…
    Column("error", Text),
    Column("response_head", Text),  # the first bytes of the response body
    Index("ix_attempts_delivery_id", "delivery_id"),
    Index("ix_attempts_attempted_at", "attempted_at"),
)

# Periodic jobs that must run once per cluster, not once per process: a process runs a job
# only after moving its last_run_at forward, which one process at a time can do.
jobs = Table(
    "jobs",
    metadata,
    Column("name", String(100), primary_key=True),
    Column("last_run_at", Float, nullable=False),
    Column("owner", String(80)),
)
