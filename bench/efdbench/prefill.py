"""A history of finished messages written with SQL directly, not through the daemon: rows
shaped like efd's (a message, its delivered delivery and its successful attempt), all older
than retention's horizon and than the deduplication window, so retention may purge every one.

The secondary indexes are dropped during the fill and built again after it (their own DDL,
read from the database), then the tables are analysed: the state a database grown over days
and analysed by autovacuum (or by SQLite's optimize) would be in.
"""

from __future__ import annotations

import contextlib
import sqlite3
import time
from typing import Any

import psycopg

from efdbench.bodies import batch_body

_TABLES = ("messages", "deliveries", "attempts")
_CHUNK = 1_000_000  # rows a statement


def _body() -> str:
    """One message body as efd stores it (the JSON a client sent), quoted for SQL."""
    body, _ = batch_body("pf", 1, 0)
    return body.decode().replace("'", "''")


def _selects(dialect: str, oldest: float, span: float, n: int) -> dict[str, str]:
    """INSERT … SELECT statements for the three tables over a series `i`: message i was
    received at oldest + span * i / n, delivered 20 ms later at its first attempt."""
    body = _body()
    at = f"({oldest!r} + {span!r} * i / {n})"
    key = "((i * 2654435761) % 9223372036854775783)"  # distinct per i, like a 64-bit hash
    text = "(i)::text" if dialect == "postgresql" else "CAST(i AS TEXT)"
    return {
        "messages": (
            "INSERT INTO messages (id, source, message_id, type, user_id, anonymous_id, event, "
            "timestamp, original_timestamp, received_at, body, message_key) "
            f"SELECT i, 'bench', 'pf-' || {text}, 'track', 'u' || {text}, NULL, "
            f"'Order Completed', {at}, NULL, {at}, '{body}', {key}"
        ),
        "deliveries": (
            "INSERT INTO deliveries (id, message_pk, destination, status, attempts, created_at, "
            "first_attempt_at, next_attempt_at, finished_at, failed_hooks, last_error, "
            "lease_owner, lease_token, replay_of, body, lane) "
            f"SELECT i, i, 'receiver', 'delivered', 1, {at}, {at} + 0.01, NULL, {at} + 0.02, "
            "NULL, NULL, NULL, 1, NULL, NULL, NULL"
        ),
        "attempts": (
            "INSERT INTO attempts (id, delivery_id, hook_url, attempted_at, duration_ms, outcome, "
            "status_code, error_class, error, response_head) "
            f"SELECT i, i, 'http://127.0.0.1:9/hook', {at} + 0.01, 3.5, 'success', 200, NULL, "
            "NULL, 'ok'"
        ),
    }


def fill_sqlite(path: str, n: int, *, oldest: float, span: float) -> dict[str, Any]:
    """Add n finished messages (ids 1..n) to the migrated, empty SQLite database at path."""
    started = time.monotonic()
    statements = _selects("sqlite", oldest, span, n)
    with contextlib.closing(sqlite3.connect(path, isolation_level=None)) as db:
        db.execute("PRAGMA journal_mode=WAL")
        db.execute("PRAGMA synchronous=OFF")  # a fill, not efd's writes: rebuilt on failure
        db.execute("PRAGMA cache_size=-262144")
        indexes = db.execute(
            "SELECT name, sql FROM sqlite_master WHERE type = 'index' AND sql IS NOT NULL "
            f"AND tbl_name IN {_TABLES!r}"
        ).fetchall()
        for name, _ in indexes:
            db.execute(f'DROP INDEX "{name}"')
        for table in _TABLES:
            for low in range(1, n + 1, _CHUNK):
                high = min(n, low + _CHUNK - 1)
                series = (
                    f"WITH RECURSIVE s(i) AS (SELECT {low} UNION ALL SELECT i + 1 FROM s "
                    f"WHERE i < {high}) "
                )
                db.execute("BEGIN")
                db.execute(series + statements[table] + " FROM s")
                db.execute("COMMIT")
        filled = time.monotonic() - started
        for _, sql in indexes:
            db.execute(sql)
        db.execute("ANALYZE")
        db.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    seconds = time.monotonic() - started
    return {
        "messages": n,
        "seconds": round(seconds, 1),
        "insert_seconds": round(filled, 1),
        "messages_per_s": round(n / seconds, 1) if seconds else None,
    }


def fill_postgresql(url: str, n: int, *, oldest: float, span: float) -> dict[str, Any]:
    """Add n finished messages (ids 1..n) to the migrated, empty PostgreSQL database at url."""
    started = time.monotonic()
    statements = _selects("postgresql", oldest, span, n)
    with psycopg.connect(url, autocommit=True) as pg:
        indexes = pg.execute(
            "SELECT i.indexname, i.indexdef FROM pg_indexes i WHERE i.schemaname = 'public' "
            "AND i.tablename = ANY(%s) AND NOT EXISTS (SELECT 1 FROM pg_constraint c "
            "WHERE c.conname = i.indexname)",
            (list(_TABLES),),
        ).fetchall()
        for name, _ in indexes:
            pg.execute(f'DROP INDEX "{name}"')
        for table in _TABLES:
            for low in range(1, n + 1, _CHUNK):
                high = min(n, low + _CHUNK - 1)
                pg.execute(
                    statements[table] + f" FROM generate_series({low}::bigint, {high}) AS s(i)"
                )
            pg.execute(
                f"SELECT setval(pg_get_serial_sequence('{table}', 'id'), "
                f"(SELECT max(id) FROM {table}))"
            )
        filled = time.monotonic() - started
        for _, sql in indexes:
            pg.execute(sql)
        # What autovacuum does to freshly written tables (their visibility map and
        # statistics); its own runs may come later, as in production.
        pg.execute(f"VACUUM ANALYZE {', '.join(_TABLES)}")
    seconds = time.monotonic() - started
    return {
        "messages": n,
        "seconds": round(seconds, 1),
        "insert_seconds": round(filled, 1),
        "messages_per_s": round(n / seconds, 1) if seconds else None,
    }
