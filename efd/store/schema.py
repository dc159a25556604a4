"""The tables. Times are UNIX seconds (float) so SQLite and PostgreSQL compare them alike.

messages    one row per accepted message; `body` is the exact webhook body (JSON text).
deliveries  one row per (message, destination), and one per replay: the state machine.
attempts    one row per POST to one hook URL: the audit log.
jobs        once-per-cluster periodic jobs; and the row readiness probes write.
retention_kept  messages retention walked past that still had work; it looks at them again.
lanes       per ordered destination and lane (user): the delivery at its head.
batches     one row per batched request (many deliveries in one body): the state machine of
            a batch, which its members share (efd/store/batches.py).
batch_routes  one row per batched route, locked while a daemon forms its batches.
pauses      destinations and hooks an operator paused or efd disabled (efd/store/pauses.py).

profiles, identities, events, computations, computed_values: audiences and computed traits.
regulations, regulation_subjects, suppressions: deletion requests.
"""

from __future__ import annotations

from sqlalchemy import (
    BigInteger,
    Column,
    Float,
    ForeignKey,
    ForeignKeyConstraint,
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


def _sqlite_key(column: str, parent: str) -> ForeignKeyConstraint:
    """A declared foreign key on SQLite only: on PostgreSQL checking it at every insert was
    a large share of the server's work per delivered event, and efd keeps the relation
    itself (migration 0011, docs/decisions.md#no-foreign-keys-on-postgresql)."""
    key = ForeignKeyConstraint([column], [parent], ondelete="CASCADE")
    return key.ddl_if(dialect="sqlite")


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
    # The client's own timestamp when `timestamp` is its clock-skew correction (a sentAt
    # came with it); NULL when `timestamp` is the client's as sent, or receipt time.
    Column("original_timestamp", Float),
    Column("received_at", Float, nullable=False),
    Column("body", Text),  # NULL once purged by a deletion request
    # The W3C trace context of the ingestion span that accepted it (efd/observe/tracing.py),
    # which each delivery attempt's span links to; NULL when telemetry is off.
    Column("trace_context", Text),
    # efd/store/dedupe.py: hash of (source, message_id), set on every insert. Nullable only
    # because SQLite cannot add a NOT NULL column to a table that has rows.
    Column("message_key", BigInteger),
    # On SQLite the writer indexes the keys in memory instead (efd/store/backends/sqlite.py).
    Index("ix_messages_message_key", "message_key").ddl_if(dialect="postgresql"),
    Index("ix_messages_received_at", "received_at"),
)

deliveries = Table(
    "deliveries",
    metadata,
    Column("id", Id, primary_key=True, autoincrement=True),
    Column("message_pk", Id, nullable=False),
    Column("destination", String(200), nullable=False),
    Column("status", String(10), nullable=False),  # efd.records.DeliveryStatus
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
    Column("replay_of", Id),  # a replay: the delivery it sends again (same message)
    # The body a destination's field filters or an action's mapping made; NULL: the
    # message's body (and once a deletion request purged it).
    Column("body", Text),
    # The lane of a delivery to an ordered destination (efd/delivery/lanes.py); NULL: none.
    Column("lane", Text),
    # An action's delivery: the URL rendered for its message at routing; NULL: the route's
    # hook URLs.
    Column("url", Text),
    # The batch that carries it (batches.id); NULL: sent on its own, or not in one yet.
    Column("batch_id", Id),
    Index(
        "ix_deliveries_due",
        "destination",
        "next_attempt_at",
        sqlite_where=text("status = 'pending'"),
        postgresql_where=text("status = 'pending'"),
    ),
    _sqlite_key("message_pk", "messages.id"),
    Index("ix_deliveries_message_pk", "message_pk"),
    Index("ix_deliveries_status_finished_at", "status", "finished_at"),
    # A lane's waiting deliveries, lowest id (the next head) first.
    Index(
        "ix_deliveries_queued",
        "destination",
        "lane",
        "id",
        sqlite_where=text("status = 'queued'"),
        postgresql_where=text("status = 'queued'"),
    ),
    # A batch's members; only batched deliveries are in it.
    Index(
        "ix_deliveries_batch_id",
        "batch_id",
        sqlite_where=text("batch_id IS NOT NULL"),
        postgresql_where=text("batch_id IS NOT NULL"),
    ),
)

# Ordered delivery (efd/store/lanes.py): one row per lane that has a message in it, naming
# the delivery at its head, the only one of the lane that is pending (claimable). No row:
# the lane is idle, and the next message to join it becomes its head at once.
lanes = Table(
    "lanes",
    metadata,
    Column("destination", String(200), primary_key=True),
    Column("lane", Text, primary_key=True),
    Column("head", Id, nullable=False),
    Index("ix_lanes_head", "head", unique=True),
)

