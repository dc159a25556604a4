"""PostgreSQL's own write limit for efd's schema, measured in the same run: one client
writing efd's two rows per event (a `messages` row and its `deliveries` row), 100 events a
transaction, by multi-row INSERT and by COPY, with efd's indexes and with none."""

from __future__ import annotations

import time
from typing import Any

import psycopg

from efdbench.bodies import message_ids, sample_webhook_body
from efdbench.pgserver import PgServer

_MESSAGE_COLUMNS = (
    "source, message_id, type, user_id, anonymous_id, event, timestamp, received_at, body,"
    " message_key"
)
_DELIVERY_COLUMNS = "message_pk, destination, status, attempts, created_at, next_attempt_at"


def _drop_secondary_indexes(pg: psycopg.Connection[Any]) -> None:
    """Leave primary keys (and the foreign keys that need them) only."""
    rows = pg.execute(
        "SELECT indexname FROM pg_indexes WHERE schemaname = 'public' AND indexname NOT IN"
        " (SELECT conname FROM pg_constraint WHERE contype = 'p')"
    ).fetchall()
    for (name,) in rows:
        pg.execute(f'DROP INDEX "{name}"')


def pg_write_limit(
    server: PgServer, *, method: str, indexes: bool, seconds: float, max_rows: int
) -> dict[str, Any]:
    """Events a second one client writes into a fresh database migrated to efd's schema.

    method "insert": a multi-row INSERT ... RETURNING id for the messages (as efd needs the
    ids), then a multi-row INSERT of the deliveries. method "copy": COPY of both tables, the
    ids numbered by the client (a fresh database, one writer). The CPU of the database's
    backend for this connection is measured alongside."""
    from efd.store.dedupe import message_key

    db = server.create_database(f"limit_{method}_{'idx' if indexes else 'noidx'}")
    try:
        server.migrate(db)
        server.checkpoint()  # as before each daemon phase (efdbench/pgserver.py)
        body = sample_webhook_body().decode()
        now = time.time()
        with psycopg.connect(server.url(db), autocommit=True) as pg:
            if not indexes:
                _drop_secondary_indexes(pg)
            pg.autocommit = False
            backend = pg.info.backend_pid
            cpu_before = server.backend_cpu_seconds([backend])
            started = time.monotonic()
            done = 0
            next_id = 1
            while done < max_rows and time.monotonic() - started < seconds:
                chunk = message_ids("pg", min(100, max_rows - done))
                rows = [
                    ("bench", mid, "track", "user-1", None, "Order Completed", now, now, body,
                     message_key("bench", mid))
                    for mid in chunk
                ]  # fmt: skip
                with pg.cursor() as cur:
                    if method == "copy":
                        ids = list(range(next_id, next_id + len(rows)))
                        next_id += len(rows)
                        with cur.copy(f"COPY messages (id, {_MESSAGE_COLUMNS}) FROM STDIN") as cp:
                            for pk, row in zip(ids, rows, strict=True):
                                cp.write_row((pk, *row))
                        with cur.copy(f"COPY deliveries ({_DELIVERY_COLUMNS}) FROM STDIN") as cp:
                            for pk in ids:
                                cp.write_row((pk, "receiver", "pending", 0, now, now))
                    else:
                        values = ",".join(["(%s,%s,%s,%s,%s,%s,%s,%s,%s,%s)"] * len(rows))
                        cur.execute(
                            f"INSERT INTO messages ({_MESSAGE_COLUMNS}) VALUES {values}"
                            " RETURNING id",
                            [v for row in rows for v in row],
                        )
                        ids = [r[0] for r in cur.fetchall()]
                        values = ",".join(["(%s,%s,%s,%s,%s,%s)"] * len(ids))
                        cur.execute(
                            f"INSERT INTO deliveries ({_DELIVERY_COLUMNS}) VALUES {values}",
                            [v for pk in ids for v in (pk, "receiver", "pending", 0, now, now)],
                        )
                pg.commit()
                done += len(chunk)
            elapsed = time.monotonic() - started
            pg_cpu = server.backend_cpu_seconds([backend]) - cpu_before
    finally:
        server.drop_database(db)
    return {
        "events": done,
        "events_per_s": round(done / elapsed, 1),
        "pg_cpu_us_per_event": round(pg_cpu / max(1, done) * 1e6, 1),
        "pg_cpu_pct": round(pg_cpu / elapsed * 100, 1),
    }
