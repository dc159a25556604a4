"""The store on real SQLite files and real PostgreSQL databases."""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import json
import math
import re
import sqlite3
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, Self

import psycopg
import pytest
from alembic import command
from alembic.autogenerate import compare_metadata
from alembic.migration import MigrationContext
from psycopg import sql as psql
from sqlalchemy import ForeignKeyConstraint, create_engine, event, inspect, text
from sqlalchemy.sql.schema import SchemaItem

from efd.errors import StoreUnavailable
from efd.records import (
    AttemptRow,
    Claimed,
    ClaimRequest,
    DeliveryQuery,
    DeliveryStatus,
    NewMessage,
    Outcome,
)
from efd.store import Store, migrate
from efd.store.backends import sqlite as sqlite_backend
from efd.store.backends.base import MESSAGE_COLUMNS
from efd.store.dedupe import message_key
from efd.store.engine import make_engine, normalise_url
from efd.store.operations import REDRIVABLE, OperationsStore
from efd.store.queue import MESSAGE_GONE
from efd.store.schema import metadata, suppressions
from efd.store.suppressions import Suppressions
from tests.conftest import sql
from tests.support.rows import new_message as message
from tests.support.rows import outcome_row


@pytest.fixture
def store(db_url: str) -> Iterator[Store]:
    migrate.upgrade(db_url)
    s = Store(db_url)
    yield s
    s.dispose()


def test_insert_stores_messages_and_one_delivery_per_destination(store: Store, db_url: str) -> None:
    assert store.ingestion.insert_messages(
        [message("a", destinations=("d", "e")), message("b")], time.time()
    ) == ["stored", "stored"]
    assert sql(db_url, "SELECT count(*) FROM messages") == [(2,)]
    assert sql(db_url, "SELECT destination FROM deliveries ORDER BY id") == [("d",), ("e",), ("d",)]


def test_dedupe_within_24_hours_per_source(store: Store, db_url: str) -> None:
    now = time.time()
    assert store.ingestion.insert_messages([message("a"), message("a")], now) == [
        "stored",
        "duplicate",
    ]
    assert store.ingestion.insert_messages([message("a")], now) == ["duplicate"]
    assert store.ingestion.insert_messages([message("a", source="other")], now) == ["stored"]
    # Older than the window: accepted again.
    sql(db_url, "UPDATE messages SET received_at = :t", t=now - 25 * 3600)
    assert store.ingestion.insert_messages([message("a")], now) == ["stored"]


def test_claim_leases_and_hides_rows_until_the_lease_lapses(store: Store) -> None:
    now = time.time()
    store.ingestion.insert_messages([message(f"m{i}") for i in range(5)], now)
    first = store.queue.claim(ClaimRequest("d", 3, owner="A", now=now, lease_until=now + 60))
    assert len(first) == 3
    assert all(c.lease_token == 1 for c in first)
    second = store.queue.claim(ClaimRequest("d", 10, owner="B", now=now, lease_until=now + 60))
    assert len(second) == 2
    assert not {c.delivery_id for c in first} & {c.delivery_id for c in second}
    assert (
        store.queue.claim(ClaimRequest("d", 10, owner="C", now=now + 1, lease_until=now + 61)) == []
    )
    # The lease lapses: the rows are due again, and the token moves on.
    again = store.queue.claim(ClaimRequest("d", 10, owner="C", now=now + 61, lease_until=now + 121))
    assert len(again) == 5
    assert all(c.lease_token == 2 for c in again)


def test_a_claim_past_now_never_takes_a_row_under_a_live_lease(store: Store) -> None:
    # A circuit's probe claims the earliest pending delivery, due or not; a delivery another
    # daemon holds must stay its own, or both send it at once.
    now = time.time()
    store.ingestion.insert_messages([message("held")], now)
    [held] = store.queue.claim(ClaimRequest("d", 1, owner="A", now=now, lease_until=now + 60))
    store.ingestion.insert_messages([message("later")], now + 5)  # due at now + 5
    probe = store.queue.claim(
        ClaimRequest("d", 10, owner="B", now=now + 1, lease_until=now + 100, due_by=math.inf)
    )
    assert [c.message_id for c in probe] == ["later"]
    assert held.message_id == "held"
    # Once A's lease lapses, the row is anyone's again.
    again = store.queue.claim(
        ClaimRequest("d", 10, owner="C", now=now + 61, lease_until=now + 121, due_by=math.inf)
    )
    assert [c.message_id for c in again] == ["held"]


def test_fencing_token_rejects_a_stale_outcome(store: Store, db_url: str) -> None:
    now = time.time()
    store.ingestion.insert_messages([message("m")], now)
    [stale] = store.queue.claim(ClaimRequest("d", 1, owner="A", now=now, lease_until=now + 1))
    [fresh] = store.queue.claim(ClaimRequest("d", 1, owner="B", now=now + 2, lease_until=now + 62))

    def outcome(claim: Claimed, status: DeliveryStatus) -> Outcome:
        return Outcome(
            delivery_id=claim.delivery_id,
            lease_token=claim.lease_token,
            status=status,
            attempts=1,
            first_attempt_at=now,
            next_attempt_at=None,
            finished_at=now,
            failed_hooks=frozenset(),
            last_error=None,
        )

    row = AttemptRow(stale.delivery_id, "http://h", now, 1.0, "fail", 400, None, None, None)
    assert store.queue.record([outcome(stale, DeliveryStatus.FAILED)], [row]) == 1  # ignored
    assert sql(db_url, "SELECT status, lease_owner FROM deliveries") == [("pending", "B")]
    assert sql(db_url, "SELECT count(*) FROM attempts") == [(1,)]  # the attempt happened
    assert store.queue.record([outcome(fresh, DeliveryStatus.DELIVERED)], []) == 0
    assert sql(db_url, "SELECT status, lease_owner FROM deliveries") == [("delivered", None)]


