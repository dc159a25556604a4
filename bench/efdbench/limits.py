"""The storage limits, measured in the same run: raw sqlite3 inserts of efd's rows, with
and without efd's indexes, and the same through SQLAlchemy Core."""

from __future__ import annotations

import contextlib
import sqlite3
import time
from pathlib import Path
from typing import Any

from efdbench.bodies import message_ids, sample_webhook_body


def _create_schema(path: Path, *, indexes: bool = True) -> None:
    """efd's tables (from efd.store.schema); without `indexes`, primary keys only."""
    from sqlalchemy import create_engine

    from efd.store.schema import metadata

    engine = create_engine(f"sqlite:///{path}")
    metadata.create_all(engine)
    engine.dispose()
    if not indexes:
        with contextlib.closing(sqlite3.connect(path)) as db:
            names = [
                row[0]
                for row in db.execute(
                    "SELECT name FROM sqlite_master WHERE type = 'index' AND sql IS NOT NULL"
                )
            ]
            for name in names:
                db.execute(f'DROP INDEX "{name}"')
            db.commit()


def sqlite_raw(path: Path, seconds: float, max_rows: int, *, indexes: bool) -> dict[str, Any]:
    """Raw sqlite3 executemany, WAL, synchronous=FULL, 100 events per transaction, each
    event a messages row and a deliveries row (random UUID-like messageIds).

    indexes=False: efd's tables with primary keys only, the machine's SQLite limit.
    indexes=True: with efd's secondary indexes, its writer's checkpoint interval and its
    in-memory deduplication index too, the limit of efd's current schema."""
    from efd.store.dedupe import message_key

    try:
        from efd.store.backends.sqlite import attach
    except ImportError:  # a revision from before the store's backends (--rev)
        # Only there in those revisions: this one, which mypy checks, has no such name.
        from efd.store.dedupe import attach  # type: ignore[attr-defined,no-redef]

    _create_schema(path, indexes=indexes)
    body = sample_webhook_body().decode()
    db = sqlite3.connect(path, isolation_level=None)
    db.execute("PRAGMA journal_mode=WAL")
    db.execute("PRAGMA synchronous=FULL")
    if indexes:  # as efd/store/engine.py sets them
        db.execute("PRAGMA wal_autocheckpoint=10000")
        attach(db)
    now = time.time()
    started = time.monotonic()
    done = 0
    transactions = 0
    while done < max_rows and time.monotonic() - started < seconds:
        chunk = message_ids("raw", min(100, max_rows - done))
        first = done + 1
        db.execute("BEGIN IMMEDIATE")
        db.executemany(
            "INSERT INTO messages (id, source, message_id, type, user_id, anonymous_id, event,"
            " timestamp, received_at, body, message_key) VALUES (?, 'bench', ?, 'track',"
            " 'user-1', NULL, 'Order Completed', ?, ?, ?, ?)",
            [
                (first + i, mid, now, now, body, message_key("bench", mid))
                for i, mid in enumerate(chunk)
            ],
        )
        db.executemany(
            "INSERT INTO deliveries (message_pk, destination, status, attempts, created_at,"
            " next_attempt_at, lease_token) VALUES (?, 'receiver', 'pending', 0, ?, ?, 0)",
            [(first + i, now, now) for i in range(len(chunk))],
        )
        if indexes:
            db.executemany(
                "INSERT INTO dedupe.recent (message_key, message_pk) VALUES (?, ?)",
                [(message_key("bench", mid), first + i) for i, mid in enumerate(chunk)],
            )
        db.execute("COMMIT")
        done += len(chunk)
        transactions += 1
    elapsed = time.monotonic() - started
    db.close()
    return {
        "events": done,
        "transactions": transactions,
        "events_per_s": round(done / elapsed, 1),
    }


def sqlalchemy_core(path: Path, seconds: float, max_rows: int) -> dict[str, Any]:
    """Context, not a key of the issue: the same through SQLAlchemy Core as efd's store
    does it (insert ... RETURNING id sorted by parameter order, then the deliveries)."""
    from sqlalchemy import create_engine, event, insert

    from efd.store.dedupe import message_key
    from efd.store.schema import deliveries, messages

    _create_schema(path)
    engine = create_engine(f"sqlite:///{path}")

    @event.listens_for(engine, "connect")
    def _pragmas(dbapi_connection: Any, _record: Any) -> None:
        dbapi_connection.isolation_level = None
        dbapi_connection.execute("PRAGMA journal_mode=WAL")
        dbapi_connection.execute("PRAGMA synchronous=FULL")

    @event.listens_for(engine, "begin")
    def _begin(connection: Any) -> None:
        connection.exec_driver_sql("BEGIN IMMEDIATE")

    body = sample_webhook_body().decode()
    now = time.time()
    started = time.monotonic()
    done = 0
    while done < max_rows and time.monotonic() - started < seconds:
        chunk = message_ids("core", min(100, max_rows - done))
        with engine.begin() as conn:
            pks = conn.execute(
                insert(messages).returning(messages.c.id, sort_by_parameter_order=True),
                [
                    {
                        "source": "bench",
                        "message_id": mid,
                        "type": "track",
                        "user_id": "user-1",
                        "anonymous_id": None,
                        "event": "Order Completed",
                        "timestamp": now,
                        "received_at": now,
                        "body": body,
                        "message_key": message_key("bench", mid),
                    }
                    for mid in chunk
                ],
            ).scalars()
            conn.execute(
                insert(deliveries),
                [
                    {
                        "message_pk": pk,
                        "destination": "receiver",
                        "status": "pending",
                        "created_at": now,
                        "next_attempt_at": now,
                    }
                    for pk in pks
                ],
            )
        done += len(chunk)
    elapsed = time.monotonic() - started
    engine.dispose()
    return {"events": done, "events_per_s": round(done / elapsed, 1)}
