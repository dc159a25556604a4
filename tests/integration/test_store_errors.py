"""The store's edge: whatever the driver raises reaches callers as efd.errors, on real
databases (a refused connection, a constraint, a statement the database rejects)."""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import psycopg
import pytest
from sqlalchemy import make_url, text

from efd.errors import StoreDataError, StoreError, StoreUnavailable
from efd.groupcommit import GroupCommit
from efd.records import ClaimRequest, InsertStatus, NewMessage
from efd.store import Store, engine, migrate
from efd.store.health import HealthStore
from efd.store.regulations import RegulationsStore
from efd.store.runner import AsyncStore
from efd.store.suppressions import Suppressions
from tests.conftest import PG_ADMIN_URL
from tests.support.rows import new_message, outcome_row


@pytest.fixture
def store(db_url: str) -> Iterator[Store]:
    migrate.upgrade(db_url)
    s = Store(db_url)
    yield s
    s.dispose()


def test_an_unreachable_database_is_store_unavailable() -> None:
    # Port 1 on the loopback: nothing listens, the connection is refused at once.
    store = Store("postgresql://efd@127.0.0.1:1/efd")
    try:
        with pytest.raises(StoreUnavailable) as raised:
            HealthStore(store).ping()
        assert raised.value.__cause__ is not None  # the driver's error, kept for the logs
    finally:
        store.dispose()


def test_an_unopenable_database_file_is_store_unavailable(tmp_path: Path) -> None:
    (tmp_path / "efd.db").mkdir()  # a directory where the file should be
    store = Store(f"sqlite:///{tmp_path / 'efd.db'}")
    try:
        with pytest.raises(StoreUnavailable):
            HealthStore(store).ping()
    finally:
        store.dispose()


def test_a_violated_constraint_is_a_store_error_not_unavailability(store: Store) -> None:
    regulations = RegulationsStore(store, Suppressions(store))
    regulations.create_regulation("r1", "DELETE_ONLY", None, ["u1"], time.time())
    with pytest.raises(StoreError) as raised:
        regulations.create_regulation("r1", "DELETE_ONLY", None, ["u1"], time.time())
    assert not isinstance(raised.value, StoreUnavailable)


async def test_the_runner_raises_store_errors_and_notes_failed_writes(store: Store) -> None:
    db = AsyncStore(store)

    def bad_statement() -> None:
        # Straight on the engine, past the parts' transactions: the runner's edge still
        # turns the driver's error into efd's.
        with store.database.writer.begin() as conn:
            conn.execute(text("SELECT * FROM no_such_table"))

    try:
        failed_before = db.write_failed
        with pytest.raises(StoreError):
            await db.write(bad_statement)
        assert failed_before is None
        assert db.write_failed is not None
        with pytest.raises(StoreError):
            await db.read(bad_statement)
    finally:
        db.close()


def _end_sessions(store: Store, db_url: str) -> None:
    """The server ends every session of the store's database, as a restart would."""
    with psycopg.connect(PG_ADMIN_URL, autocommit=True) as conn:
        [(ended,)] = conn.execute(
            "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity"
            " WHERE datname = %s AND pid <> pg_backend_pid()",
            (make_url(db_url).database,),
        ).fetchall()
    assert ended, "the store held no session to end"


def _sessions_ended_after_use(store: Store, db_url: str) -> HealthStore:
    """The store, used once (a pooled connection), then every session ended by the server."""
    if store.backend.name == "sqlite":
        pytest.skip("PostgreSQL's sessions")
    health = HealthStore(store)
    health.ping()
    _end_sessions(store, db_url)
    return health