def test_a_batch_of_outcomes_writes_each_row_and_skips_only_the_stale(
    store: Store, db_url: str
) -> None:
    now = time.time()
    store.ingestion.insert_messages([message(f"m{i}") for i in range(6)], now)
    claimed = store.queue.claim(ClaimRequest("d", 6, owner="A", now=now, lease_until=now + 1))
    # Two leases lapse and another process takes them over: A's outcomes for them are stale.
    taken = store.queue.claim(ClaimRequest("d", 2, owner="B", now=now + 2, lease_until=now + 62))
    stale_ids = {c.delivery_id for c in taken}
    fields = {
        DeliveryStatus.DELIVERED: (1, None, now + 1, frozenset(), None),
        DeliveryStatus.PENDING: (2, now + 30, None, frozenset({"http://a"}), "HTTP 503: 'x' \\ é"),
        DeliveryStatus.FAILED: (3, None, now + 3, frozenset({"http://a", "http://b"}), "gone"),
    }
    statuses = [DeliveryStatus.DELIVERED, DeliveryStatus.PENDING, DeliveryStatus.FAILED]
    outcomes = []
    for i, claim in enumerate(claimed):
        status = statuses[i % 3]
        attempts, next_at, finished, failed, error = fields[status]
        outcomes.append(
            Outcome(
                delivery_id=claim.delivery_id,
                lease_token=claim.lease_token,
                status=status,
                attempts=attempts,
                first_attempt_at=now + i,
                next_attempt_at=next_at,
                finished_at=finished,
                failed_hooks=failed,
                last_error=error,
            )
        )
    assert store.queue.record(outcomes, []) == 2
    rows = sql(
        db_url,
        "SELECT id, status, attempts, first_attempt_at, next_attempt_at, finished_at,"
        " failed_hooks, last_error, lease_owner, lease_token FROM deliveries ORDER BY id",
    )
    expected: list[tuple[object, ...]] = []
    for o, claim in zip(outcomes, claimed, strict=True):
        if o.delivery_id in stale_ids:
            [b] = [c for c in taken if c.delivery_id == o.delivery_id]
            expected.append(
                (o.delivery_id, "pending", 0, None, now + 62, None, None, None, "B", b.lease_token)
            )
            continue
        failed_json = json.dumps(sorted(o.failed_hooks)) if o.failed_hooks else None
        expected.append(
            (
                o.delivery_id,
                str(o.status),
                o.attempts,
                o.first_attempt_at,
                o.next_attempt_at,
                o.finished_at,
                failed_json,
                o.last_error,
                None,
                claim.lease_token,
            )
        )
    assert [tuple(r) for r in rows] == expected
    # Again: a finished row is no longer pending, so only the retries (still pending under
    # the same token) match, as they would row by row.
    again = [o for o in outcomes if o.delivery_id not in stale_ids]
    retries = sum(o.status is DeliveryStatus.PENDING for o in again)
    assert store.queue.record(again, []) == len(again) - retries


def test_a_batch_of_attempts_keeps_every_column(store: Store, db_url: str) -> None:
    now = time.time()
    store.ingestion.insert_messages([message(f"m{i}") for i in range(3)], now)
    claimed = store.queue.claim(ClaimRequest("d", 3, owner="A", now=now, lease_until=now + 60))
    rows = [
        AttemptRow(claimed[0].delivery_id, "http://a/h", now, 1.5, "success", 200, None, None, ""),
        AttemptRow(
            claimed[1].delivery_id, "http://b/h?k=***", now + 1, 2.5, "retry", 503, None, None,
            'busy: "try later", \\ é {}',
        ),
        AttemptRow(
            claimed[2].delivery_id, "http://c/h", now + 2, 5000.0, "retry", None, "timeout",
            "no answer in 5 s", None,
        ),
    ]  # fmt: skip
    store.queue.record([], rows)
    stored = sql(
        db_url,
        "SELECT delivery_id, hook_url, attempted_at, duration_ms, outcome, status_code,"
        " error_class, error, response_head FROM attempts ORDER BY id",
    )
    assert [tuple(r) for r in stored] == [dataclasses.astuple(r) for r in rows]


