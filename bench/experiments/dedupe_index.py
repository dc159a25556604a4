"""What efd's messageId index costs SQLite: raw inserts of efd's two rows per event.

    .venv/bin/python bench/experiments/dedupe_index.py

efd's schema as migrated (text index on (source, message_id)), the same with a 64-bit hash key
indexed instead, and with no deduplication index at all. 100 events a transaction, many rows
per INSERT, WAL, synchronous=FULL, 5 seconds each, on a file in the temp directory.
"""

from __future__ import annotations

import random
import sqlite3
import tempfile
import time
import uuid
from pathlib import Path

from sqlalchemy import create_engine

from efd.store.schema import metadata

BODY = '{"version":1,"type":"track","userId":"u","event":"Order Completed","messageId":"x"}' * 3
PER_COMMIT = 100
SECONDS = 5.0


def run(variant: str, path: Path) -> float:
    engine = create_engine(f"sqlite:///{path}")
    metadata.create_all(engine, tables=[metadata.tables["messages"], metadata.tables["deliveries"]])
    engine.dispose()
    db = sqlite3.connect(path, isolation_level=None)
    db.execute("PRAGMA journal_mode=WAL")
    db.execute("PRAGMA synchronous=FULL")
    columns = (
        "id, source, message_id, type, user_id, anonymous_id, event, timestamp, received_at, body"
    )
    if variant != "text index":
        db.execute("DROP INDEX ix_messages_source_message_id")
    if variant == "hash key":
        db.execute("ALTER TABLE messages ADD COLUMN dedupe_key INTEGER")
        db.execute("CREATE INDEX ix_messages_dedupe_key ON messages (dedupe_key)")
        columns += ", dedupe_key"
    width = columns.count(",") + 1
    insert_messages = f"INSERT INTO messages ({columns}) VALUES " + ", ".join(
        ["(" + ", ".join("?" * width) + ")"] * PER_COMMIT
    )
    insert_deliveries = (
        "INSERT INTO deliveries (message_pk, destination, status, attempts, created_at, "
        "next_attempt_at, lease_token) VALUES " + ", ".join(["(?, ?, ?, ?, ?, ?, ?)"] * PER_COMMIT)
    )
    events, next_id = 0, 1
    started = time.perf_counter()
    while time.perf_counter() - started < SECONDS:
        now = time.time()
        message_params: list[object] = []
        delivery_params: list[object] = []
        for _ in range(PER_COMMIT):
            row = [next_id, "bench", str(uuid.uuid4()), "track", "u1", None, "E", now, now, BODY]
            if variant == "hash key":
                row.append(random.getrandbits(63))
            message_params += row
            delivery_params += [next_id, "receiver", "pending", 0, now, now, 0]
            next_id += 1
        db.execute("BEGIN IMMEDIATE")
        db.execute(insert_messages, message_params)
        db.execute(insert_deliveries, delivery_params)
        db.execute("COMMIT")
        events += PER_COMMIT
    db.close()
    return events / (time.perf_counter() - started)


def main() -> None:
    with tempfile.TemporaryDirectory() as directory:
        for variant in ("text index", "hash key", "no dedupe index"):
            rate = run(variant, Path(directory) / f"{variant.replace(' ', '-')}.db")
            print(f"{variant:16} {rate:9,.0f} events/s")


if __name__ == "__main__":
    main()
