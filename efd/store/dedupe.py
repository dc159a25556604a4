"""Deduplication: "a messageId repeated by the same source within 24 hours".

The key is a signed 64-bit hash of (source, messageId). Equal keys are only candidates: the
store compares the source and messageId themselves, so a hash collision can never drop a
message.

Where the keys are indexed depends on the database:

- PostgreSQL: `ix_messages_message_key`, a table index, because several processes share it.
- SQLite: an index in the writer connection's memory (an attached in-memory database),
  filled from the messages of the last 24 hours when the writer connects. One process writes
  a SQLite file (efd holds a lock), so no other process needs it, and nothing is lost in a
  crash: the messages table is the truth, and the index is rebuilt from it. Message ids are
  random, so an on-disk index of them takes a write at a random page per message once it
  outgrows a commit: ingestion with a million messages stored ran at 78-80 % of the empty
  store's rate with it, at 104-107 % without (README, Benchmarks). In memory it costs about
  20 MB per million messages received in 24 hours (0.9 s to fill at start).
"""

from __future__ import annotations

import logging
import time
from hashlib import blake2b
from typing import Any

from sqlalchemy import BigInteger, Column, Connection, MetaData, PrimaryKeyConstraint, Table

log = logging.getLogger("efd.store")

SCHEMA = "dedupe"
PRUNE_EVERY_SECONDS = 300

# Not in schema.metadata: it lives in memory, never in a migration.
recent = Table(
    "recent",
    MetaData(),
    Column("message_key", BigInteger, nullable=False),
    Column("message_pk", BigInteger, nullable=False),
    # One b-tree sorted by key: half the memory of a rowid table plus an index.
    PrimaryKeyConstraint("message_key", "message_pk"),
    schema=SCHEMA,
    sqlite_with_rowid=False,
)


def message_key(source: str, message_id: str) -> int:
    # Any collision, of the hash or of the joined text, only makes a candidate that the
    # store's exact comparison then rejects.
    digest = blake2b(f"{source}\x00{message_id}".encode(), digest_size=8).digest()
    return int.from_bytes(digest, "big", signed=True)


def attach(dbapi_connection: Any) -> None:
    """Give a new SQLite writer connection its empty in-memory index (ATTACH cannot run
    inside a transaction, so this happens at connect; `ensure` fills it)."""
    dbapi_connection.execute(f"ATTACH DATABASE ':memory:' AS {SCHEMA}")
    dbapi_connection.execute(
        f"CREATE TABLE {SCHEMA}.recent (message_key INTEGER NOT NULL, "
        "message_pk INTEGER NOT NULL, PRIMARY KEY (message_key, message_pk)) WITHOUT ROWID"
    )
    # One row once filled: kept in the same transactions as the keys, so a fill that is
    # rolled back is also forgotten, and done again.
    dbapi_connection.execute(f"CREATE TABLE {SCHEMA}.state (pruned_at REAL NOT NULL)")


def ensure(conn: Connection, now: float, window: float) -> None:
    """Fill this connection's index from the messages of the last `window` seconds the first
    time it is used, and drop keys older than the window every few minutes.

    Runs inside the caller's write transaction, so no message can be stored between the
    fill and the caller's own lookup."""
    pruned_at = conn.exec_driver_sql(f"SELECT pruned_at FROM {SCHEMA}.state").scalar()
    if pruned_at is None:
        started = time.monotonic()
        count = conn.exec_driver_sql(
            f"INSERT INTO {SCHEMA}.recent (message_key, message_pk) "
            "SELECT message_key, id FROM main.messages "
            "WHERE received_at > ? AND message_key IS NOT NULL ORDER BY message_key, id",
            (now - window,),
        ).rowcount
        conn.exec_driver_sql(f"INSERT INTO {SCHEMA}.state (pruned_at) VALUES (?)", (now,))
        log.info(
            "deduplication: %d messageIds of the last %g h indexed in memory in %.1f s",
            count,
            window / 3600,
            time.monotonic() - started,
        )
    elif now - pruned_at >= PRUNE_EVERY_SECONDS:
        # Every message with a smaller id was received before the window opened.
        [first] = conn.exec_driver_sql(
            "SELECT min(id) FROM main.messages WHERE received_at > ?", (now - window,)
        ).one()
        if first is None:
            conn.exec_driver_sql(f"DELETE FROM {SCHEMA}.recent")
        else:
            conn.exec_driver_sql(f"DELETE FROM {SCHEMA}.recent WHERE message_pk < ?", (first,))
        conn.exec_driver_sql(f"UPDATE {SCHEMA}.state SET pruned_at = ?", (now,))