def test_concurrent_claimers_never_share_a_delivery(store: Store, db_url: str) -> None:
    now = time.time()
    store.ingestion.insert_messages([message(f"m{i}") for i in range(400)], now)
    claims: list[list[int]] = []
    lock = threading.Lock()

    def worker(name: str) -> None:
        own = Store(db_url)
        try:
            while batch := own.queue.claim(
                ClaimRequest("d", 7, owner=name, now=now, lease_until=now + 60)
            ):
                with lock:
                    claims.append([c.delivery_id for c in batch])
        finally:
            own.dispose()

    threads = [threading.Thread(target=worker, args=(f"w{i}",)) for i in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    ids = [i for batch in claims for i in batch]
    assert len(ids) == 400
    assert len(set(ids)) == 400


def test_release_all_leases_makes_them_due_now(store: Store, db_url: str) -> None:
    now = time.time()
    store.ingestion.insert_messages([message("m")], now)
    store.queue.claim(ClaimRequest("d", 1, owner="A", now=now, lease_until=now + 600))
    assert store.queue.release_all_leases(now + 1) == 1
    assert sql(db_url, "SELECT lease_owner, next_attempt_at FROM deliveries") == [(None, now + 1)]


def test_wake_skips_deliveries_whose_failed_hooks_name_the_hook_in_any_form(
    store: Store, db_url: str
) -> None:
    """failed_hooks names a hook by its label, or by its raw URL in rows written before
    labels: a circuit's closing wakes neither. A hook that only reads alike (" #2") is
    another hook."""
    label, url = "https://***@h.example/in?k=***", "https://u:p@h.example/in?k=s_%"
    now = time.time()
    store.ingestion.insert_messages([message(f"m{i}") for i in range(4)], now)
    failed = [[label], [url], [f"{label} #2"], None]
    for pk, hooks in enumerate(failed, start=1):
        sql(
            db_url,
            "UPDATE deliveries SET next_attempt_at = :later, failed_hooks = :failed WHERE id = :pk",
            later=now + 600,
            failed=None if hooks is None else json.dumps(hooks),
            pk=pk,
        )
    assert store.queue.wake("d", (label, url), now) == 2
    assert sql(
        db_url, "SELECT id FROM deliveries WHERE next_attempt_at = :now ORDER BY id", now=now
    ) == [
        (3,),
        (4,),
    ]


def test_purge_removes_only_finished_old_messages(store: Store, db_url: str) -> None:
    now = time.time()
    store.ingestion.insert_messages(
        [message("done"), message("pending"), message("no-route", destinations=())], now
    )
    sql(db_url, "UPDATE messages SET received_at = :t", t=now - 10 * 86400)
    sql(
        db_url,
        "UPDATE deliveries SET status = 'delivered', finished_at = :t WHERE message_pk = "
        "(SELECT id FROM messages WHERE message_id = 'done')",
        t=now - 9 * 86400,
    )
    assert store.jobs.purge_finished(now - 7 * 86400, 1000) == 2
    assert sql(db_url, "SELECT message_id FROM messages") == [("pending",)]
    assert sql(db_url, "SELECT count(*) FROM deliveries") == [(1,)]


def test_a_claim_fails_a_delivery_whose_message_is_gone_and_takes_the_rest(
    store: Store, db_url: str
) -> None:
    # PostgreSQL declares no foreign key from deliveries to messages (migration 0011), and an
    # operator's DELETE without efd's own connection settings checks none on SQLite either.
    now = time.time()
    store.ingestion.insert_messages([message("kept"), message("gone"), message("also")], now)
    sql(db_url, "DELETE FROM messages WHERE message_id = 'gone'")
    claimed = store.queue.claim(ClaimRequest("d", 10, owner="A", now=now, lease_until=now + 60))
    assert [c.message_id for c in claimed] == ["kept", "also"]
    assert sql(
        db_url,
        "SELECT status, last_error, lease_owner, finished_at IS NOT NULL FROM deliveries"
        " WHERE message_pk NOT IN (SELECT id FROM messages)",
    ) == [("failed", MESSAGE_GONE, None, True)]
    # Failed for good: never claimed again, and the others come back once their lease lapses.
    again = store.queue.claim(ClaimRequest("d", 10, owner="B", now=now + 61, lease_until=now + 121))
    assert [c.message_id for c in again] == ["kept", "also"]


def test_migration_0011_declares_the_delivery_keys_on_sqlite_only(db_url: str) -> None:
    keys = {("deliveries", "message_pk", "messages"), ("attempts", "delivery_id", "deliveries")}
    sqlite = db_url.startswith("sqlite")
    migrate.upgrade(db_url)
    assert _delivery_keys(db_url) == (keys if sqlite else set())
    _downgrade(db_url, "0010")
    assert _delivery_keys(db_url) == keys
    migrate.upgrade(db_url)
    assert _delivery_keys(db_url) == (keys if sqlite else set())


def _delivery_keys(url: str) -> set[tuple[str, str, str]]:
    engine = create_engine(normalise_url(url))
    try:
        found = inspect(engine)
        return {
            (table, key["constrained_columns"][0], key["referred_table"])
            for table in ("deliveries", "attempts")
            for key in found.get_foreign_keys(table)
        }
    finally:
        engine.dispose()


def test_migrations_are_idempotent_and_at_head(db_url: str) -> None:
    migrate.upgrade(db_url)
    migrate.upgrade(db_url)
    assert migrate.current_revision(db_url) == migrate.head_revision()


def test_a_periodic_job_runs_once_per_interval_across_processes(store: Store, db_url: str) -> None:
    now = time.time()
    other = Store(db_url)
    try:
        assert store.jobs.claim_job("retention", interval=600, owner="A", now=now) is True
        assert other.jobs.claim_job("retention", interval=600, owner="B", now=now + 1) is False
        assert store.jobs.claim_job("retention", interval=600, owner="A", now=now + 2) is False
        assert other.jobs.claim_job("retention", interval=600, owner="B", now=now + 600) is True
        assert sql(db_url, "SELECT name, owner FROM jobs") == [("retention", "B")]
    finally:
        other.dispose()


async def test_stored_work_notifies_listeners_in_other_processes(store: Store, db_url: str) -> None:
    if store.backend.name == "sqlite":
        pytest.skip("LISTEN/NOTIFY is PostgreSQL's; SQLite serves one process")
    calls = 0
    listening = asyncio.Event()
    woken = asyncio.Event()

    def on_notify() -> None:
        nonlocal calls
        calls += 1
        (listening if calls == 1 else woken).set()  # the first call marks "now listening"

    listener = Store(db_url)
    task = asyncio.create_task(listener.listener.listen(on_notify))
    try:
        async with asyncio.timeout(10):
            await listening.wait()
        await asyncio.to_thread(store.ingestion.insert_messages, [message("wake-up")], time.time())
        async with asyncio.timeout(2):
            await woken.wait()  # else: no NOTIFY reached the other connection
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task
        listener.dispose()


async def test_a_lost_listen_connection_raises_store_unavailable(store: Store, db_url: str) -> None:
    """The daemon's Worker listens again after its back-off when this raises."""
    if store.backend.name == "sqlite":
        pytest.skip("LISTEN/NOTIFY is PostgreSQL's; SQLite serves one process")
    listening = asyncio.Event()
    listener = Store(db_url)
    task = asyncio.create_task(listener.listener.listen(listening.set))
    try:
        async with asyncio.timeout(10):
            await listening.wait()
        database = db_url.rsplit("/", 1)[1]
        sql(
            db_url,
            "SELECT pg_terminate_backend(pid) FROM pg_stat_activity"
            f" WHERE datname = '{database}' AND query LIKE 'LISTEN%'",
        )
        with pytest.raises(StoreUnavailable, match="LISTEN connection failed"):
            async with asyncio.timeout(10):
                await task
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError, StoreUnavailable):
            await task
        listener.dispose()


