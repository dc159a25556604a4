"""What efd's messageId deduplication index costs SQLite: raw inserts of efd's two rows per event.

    .venv/bin/python bench/experiments/dedupe_index.py

Three indexes for deduplication: the text index on (source, message_id) that efd had until
migration 0004, the on-disk message_key index it had until migration 0005 (PostgreSQL keeps
it; SQLite's writer now indexes the keys in memory, efd/store/dedupe.py), and none at all.
Each with SQLite's default checkpoint interval (1,000 WAL pages) and efd's (10,000). 100 events
a transaction, many rows per INSERT, WAL, synchronous=FULL, 5 seconds each, on a file in the
temp directory. index_growth.py uses `open_tables` and `insert_events` too.
"""

from __future__ import annotations

import sqlite3
import tempfile
import time
import uuid
from functools import cache
from pathlib import Path

from sqlalchemy import create_engine

from efd.store.dedupe import message_key
from efd.store.schema import metadata

BODY = '{"version":1,"type":"track","userId":"u","event":"Order Completed","messageId":"x"}' * 3
PER_COMMIT = 100
SECONDS = 5.0
VARIANTS = ("text index", "message_key", "no index")
_MESSAGE_COLUMNS = (
    "id, source, message_id, type, user_id, anonymous_id, event, timestamp, received_at, "
    "body, message_key"
)


def open_tables(path: Path) -> sqlite3.Connection:
    """efd's messages and deliveries tables, with the on-disk message_key index SQLite had
    until migration 0005, in WAL mode with synchronous=FULL."""
    engine = create_engine(f"sqlite:///{path}")
    metadata.create_all(engine, tables=[metadata.tables["messages"], metadata.tables["deliveries"]])
    engine.dispose()
    db = sqlite3.connect(path, isolation_level=None)
    db.execute("CREATE INDEX ix_messages_message_key ON messages (message_key)")
    db.execute("PRAGMA journal_mode=WAL")
    db.execute("PRAGMA synchronous=FULL")
    return db


@cache
def _statements(count: int) -> tuple[str, str]:
    width = _MESSAGE_COLUMNS.count(",") + 1
    messages = f"INSERT INTO messages ({_MESSAGE_COLUMNS}) VALUES " + ", ".join(
        ["(" + ", ".join("?" * width) + ")"] * count
    )
    deliveries = (
        "INSERT INTO deliveries (message_pk, destination, status, attempts, created_at, "
        "next_attempt_at, lease_token) VALUES " + ", ".join(["(?, ?, ?, ?, ?, ?, ?)"] * count)
    )
    return messages, deliveries


def insert_events(db: sqlite3.Connection, first_pk: int, count: int) -> None:
    """One transaction of `count` events with random messageIds, numbered from `first_pk`."""
    insert_messages, insert_deliveries = _statements(count)
    now = time.time()
    message_params: list[object] = []
    delivery_params: list[object] = []
    for pk in range(first_pk, first_pk + count):
        mid = str(uuid.uuid4())
        key = message_key("bench", mid)
        message_params += [pk, "bench", mid, "track", "u1", None, "E", now, now, BODY, key]
        delivery_params += [pk, "receiver", "pending", 0, now, now, 0]
    db.execute("BEGIN IMMEDIATE")
    db.execute(insert_messages, message_params)
    db.execute(insert_deliveries, delivery_params)
    db.execute("COMMIT")


def run(variant: str, checkpoint_pages: int, path: Path) -> float:
    db = open_tables(path)
    db.execute(f"PRAGMA wal_autocheckpoint={checkpoint_pages}")
    if variant != "message_key":
        db.execute("DROP INDEX ix_messages_message_key")
    if variant == "text index":
        db.execute("CREATE INDEX ix_messages_source_message_id ON messages (source, message_id)")
    events = 0
    started = time.perf_counter()
    while time.perf_counter() - started < SECONDS:
        insert_events(db, events + 1, PER_COMMIT)
        events += PER_COMMIT
    db.close()
    return events / (time.perf_counter() - started)


def main() -> None:
    print(f"{'events/s':14} " + " ".join(f"{v:>12}" for v in VARIANTS))
    with tempfile.TemporaryDirectory() as directory:
        for pages in (1000, 10000):
            rates = [
                run(v, pages, Path(directory) / f"{v.replace(' ', '-')}-{pages}.db")
                for v in VARIANTS
            ]
            print(f"checkpoint {pages:>5} " + " ".join(f"{r:12,.0f}" for r in rates))


if __name__ == "__main__":
    main()
