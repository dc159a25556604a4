"""How SQLite's insert rate falls as efd's message_key index grows, and what does not help.

    .venv/bin/python bench/experiments/index_growth.py [seconds]

Raw inserts of efd's two rows per event (efd's schema and writer settings: WAL,
synchronous=FULL, checkpoint every 10,000 pages, 32 MiB cache), 400 events a commit, with a
rate printed every 3 seconds beside the number of messages stored. Then the same with
synchronous=NORMAL, with a 1 GiB mmap, and without the message_key index.
"""

from __future__ import annotations

import sqlite3
import sys
import tempfile
import time
import uuid
from pathlib import Path

from sqlalchemy import create_engine

from efd.store.dedupe import message_key
from efd.store.schema import metadata

BODY = '{"version":1,"type":"track","userId":"u","event":"Order Completed","messageId":"x"}' * 3
PER_COMMIT = 400
EFD_PRAGMAS = (
    "PRAGMA journal_mode=WAL",
    "PRAGMA synchronous=FULL",
    "PRAGMA wal_autocheckpoint=10000",
    "PRAGMA cache_size=-32768",
)
VARIANTS: dict[str, tuple[str, ...]] = {
    "efd": (),
    "synchronous=NORMAL": ("PRAGMA synchronous=NORMAL",),
    "mmap 1 GiB": ("PRAGMA mmap_size=1073741824",),
    "no message_key index": ("DROP INDEX ix_messages_message_key",),
}


def run(name: str, extra: tuple[str, ...], path: Path, seconds: float) -> None:
    engine = create_engine(f"sqlite:///{path}")
    metadata.create_all(engine, tables=[metadata.tables["messages"], metadata.tables["deliveries"]])
    engine.dispose()
    db = sqlite3.connect(path, isolation_level=None)
    for pragma in (*EFD_PRAGMAS, *extra):
        db.execute(pragma)
    columns = (
        "id, source, message_id, type, user_id, anonymous_id, event, timestamp, received_at, "
        "body, message_key"
    )
    insert_messages = f"INSERT INTO messages ({columns}) VALUES " + ", ".join(
        ["(" + ", ".join("?" * (columns.count(",") + 1)) + ")"] * PER_COMMIT
    )
    insert_deliveries = (
        "INSERT INTO deliveries (message_pk, destination, status, attempts, created_at, "
        "next_attempt_at, lease_token) VALUES " + ", ".join(["(?, ?, ?, ?, ?, ?, ?)"] * PER_COMMIT)
    )
    print(name)
    stored = 0
    started = mark = time.perf_counter()
    at_mark = 0
    while time.perf_counter() - started < seconds:
        now = time.time()
        message_params: list[object] = []
        delivery_params: list[object] = []
        for pk in range(stored + 1, stored + PER_COMMIT + 1):
            mid = str(uuid.uuid4())
            key = message_key("bench", mid)
            message_params += [pk, "bench", mid, "track", "u1", None, "E", now, now, BODY, key]
            delivery_params += [pk, "receiver", "pending", 0, now, now, 0]
        db.execute("BEGIN IMMEDIATE")
        db.execute(insert_messages, message_params)
        db.execute(insert_deliveries, delivery_params)
        db.execute("COMMIT")
        stored += PER_COMMIT
        if time.perf_counter() - mark >= 3:
            rate = (stored - at_mark) / (time.perf_counter() - mark)
            print(f"  {stored:>10,} stored  {rate:9,.0f} events/s", flush=True)
            mark, at_mark = time.perf_counter(), stored
    db.close()


def main() -> None:
    seconds = float(sys.argv[1]) if len(sys.argv) > 1 else 21.0
    with tempfile.TemporaryDirectory() as directory:
        for i, (name, extra) in enumerate(VARIANTS.items()):
            run(name, extra, Path(directory) / f"{i}.db", seconds)


if __name__ == "__main__":
    main()