def test_only_acknowledgements_wait_for_the_disk(store: Store) -> None:
    if store.backend.name != "sqlite":
        pytest.skip("synchronous is SQLite's setting")
    with store.database.bookkeeping() as conn:
        relaxed = conn.exec_driver_sql("PRAGMA synchronous").scalar()
    with store.database.writer.begin() as conn:
        durable = conn.exec_driver_sql("PRAGMA synchronous").scalar()
    assert (relaxed, durable) == (1, 2)  # NORMAL for claims and outcomes, FULL for ingestion


def test_sqlite_writer_checkpoints_every_10000_pages_and_indexes_keys_in_memory(
    store: Store,
) -> None:
    if store.backend.name != "sqlite":
        pytest.skip("SQLite's settings")
    with store.database.writer.begin() as conn:
        assert conn.exec_driver_sql("PRAGMA wal_autocheckpoint").scalar() == 10000
        databases = {row[1]: row[2] for row in conn.exec_driver_sql("PRAGMA database_list")}
        assert databases["dedupe"] == ""  # an in-memory database
    with store.database.reader.begin() as conn:
        assert "dedupe" not in {row[1] for row in conn.exec_driver_sql("PRAGMA database_list")}


def test_sqlite_binds_none_as_null_through_a_registered_adapter(store: Store) -> None:
    """efd/store/engine.py spares the driver its failing adaptation lookup for None; None
    must still reach SQLite as NULL."""
    if store.backend.name != "sqlite":
        pytest.skip("the sqlite3 driver's adaptation")
    assert (type(None), sqlite3.PrepareProtocol) in sqlite3.adapters
    with store.database.writer.begin() as conn:
        row = conn.exec_driver_sql("SELECT ? IS NULL, typeof(?)", (None, None)).one()
    assert tuple(row) == (1, "null")


def test_a_colliding_message_key_never_drops_a_message(store: Store, db_url: str) -> None:
    """Equal keys are candidates only: the store compares source and messageId."""
    now = time.time()
    store.ingestion.insert_messages([message("a")], now)
    sql(db_url, "UPDATE messages SET message_key = :k", k=message_key("web", "b"))
    store.database.writer.dispose()  # SQLite: the next writer connection indexes the changed key
    assert store.ingestion.insert_messages([message("b")], now) == ["stored"]
    assert store.ingestion.insert_messages([message("a"), message("b")], now) == [
        "duplicate",
        "duplicate",
    ]


def test_a_restarted_store_still_knows_the_last_24_hours(db_url: str) -> None:
    """On SQLite the index is in the writer's memory: a new process rebuilds it."""
    migrate.upgrade(db_url)
    now = time.time()
    first = Store(db_url)
    try:
        assert first.ingestion.insert_messages([message("a"), message("b")], now) == ["stored"] * 2
        sql(db_url, "UPDATE messages SET received_at = :t WHERE message_id = 'b'", t=now - 90_000)
    finally:
        first.dispose()
    second = Store(db_url)
    try:
        second.ingestion.index_recent_messages(now)
        if second.backend.name == "sqlite":
            assert _in_memory_keys(second) == [message_key("web", "a")]  # not b: too old
        got = second.ingestion.insert_messages([message("a"), message("b"), message("c")], now)
        assert got == ["duplicate", "stored", "stored"]
    finally:
        second.dispose()


