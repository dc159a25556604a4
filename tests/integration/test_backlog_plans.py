"""The backlog counts (`efd_backlog`, /admin/destinations, the systemd status line) read the
partial indexes of open deliveries, never every delivery stored: their cost follows the
backlog, not the history, also once the tables were analysed (SQLite's `ANALYZE` or `PRAGMA
optimize`, PostgreSQL's autovacuum), when `status IN (…)` made SQLite scan the table."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from typing import Any

import pytest
from sqlalchemy import Engine, create_engine, event

from efd.store import Store, migrate
from efd.store.engine import normalise_url
from efd.store.health import HealthStore
from tests.conftest import sql

HISTORY = 20000


@pytest.fixture
def store(db_url: str) -> Iterator[Store]:
    migrate.upgrade(db_url)
    s = Store(db_url)
    yield s
    s.dispose()


def _fill(db_url: str) -> None:
    """HISTORY delivered messages, then 3 pending deliveries to "a" and 2 queued to "b"."""
    now = time.time()
    sql(
        db_url,
        "INSERT INTO messages (id, source, message_id, type, timestamp, received_at, body)"
        " WITH RECURSIVE s(i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM s WHERE i < :n)"
        " SELECT i, 'web', 'm' || i, 'track', 0, :now, '{}' FROM s",
        n=HISTORY + 5,
        now=now,
    )
    sql(
        db_url,
        "INSERT INTO deliveries (message_pk, destination, status, attempts, created_at,"
        " finished_at) SELECT id, 'a', 'delivered', 1, id, id FROM messages WHERE id <= :n",
        n=HISTORY,
    )
    for pk, (destination, status) in enumerate(
        [("a", "pending")] * 3 + [("b", "queued")] * 2, start=HISTORY + 1
    ):
        sql(
            db_url,
            "INSERT INTO deliveries (message_pk, destination, status, attempts, created_at,"
            " next_attempt_at, lane) VALUES (:pk, :d, :s, 0, :pk, 0, 'u')",
            pk=pk,
            d=destination,
            s=status,
        )
    sql(db_url, "ANALYZE")


def _statements(store: Store, action: Any) -> list[tuple[str, Any]]:
    seen: list[tuple[str, Any]] = []

    def record(_conn: Any, _cursor: Any, statement: str, params: Any, *_: Any) -> None:
        if "deliveries" in statement:
            seen.append((statement, params))

    event.listen(Engine, "before_cursor_execute", record)
    try:
        action()
    finally:
        event.remove(Engine, "before_cursor_execute", record)
    return seen


def _plan(db_url: str, statement: str, params: Any) -> str:
    engine = create_engine(normalise_url(db_url))
    try:
        with engine.connect() as conn:
            if engine.dialect.name == "sqlite":
                rows = conn.exec_driver_sql(f"EXPLAIN QUERY PLAN {statement}", params).all()
                return "\n".join(str(row[-1]) for row in rows)
            [(plan,)] = conn.exec_driver_sql(f"EXPLAIN (FORMAT JSON) {statement}", params).all()
            return json.dumps(plan)
    finally:
        engine.dispose()


def test_backlog_counts_read_only_the_open_deliveries_indexes(store: Store, db_url: str) -> None:
    _fill(db_url)
    assert store.queue.backlog() == {"a": 3, "b": 2}
    assert HealthStore(store).backlog() == {"a": (3, HISTORY + 1.0), "b": (2, HISTORY + 4.0)}
    for action in (store.queue.backlog, HealthStore(store).backlog):
        statements = _statements(store, action)
        assert statements
        for statement, params in statements:
            plan = _plan(db_url, statement, params)
            if store.backend.name == "sqlite":
                scans = [line for line in plan.splitlines() if "deliveries" in line]
                assert scans, plan
                for line in scans:
                    assert "ix_deliveries_due" in line or "ix_deliveries_queued" in line, plan
            else:
                assert '"Seq Scan"' not in plan, plan