def test_a_connection_dropped_while_idle_is_replaced_before_use(
    store: Store, db_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    health = _sessions_ended_after_use(store, db_url)
    monkeypatch.setattr(engine, "PING_AFTER_IDLE", 0.0)  # it has been idle long enough
    health.ping()  # the pooled connection is found dead at checkout and replaced


def test_a_connection_dropped_while_busy_fails_one_call_then_reconnects(
    store: Store, db_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    health = _sessions_ended_after_use(store, db_url)
    monkeypatch.setattr(engine, "PING_AFTER_IDLE", 3600.0)  # in steady use: no ping
    with pytest.raises(StoreUnavailable):
        health.ping()
    health.ping()  # the failure invalidated the pool: a new session


@pytest.mark.parametrize("step", ["ingest", "claim", "record"])
def test_a_session_ended_under_a_hot_statement_fails_one_call_then_reconnects(
    store: Store, db_url: str, monkeypatch: pytest.MonkeyPatch, step: str
) -> None:
    """Ingestion, claims and outcomes run on the driver's own cursor: a session the server
    ended is StoreUnavailable for that call, as for any other statement, and the next call
    gets a new session, not the dead one back from the pool."""
    if store.backend.name == "sqlite":
        pytest.skip("PostgreSQL's sessions")
    monkeypatch.setattr(engine, "PING_AFTER_IDLE", 3600.0)  # in steady use: no ping
    now = time.time()
    store.ingestion.insert_messages([new_message("m1"), new_message("m2")], now)
    [claimed] = store.queue.claim(ClaimRequest("d", 1, owner="t", now=now, lease_until=now + 60))
    calls: dict[str, Callable[[int], object]] = {
        "ingest": lambda n: store.ingestion.insert_messages([new_message(f"new{n}")], now),
        "claim": lambda n: store.queue.claim(
            ClaimRequest("d", 1, owner="t", now=now, lease_until=now + 60)
        ),
        "record": lambda n: store.queue.record(
            [outcome_row(claimed.delivery_id, token=claimed.lease_token)], []
        ),
    }
    _end_sessions(store, db_url)
    with pytest.raises(StoreUnavailable):
        calls[step](1)
    calls[step](2)  # a new session: the failure invalidated the dead one
    done = {
        "ingest": "SELECT count(*) FROM messages WHERE message_id = 'new2'",
        "claim": "SELECT count(*) FROM deliveries WHERE lease_owner = 't'",
        "record": "SELECT count(*) FROM deliveries WHERE status = 'delivered'",
    }
    with psycopg.connect(db_url) as conn:
        assert conn.execute(done[step]).fetchall() == [(1 if step != "claim" else 2,)]


# -- a value the database cannot hold --------------------------------------------------------

# Past validation (which refuses it: efd/segment/messages.py), as a bug there would let it by.
SECRET_VALUE = "u\x00client-secret-value"


def test_a_value_the_database_refuses_is_a_data_error_that_quotes_no_value(store: Store) -> None:
    rows = [new_message("m1", user=SECRET_VALUE)]
    if store.backend.name == "sqlite":
        # SQLite's text holds U+0000: stored as given.
        store.ingestion.insert_messages(rows, time.time())
        return
    with pytest.raises(StoreDataError) as raised:
        store.ingestion.insert_messages(rows, time.time())
    assert not isinstance(raised.value, StoreUnavailable)
    shown = str(raised.value)
    assert shown.startswith("(psycopg.errors.UntranslatableCharacter) "), shown
    # The driver's first line alone: PostgreSQL's CONTEXT quotes the rows' JSON.
    assert "\n" not in shown
    assert "CONTEXT" not in shown
    assert "\\u0000" not in shown
    assert "client-secret-value" not in shown


async def test_a_refused_value_fails_its_own_submission_only(
    store: Store, caplog: pytest.LogCaptureFixture
) -> None:
    """In one group commit beside good submissions, as the daemon's ingestion writes them:
    the good ones are stored, only the bad one fails, and readiness hears of no failure."""
    db = AsyncStore(store)

    async def flush(take: Callable[[], list[NewMessage]]) -> list[InsertStatus]:
        def write() -> list[InsertStatus]:
            rows = take()
            return store.ingestion.insert_messages(rows, time.time()) if rows else []

        return await db.write_later(write)

    writer: GroupCommit[NewMessage, InsertStatus] = GroupCommit(
        flush, max_items=100, name="writer", depth=2
    )
    writer.start()
    try:
        with caplog.at_level(logging.DEBUG):
            results = await asyncio.gather(
                *(writer.submit([new_message(f"good-{i}")]) for i in range(3)),
                writer.submit([new_message("bad", user=SECRET_VALUE)]),
                *(writer.submit([new_message(f"good-{i}")]) for i in range(3, 6)),
                return_exceptions=True,
            )
        pg = store.backend.name == "postgresql"
        expected_bad: Any = StoreDataError if pg else list
        assert [type(r) for r in results] == [list] * 3 + [expected_bad] + [list] * 3, results
        assert all(r == [InsertStatus.STORED] for i, r in enumerate(results) if i != 3)
        assert db.write_failed is None
        if pg:  # they were one group, whose transaction the bad one failed at first
            assert any("retrying one by one" in r.getMessage() for r in caplog.records)
        with store.database.read() as conn:
            stored = conn.execute(text("SELECT message_id FROM messages")).scalars().all()
        assert sorted(stored) == sorted([f"good-{i}" for i in range(6)] + ([] if pg else ["bad"]))
        assert not any("client-secret-value" in r.getMessage() for r in caplog.records)
    finally:
        await writer.close()
        db.close()