def test_a_rolled_back_fill_is_done_again(db_url: str) -> None:
    """A new writer connection fills its in-memory index in its first transaction; if that
    transaction rolls back, the fill goes with it, and the next one must fill again."""
    if not db_url.startswith("sqlite"):
        pytest.skip("the in-memory index is SQLite's")
    migrate.upgrade(db_url)
    now = time.time()
    first = Store(db_url)
    try:
        assert first.ingestion.insert_messages([message("a")], now) == ["stored"]
    finally:
        first.dispose()
    second = Store(db_url)

    def fill_then_fail() -> None:
        with second.database.writer.begin() as conn:
            sqlite_backend.ensure(conn, now, 24 * 3600)
            raise RuntimeError("the transaction fails after the fill")

    try:
        with pytest.raises(RuntimeError):
            fill_then_fail()
        assert second.ingestion.insert_messages([message("a")], now) == ["duplicate"]
    finally:
        second.dispose()


def test_sqlite_drops_keys_from_memory_once_24_hours_old(store: Store) -> None:
    if store.backend.name != "sqlite":
        pytest.skip("the in-memory index is SQLite's")
    now = time.time()
    store.ingestion.insert_messages([message("a"), message("b")], now)
    later = now + 24 * 3600 + sqlite_backend.PRUNE_EVERY_SECONDS

    def received_later(mid: str) -> NewMessage:
        m = message(mid)
        m.received_at = later
        return m

    assert store.ingestion.insert_messages([received_later("c")], later) == ["stored"]
    assert _in_memory_keys(store) == [message_key("web", "c")]
    got = store.ingestion.insert_messages([received_later("a"), received_later("c")], later)
    assert got == ["stored", "duplicate"]


def test_a_message_deleted_then_sent_again_is_stored_once(store: Store, db_url: str) -> None:
    """SQLite numbers messages max(id) + 1, so the new row takes the deleted one's id, and
    its key may still be in the writer's memory."""
    now = time.time()
    assert store.ingestion.insert_messages([message("a")], now) == ["stored"]
    sql(db_url, "DELETE FROM messages")
    assert store.ingestion.insert_messages([message("a")], now) == ["stored"]
    assert store.ingestion.insert_messages([message("a")], now) == ["duplicate"]
    assert sql(db_url, "SELECT count(*) FROM messages") == [(1,)]


def _in_memory_keys(store: Store) -> list[int]:
    with store.database.writer.begin() as conn:
        return [k for (k,) in conn.exec_driver_sql("SELECT message_key FROM dedupe.recent")]


def test_migration_0005_keeps_the_key_index_on_postgresql_only(db_url: str) -> None:
    migrate.upgrade(db_url)
    sqlite = db_url.startswith("sqlite")
    assert ("ix_messages_message_key" in _indexes(db_url)) is not sqlite
    _downgrade(db_url, "0004")
    assert "ix_messages_message_key" in _indexes(db_url)
    migrate.upgrade(db_url)
    assert ("ix_messages_message_key" in _indexes(db_url)) is not sqlite


def test_migration_0004_keys_existing_messages(db_url: str) -> None:
    """A database from before the key still deduplicates the messages it already holds."""
    migrate.upgrade(db_url)
    _downgrade(db_url, "0003")
    assert "message_key" not in _columns(db_url, "messages")
    now = time.time()
    for mid in ("a", "b", "c"):
        sql(
            db_url,
            "INSERT INTO messages (source, message_id, type, timestamp, received_at, body) "
            "VALUES ('web', :mid, 'track', :now, :now, '{}')",
            mid=mid, now=now,
        )  # fmt: skip
    migrate.upgrade(db_url)
    assert sql(db_url, "SELECT message_id, message_key FROM messages ORDER BY id") == [
        (mid, message_key("web", mid)) for mid in ("a", "b", "c")
    ]
    s = Store(db_url)
    try:
        assert s.ingestion.insert_messages([message("b"), message("d")], now) == [
            "duplicate",
            "stored",
        ]
    finally:
        s.dispose()


def _indexes(url: str) -> set[str | None]:
    engine = create_engine(normalise_url(url))
    try:
        return {i["name"] for i in inspect(engine).get_indexes("messages")}
    finally:
        engine.dispose()


def _columns(url: str, table: str) -> set[str]:
    engine = create_engine(normalise_url(url))
    try:
        return {c["name"] for c in inspect(engine).get_columns(table)}
    finally:
        engine.dispose()


def _downgrade(url: str, revision: str) -> None:
    engine = make_engine(url, writer=True)
    config = migrate._config()
    try:
        with engine.connect() as conn:
            config.attributes["connection"] = conn
            command.downgrade(config, revision)
            conn.commit()
    finally:
        engine.dispose()


def test_migrated_schema_matches_the_tables_efd_uses(db_url: str) -> None:
    migrate.upgrade(db_url)
    engine = create_engine(normalise_url(db_url))
    try:
        with engine.connect() as conn:
            # alembic does not read Index.ddl_if: the key index is PostgreSQL's only (0005).
            # Nor ForeignKeyConstraint.ddl_if: the delivery keys are SQLite's only (0011).
            def include(
                obj: SchemaItem,
                name: str | None,
                kind: str,
                _reflected: bool,
                _compare_to: SchemaItem | None,
            ) -> bool:
                if kind == "foreign_key_constraint" and not sqlite:
                    assert isinstance(obj, ForeignKeyConstraint)
                    return obj.table.name not in ("deliveries", "attempts")
                return not (kind == "index" and name == "ix_messages_message_key" and sqlite)

            sqlite = conn.dialect.name == "sqlite"
            context = MigrationContext.configure(conn, opts={"include_object": include})
            assert compare_metadata(context, metadata) == []
    finally:
        engine.dispose()