attempts = Table(
    "attempts",
    metadata,
    Column("id", Id, primary_key=True, autoincrement=True),
    Column("delivery_id", Id, nullable=False),
    Column("hook_url", Text, nullable=False),
    Column("attempted_at", Float, nullable=False),
    Column("duration_ms", Float, nullable=False),
    Column("outcome", String(8), nullable=False),  # success|retry|fail
    Column("status_code", Integer),
    Column("error_class", String(16)),  # timeout|connect|dns|reset|protocol|tls|blocked|…
    Column("error", Text),
    Column("response_head", Text),  # the first bytes of the response body
    # A batch's request: its batch (delivery_id is then its first member's); NULL: one
    # delivery's request.
    Column("batch_id", Id),
    _sqlite_key("delivery_id", "deliveries.id"),
    Index("ix_attempts_delivery_id", "delivery_id"),
    Index("ix_attempts_attempted_at", "attempted_at"),
    Index(
        "ix_attempts_batch_id",
        "batch_id",
        sqlite_where=text("batch_id IS NOT NULL"),
        postgresql_where=text("batch_id IS NOT NULL"),
    ),
)

# Batched delivery (efd/store/batches.py, docs/actions.md#batches): one row per request that
# carries many deliveries of one route, formed once. Its body and webhook-id are fixed at
# formation, so every retry sends the same bytes; its members (deliveries.batch_id) share
# its outcome, copied to them in the transaction that records it.
batches = Table(
    "batches",
    metadata,
    Column("id", Id, primary_key=True, autoincrement=True),
    Column("route", String(200), nullable=False),
    Column("body", Text, nullable=False),  # the exact bytes sent, as UTF-8 text
    Column("webhook_id", String(40), nullable=False),
    Column("status", String(10), nullable=False),  # pending|delivered|failed|expired|split
    Column("attempts", Integer, nullable=False, server_default=text("0")),
    Column("created_at", Float, nullable=False),
    Column("first_attempt_at", Float),
    Column("next_attempt_at", Float),  # when pending: as deliveries.next_attempt_at
    Column("finished_at", Float),
    Column("last_error", Text),
    Column("lease_owner", String(80)),
    Column("lease_token", Integer, nullable=False, server_default=text("0")),  # fencing
    Index(
        "ix_batches_due",
        "route",
        "next_attempt_at",
        sqlite_where=text("status = 'pending'"),
        postgresql_where=text("status = 'pending'"),
    ),
)

# One row per batched route: forming its batches locks it (FOR UPDATE SKIP LOCKED), so on
# a database several daemons share one of them forms a route's batches at a time.
batch_routes = Table(
    "batch_routes",
    metadata,
    Column("route", String(200), primary_key=True),
)

# One row per paused or disabled target: a whole destination (hook NULL) or one of its hooks,
# numbered from 1 in the configuration's order (an actions destination's actions). `kind`:
# paused (by an operator), disabled (failing for [delivery] disable_after_hours), or failing
# (a hook's run of failures, efd/store/pauses.py). One row per target: NULLs never collide in
# a unique key, so the whole destination's row has a partial index of its own.
pauses = Table(
    "pauses",
    metadata,
    Column("id", Id, primary_key=True, autoincrement=True),
    Column("destination", String(200), nullable=False),
    Column("hook", Integer),
    Column("kind", String(10), nullable=False),
    Column("reason", Text),
    Column("since", Float, nullable=False),
    Index("ux_pauses_hook", "destination", "hook", unique=True),
    Index(
        "ux_pauses_destination",
        "destination",
        unique=True,
        sqlite_where=text("hook IS NULL"),
        postgresql_where=text("hook IS NULL"),
    ),
)

# Periodic jobs that must run once per cluster, not once per process: a process runs a job
# only after moving its last_run_at forward, which one process at a time can do.
jobs = Table(
    "jobs",
    metadata,
    Column("name", String(100), primary_key=True),
    Column("last_run_at", Float, nullable=False),
    Column("owner", String(80)),
    # The retention row's: the highest message id its walk has passed (efd/store/retention.py).
    # Every message at or below it is purged or in retention_kept; NULL: nothing passed yet.
    Column("cursor_pk", Id),
)

# Messages retention's walk passed while one of their deliveries was still pending, queued,
# or finished after the horizon: each run looks at them again, and purges those done since.
retention_kept = Table(
    "retention_kept",
    metadata,
    Column("message_pk", Id, primary_key=True, autoincrement=False),
)

# One token bucket per rate-limited hook (efd/store/ratelimit.py), shared by every daemon on
# the store. Keyed by a hash of destination and URL: no URL is written here.
hook_tokens = Table(
    "hook_tokens",
    metadata,
    Column("key", String(64), primary_key=True),
    Column("tokens", Float, nullable=False),
    Column("updated_at", Float, nullable=False),  # when `tokens` was last refilled
)