def _captured(
    store: Store, needle: str, action: Callable[[], object]
) -> tuple[str, dict[str, Any]]:
    """The first statement containing `needle` that `action` makes the store execute on
    psycopg's cursors (SQLAlchemy's and the backend's own), with its parameters."""
    seen: list[tuple[str, dict[str, Any]]] = []

    class Recording(psycopg.Cursor[Any]):
        def execute(self, query: Any, params: Any = None, **kwargs: Any) -> Self:
            if needle in str(query) and not seen:
                seen.append((str(query), params))
            return super().execute(query, params, **kwargs)

    touched: list[psycopg.Connection[Any]] = []

    def record(dbapi_connection: psycopg.Connection[Any], _record: object, _proxy: object) -> None:
        dbapi_connection.cursor_factory = Recording
        touched.append(dbapi_connection)

    event.listen(store.database.writer.pool, "checkout", record)
    try:
        action()
    finally:
        event.remove(store.database.writer.pool, "checkout", record)
        for dbapi_connection in touched:
            dbapi_connection.cursor_factory = psycopg.Cursor
    assert seen, f"no statement with {needle!r} was executed"
    return seen[0]


def _plan_nodes(
    db_url: str, statement: str, params: dict[str, Any], *, generic: bool
) -> list[dict[str, Any]]:
    """EXPLAIN of a statement as a prepared statement, the way psycopg runs a statement it has
    seen often; with `generic`, under plan_cache_mode = force_generic_plan (the plan
    PostgreSQL may cache and reuse whatever the parameters)."""
    order = _parameter_order(statement)
    prepared = re.sub(r"%\((\w+)\)s", lambda m: f"${order.index(m.group(1)) + 1}", statement)
    with psycopg.connect(
        normalise_url(db_url).set(drivername="postgresql").render_as_string(False)
    ) as pg:
        if generic:
            pg.execute("SET plan_cache_mode = force_generic_plan")
        pg.execute(f"PREPARE q AS {prepared}")
        args = ", ".join(psql.Literal(params[name]).as_string(pg) for name in order)
        [(plan,)] = pg.execute(f"EXPLAIN (FORMAT JSON) EXECUTE q({args})").fetchall()
        pg.rollback()
    return _nodes(plan)


def _parameter_order(statement: str) -> list[str]:
    """The names of a psycopg statement's %(name)s parameters, in order of first use."""
    return list(dict.fromkeys(re.findall(r"%\((\w+)\)s", statement)))


def _nodes(plan: Any) -> list[dict[str, Any]]:
    """Every node of an EXPLAIN (FORMAT JSON) plan."""
    nodes: list[dict[str, Any]] = []
    todo = [plan[0]["Plan"]]
    while todo:
        node = todo.pop()
        nodes.append(node)
        todo.extend(node.get("Plans", []))
    return nodes


def _fill_unanalyzed(db_url: str, n: int) -> None:
    """n messages with pending deliveries, and no statistics on either table: as right after
    a bulk load or a restore, or on a server whose autovacuum is off."""
    for table in ("messages", "deliveries"):
        sql(db_url, f"ALTER TABLE {table} SET (autovacuum_enabled = off)")
    sql(
        db_url,
        "INSERT INTO messages (source, message_id, type, timestamp, received_at, body,"
        " message_key) SELECT 'web', 'm' || g, 'track', 0, :now, '{}', g FROM"
        " generate_series(1, :n) AS g",
        now=time.time(),
        n=n,
    )
    sql(
        db_url,
        "INSERT INTO deliveries (message_pk, destination, status, attempts, created_at,"
        " next_attempt_at) SELECT id, 'd', 'pending', 0, 0, 0 FROM messages",
    )
    assert sql(db_url, "SELECT count(*) FROM pg_stats WHERE tablename = 'messages'") == [(0,)]


@pytest.mark.parametrize("generic", [False, True], ids=["custom", "generic"])
def test_postgresql_dedupe_lookup_probes_the_key_index_without_statistics(
    store: Store, db_url: str, generic: bool
) -> None:
    if store.backend.name == "sqlite":
        pytest.skip("SQLite looks keys up in the writer's in-memory index")
    _fill_unanalyzed(db_url, 5000)
    batch = [message(f"new-{i}") for i in range(100)]
    statement, params = _captured(
        store, "message_key", lambda: store.ingestion.insert_messages(batch, time.time())
    )
    nodes = _plan_nodes(db_url, statement, params, generic=generic)
    scans = {(n["Node Type"], n.get("Relation Name"), n.get("Index Name")) for n in nodes}
    assert not any(kind == "Seq Scan" and rel == "messages" for kind, rel, _ in scans), scans
    assert any(index == "ix_messages_message_key" for _, _, index in scans), scans


@pytest.mark.parametrize("analyzed", [False, True], ids=["unanalyzed", "analyzed"])
@pytest.mark.parametrize("generic", [False, True], ids=["custom", "generic"])
def test_postgresql_claim_probes_the_due_index_and_the_primary_key_never_scans(
    store: Store, db_url: str, generic: bool, analyzed: bool
) -> None:
    """As `IN (due ids)`, with statistics of a table this size, the planner hashed the ids
    against a scan of every delivery, at each claim."""
    if store.backend.name == "sqlite":
        pytest.skip("PostgreSQL's plans")
    _fill_unanalyzed(db_url, 20000)
    if analyzed:
        sql(db_url, "ANALYZE")
    statement, params = _captured(
        store,
        "UPDATE deliveries SET",
        lambda: store.queue.claim(ClaimRequest("d", 100, owner="t", now=1.0, lease_until=100.0)),
    )
    nodes = _plan_nodes(db_url, statement, params, generic=generic)
    scans = {(n["Node Type"], n.get("Relation Name"), n.get("Index Name")) for n in nodes}
    assert not any(kind == "Seq Scan" for kind, _, _ in scans), scans
    assert any(index == "ix_deliveries_due" for _, _, index in scans), scans
    assert any(index == "deliveries_pkey" for _, _, index in scans), scans


@pytest.mark.parametrize("generic", [False, True], ids=["custom", "generic"])
def test_postgresql_outcome_update_finds_its_row_by_primary_key(
    store: Store, db_url: str, generic: bool
) -> None:
    if store.backend.name == "sqlite":
        pytest.skip("PostgreSQL's plans")
    _fill_unanalyzed(db_url, 5000)
    [claimed] = store.queue.claim(ClaimRequest("d", 1, owner="t", now=1.0, lease_until=100.0))
    outcome = outcome_row(claimed.delivery_id, token=claimed.lease_token)
    statement, params = _captured(
        store, "UPDATE deliveries", lambda: store.queue.record([outcome], [])
    )
    nodes = _plan_nodes(db_url, statement, params, generic=generic)
    scans = {(n["Node Type"], n.get("Relation Name"), n.get("Index Name")) for n in nodes}
    assert not any(kind == "Seq Scan" for kind, _, _ in scans), scans
    assert any(index == "deliveries_pkey" for _, _, index in scans), scans


def test_postgresql_outcome_update_planned_on_a_small_table_still_probes_the_key_later(
    store: Store, db_url: str
) -> None:
    """psycopg prepares a statement at its fifth execution, and PostgreSQL may then cache one
    generic plan for it and keep it as the table grows. Made on a fresh database, the
    outcome UPDATE's plan hashed each batch against a scan of every delivery, for every
    batch, at any size (no statistics came to replace it with autovacuum off)."""
    if store.backend.name == "sqlite":
        pytest.skip("PostgreSQL's plans")
    _fill_unanalyzed(db_url, 12)
    claimed = store.queue.claim(ClaimRequest("d", 12, owner="t", now=1.0, lease_until=100.0))
    outcomes = [outcome_row(c.delivery_id, token=c.lease_token) for c in claimed]
    statement, params = _captured(
        store, "UPDATE deliveries", lambda: store.queue.record(outcomes[:1], [])
    )
    for outcome in outcomes[1:]:  # each its own transaction, as the recorder's batches are
        store.queue.record([outcome], [])
    sql(
        db_url,
        "INSERT INTO deliveries (message_pk, destination, status, attempts, created_at,"
        " next_attempt_at) SELECT 1, 'd', 'pending', 0, 0, 0 FROM generate_series(1, 20000)",
    )
    order = _parameter_order(statement)
    with store.database.bookkeeping() as conn:  # efd's writer connection, as it records
        pg = conn.connection.driver_connection
        assert pg is not None
        [(name,)] = pg.execute(
            "SELECT name FROM pg_prepared_statements WHERE statement LIKE 'UPDATE deliveries AS d%'"
        ).fetchall()
        args = ", ".join(psql.Literal(params[key]).as_string(pg) for key in order)
        [(plan,)] = pg.execute(f"EXPLAIN (FORMAT JSON) EXECUTE {name}({args})").fetchall()
    nodes = _nodes(plan)
    scans = {(n["Node Type"], n.get("Relation Name"), n.get("Index Name")) for n in nodes}
    assert not any(kind == "Seq Scan" for kind, _, _ in scans), scans
    assert any(index == "deliveries_pkey" for _, _, index in scans), scans


def test_a_large_batch_keeps_each_message_with_its_body_and_deliveries(
    store: Store, db_url: str
) -> None:
    rows = [
        dataclasses.replace(
            message(f"m{i}", destinations=tuple(f"d{j}" for j in range(i % 3))),
            body=json.dumps({"i": i, "text": 'quote " backslash \\ é 😀'}, ensure_ascii=i % 2 == 0),
        )
        for i in range(300)
    ]
    assert store.ingestion.insert_messages(rows, time.time()) == ["stored"] * 300
    stored = sql(db_url, "SELECT message_id, body FROM messages")
    assert sorted(stored) == sorted((r.message_id, r.body) for r in rows)
    pairs = sql(
        db_url,
        "SELECT m.message_id, d.destination FROM deliveries d JOIN messages m"
        " ON m.id = d.message_pk",
    )
    expected = [(r.message_id, d) for r in rows for d in r.destinations]
    assert sorted(pairs) == sorted(expected)