# -- profiles, audiences and computed traits (maintained only when some are configured) ------

# One row per identity graph, keyed by its canonical id: the userId, or the anonymousId of a
# profile not yet linked to a user. `traits` is a JSON object; `trait_times` a JSON object
# {trait: timestamp of the message that set it}, so a later value wins whatever the order
# of arrival.
profiles = Table(
    "profiles",
    metadata,
    Column("id", Text, primary_key=True),
    Column("kind", String(10), nullable=False),  # user|anonymous
    Column("traits", Text, nullable=False),
    Column("trait_times", Text, nullable=False),
    Column("updated_at", Float, nullable=False),
    Index("ix_profiles_kind_id", "kind", "id"),
)

# Every other id a profile is known by -> its canonical id (flattened: never a chain).
identities = Table(
    "identities",
    metadata,
    Column("alias_id", Text, primary_key=True),
    Column("canonical_id", Text, nullable=False),
    Column("created_at", Float, nullable=False),
    Index("ix_identities_canonical_id", "canonical_id"),
)

# track (its event name), page ("Page Viewed") and screen ("Screen Viewed") events, kept as
# long as the longest lookback of the configured audiences and computed traits needs.
events = Table(
    "events",
    metadata,
    Column("id", Id, primary_key=True, autoincrement=True),
    Column("identity", Text, nullable=False),  # the profile's canonical id
    Column("name", Text, nullable=False),
    Column("timestamp", Float, nullable=False),
    Column("properties", Text, nullable=False),  # JSON object
    Index("ix_events_identity", "identity", "name", "timestamp"),
    Index("ix_events_timestamp", "timestamp"),
)

# One row per audience or computed trait that has been synced.
computations = Table(
    "computations",
    metadata,
    Column("key", String(300), primary_key=True),  # "audience:<key>" or "trait:<key>"
    Column("kind", String(10), nullable=False),  # audience|trait
    Column("name", Text, nullable=False),
    Column("definition_hash", String(64), nullable=False),
    Column("last_sync_at", Float),  # the last sync that started
    Column("last_success_at", Float),  # the last sync that finished
    Column("last_sent", Integer),  # identify messages the last finished sync sent
    Column("last_error", Text),
)

# The state the last sync delivered: audience members (value true) and computed trait
# values (JSON). The next sync sends only what differs from it.
computed_values = Table(
    "computed_values",
    metadata,
    Column("computation", String(300), primary_key=True),
    Column("profile_id", Text, primary_key=True),
    Column("value", Text, nullable=False),  # JSON
    Column("updated_at", Float, nullable=False),
    Index("ix_computed_values_profile_id", "profile_id"),
)

# -- deletion requests ("regulations") ----------------------------------------------------

regulations = Table(
    "regulations",
    metadata,
    Column("id", String(40), primary_key=True),
    Column("type", String(24), nullable=False),  # DELETE_ONLY|SUPPRESS_WITH_DELETE|…
    Column("scope", String(200)),  # a source name; NULL: every source
    Column("status", String(12), nullable=False),  # efd.records.RegulationStatus
    Column("subject_count", Integer, nullable=False),
    Column("progress", Text, nullable=False),  # JSON: per-source notifications, purge counts
    Column("created_at", Float, nullable=False),
    Column("started_at", Float),
    Column("finished_at", Float),
    Column("owner", String(80)),  # the process running it
    Column("lease_until", Float),  # another process may take it over after this
    Column("lease_token", Integer, nullable=False, server_default=text("0")),  # fencing
    Column("error", Text),
    Index("ix_regulations_status_created_at", "status", "created_at"),
)

# The ids a regulation covers: the requested userIds, and (while it runs) the ids linked to
# them, which its purge also covers. Linked ids are dropped when it finishes.
regulation_subjects = Table(
    "regulation_subjects",
    metadata,
    Column(
        "regulation_id",
        String(40),
        ForeignKey("regulations.id", ondelete="CASCADE"),
        primary_key=True,
    ),
    Column("subject_id", Text, primary_key=True),
    Column("requested", Integer, nullable=False),  # 1: given in the request, 0: linked
)

# Ids whose messages are acknowledged and dropped (SUPPRESS_*), until an UNSUPPRESS.
suppressions = Table(
    "suppressions",
    metadata,
    Column("subject_id", Text, primary_key=True),  # a userId, anonymousId or linked id
    Column("user_id", Text, nullable=False),  # the userId the regulation named
    Column("regulation_id", String(40), nullable=False),
    Column("created_at", Float, nullable=False),
    Index("ix_suppressions_user_id", "user_id"),
)