def test_claims_and_duplicate_checks_of_any_size_find_each_row_once(store: Store) -> None:
    """Sizes around the IN lists' lengths (padded to powers of two on SQLite, chunked at
    512): every claimed delivery carries its own message's body, and a batch's duplicates
    are found whatever its size."""
    now = time.time()
    sizes = [1, 2, 3, 5, 127, 128, 129, 511, 512, 513, 700]
    rows = [
        dataclasses.replace(message(f"m{i}"), body=json.dumps({"i": i})) for i in range(sum(sizes))
    ]
    assert store.ingestion.insert_messages(rows, now) == ["stored"] * len(rows)
    bodies = {r.message_id: r.body for r in rows}
    seen: list[str] = []
    for size in sizes:
        claimed = store.queue.claim(
            ClaimRequest("d", size, owner="A", now=now, lease_until=now + 60)
        )
        assert len(claimed) == size
        assert all(c.body == bodies[c.message_id] for c in claimed)
        seen += [c.message_id for c in claimed]
    assert sorted(seen) == sorted(bodies)
    for size in (3, 129, 513):
        again = [message(f"m{i}") for i in range(size)] + [message(f"new{size}")]
        assert store.ingestion.insert_messages(again, now) == ["duplicate"] * size + ["stored"]


def test_a_redrive_moves_every_matching_delivery_in_chunks_each_its_own_transaction(
    store: Store, db_url: str
) -> None:
    now = time.time()
    store.ingestion.insert_messages(
        [message(f"m{i}", destinations=("d", "e")) for i in range(20)], now
    )
    ids = {
        name: [
            row[0]
            for row in sql(
                db_url, f"SELECT id FROM deliveries WHERE destination = '{name}' ORDER BY id"
            )
        ]
        for name in ("d", "e")
    }

    def set_status(status: str, chosen: list[int]) -> None:
        listed = ",".join(map(str, chosen))
        sql(
            db_url,
            f"UPDATE deliveries SET status = '{status}', finished_at = :t WHERE id IN ({listed})",
            t=now,
        )

    # Of d's deliveries, all failed but three delivered; of e's, every other one expired and
    # the rest left pending; m0's payload purged, so its expired delivery stays as it is.
    set_status("failed", ids["d"][3:])
    set_status("delivered", ids["d"][:3])
    set_status("expired", ids["e"][::2])
    sql(db_url, "UPDATE messages SET body = NULL WHERE message_id = 'm0'")
    expected = set(ids["d"][3:] + ids["e"][::2]) - {ids["d"][0], ids["e"][0]}
    assert len(expected) == 26

    def others() -> list[Any]:
        listed = ",".join(map(str, expected))
        return sql(db_url, f"SELECT * FROM deliveries WHERE id NOT IN ({listed}) ORDER BY id")

    untouched = others()
    operations = OperationsStore(store)
    query = DeliveryQuery(destinations=("d", "e"), statuses=REDRIVABLE)
    assert operations.count_redrivable(query) == len(expected)  # the dry run

    commits: list[int] = []
    event.listen(store.database.writer, "commit", lambda _conn: commits.append(1))
    assert operations.redrive(query, now + 1, chunk=4) == len(expected)
    assert len(commits) == math.ceil(len(expected) / 4)
    pending = sql(
        db_url, "SELECT id, attempts, first_attempt_at FROM deliveries WHERE status = 'pending'"
    )
    assert {row[0] for row in pending} - set(ids["e"][1::2]) == expected
    assert {(row[1], row[2]) for row in pending if row[0] in expected} == {(0, now + 1)}
    assert others() == untouched
    assert operations.count_redrivable(query) == 0
    assert operations.redrive(query, now + 2, chunk=4) == 0


def test_postgresql_bookkeeping_commits_without_waiting_for_the_wal_and_writes_do(
    store: Store,
) -> None:
    if store.backend.name == "sqlite":
        pytest.skip("PostgreSQL's commit setting")
    with store.database.bookkeeping() as conn:
        assert conn.execute(text("SHOW synchronous_commit")).scalar() == "off"
    with store.database.write() as conn:  # messages: acknowledged only once on disk
        assert conn.execute(text("SHOW synchronous_commit")).scalar() == "on"


def test_suppressed_ids_are_found_whatever_characters_they_hold(store: Store, db_url: str) -> None:
    odd = ['a"b', "c\\d", "{e,f}", "ünï 😀", "NULL", "g'h", " "]
    plain = [f"u{i}" for i in range(300)]
    with store.database.write() as conn:
        conn.execute(
            suppressions.insert(),
            [
                {"subject_id": s, "user_id": s, "regulation_id": "r", "created_at": 1.0}
                for s in [*odd, *plain[::2]]
            ],
        )
    asked = {*odd, *plain, "NUL", "a", "b"}
    with store.database.read() as conn:
        found = Suppressions(store).suppressed(conn, asked)
    assert found == {*odd, *plain[::2]}


def test_sqlite_inserts_take_rows_in_the_table_order_and_refuse_any_other(tmp_path: Path) -> None:
    """The hot inserts hand their tuples to SQLite as they are: columns named out of the
    table's order are a mistake to refuse, not rows to shuffle one by one."""
    messages = metadata.tables["messages"]
    with pytest.raises(ValueError, match="not in the table's order"):
        sqlite_backend.insert_many(None, messages, ("message_id", "source"), [("m", "web")])
    engine = create_engine(f"sqlite:///{tmp_path / 'order.db'}")
    metadata.create_all(engine)
    row = (1, "web", "m-1", "track", "u", None, "E", 1.0, None, 2.0, "{}", None, 7)
    with engine.begin() as conn:
        driver = conn.connection.driver_connection
        assert driver is not None
        cursor = driver.cursor()
        sqlite_backend.insert_many(cursor, messages, ("id", *MESSAGE_COLUMNS), [row])
        stored = conn.execute(text("SELECT * FROM messages")).one()
    assert tuple(stored) == row
