"""Retention on real SQLite files and real PostgreSQL databases: what it purges and keeps, its
cursor, its lag, the migration to it, and a real daemon running it on its own."""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Iterator

import pytest
from alembic import command

from efd.store import Store, migrate
from efd.store.dedupe import message_key
from efd.store.engine import make_engine
from efd.store.operations import OperationsStore
from tests.conftest import (
    DaemonFactory,
    ReceiverFactory,
    eventually,
    metric,
    metrics_text,
    post,
    settings_dict,
    sql,
)
from tests.integration.test_regulations import api
from tests.support.rows import new_message

DAY = 86400.0
TOKEN = "retention-secret-0123456789"


@pytest.fixture
def store(db_url: str) -> Iterator[Store]:
    migrate.upgrade(db_url)
    s = Store(db_url)
    yield s
    s.dispose()


def insert(
    store: Store, mid: str, received_at: float, destinations: tuple[str, ...] = ("d",)
) -> None:
    store.ingestion.insert_messages(
        [new_message(mid, destinations=destinations, received_at=received_at)], received_at
    )


def finish(db_url: str, mid: str, at: float, destination: str | None = None) -> None:
    sql(
        db_url,
        "UPDATE deliveries SET status = 'delivered', finished_at = :at, next_attempt_at = NULL"
        " WHERE message_pk = (SELECT id FROM messages WHERE message_id = :mid)"
        + ("" if destination is None else " AND destination = :d"),
        at=at,
        mid=mid,
        d=destination,
    )


def stored(db_url: str) -> list[str]:
    return [row[0] for row in sql(db_url, "SELECT message_id FROM messages ORDER BY id")]


def kept(db_url: str) -> list[str]:
    return [
        row[0]
        for row in sql(
            db_url,
            "SELECT m.message_id FROM retention_kept k JOIN messages m ON m.id = k.message_pk"
            " ORDER BY m.id",
        )
    ]


def orphans(db_url: str) -> list[tuple[int, int]]:
    return sql(
        db_url,
        "SELECT (SELECT count(*) FROM deliveries WHERE message_pk NOT IN"
        " (SELECT id FROM messages)), (SELECT count(*) FROM attempts WHERE delivery_id NOT IN"
        " (SELECT id FROM deliveries))",
    )


def test_pending_queued_and_replayed_deliveries_survive_until_they_finish(
    store: Store, db_url: str
) -> None:
    now = time.time()
    long_ago = now - 30 * DAY
    for mid in ("done", "pending", "queued", "replayed"):
        insert(store, mid, long_ago)
    finish(db_url, "done", long_ago + 1)
    finish(db_url, "replayed", long_ago + 1)
    sql(
        db_url,
        "UPDATE deliveries SET status = 'queued', next_attempt_at = NULL WHERE message_pk ="
        " (SELECT id FROM messages WHERE message_id = 'queued')",
    )
    operations = OperationsStore(store)
    found = operations.replay_sources("web", "replayed")
    assert found is not None
    pk, _, originals = found
    assert operations.replay(pk, [(originals["d"], "d")], now)
    before = now - 7 * DAY

    assert store.retention.purge(before, 1000) == 1
    assert stored(db_url) == ["pending", "queued", "replayed"]
    assert kept(db_url) == ["pending", "queued", "replayed"]
    assert sql(db_url, "SELECT count(*), count(replay_of) FROM deliveries") == [(4, 1)]
    # A second run finds them still unfinished and purges nothing.
    assert store.retention.purge(before, 1000) == 0
    assert stored(db_url) == ["pending", "queued", "replayed"]

    # They finish; the next run purges them, with their deliveries and attempts.
    sql(db_url, "UPDATE deliveries SET status = 'delivered', finished_at = :at", at=long_ago + 2)
    assert store.retention.purge(before, 1000) == 3
    assert stored(db_url) == []
    assert kept(db_url) == []
    assert sql(db_url, "SELECT count(*) FROM deliveries") == [(0,)]
    assert orphans(db_url) == [(0, 0)]


def test_a_message_is_purged_only_once_every_delivery_finished_before_the_horizon(
    store: Store, db_url: str
) -> None:
    now = time.time()
    long_ago = now - 30 * DAY
    insert(store, "two", long_ago, destinations=("d", "e"))
    finish(db_url, "two", long_ago + 1, destination="d")
    finish(db_url, "two", now - DAY, destination="e")  # after the horizon
    insert(store, "none", long_ago, destinations=())  # routed nowhere: purged at once
    assert store.retention.purge(now - 7 * DAY, 1000) == 1
    assert stored(db_url) == ["two"]
    assert sql(db_url, "SELECT count(*) FROM deliveries") == [(2,)]
    # The horizon passes its last delivery's end.
    assert store.retention.purge(now, 1000) == 1
    assert stored(db_url) == []
    assert orphans(db_url) == [(0, 0)]


def test_the_walk_stops_at_a_message_received_after_the_horizon_and_skips_none(
    store: Store, db_url: str
) -> None:
    now = time.time()
    long_ago = now - 30 * DAY
    insert(store, "old-1", long_ago)
    insert(store, "young", now - 60)  # a later id, but received after the others
    insert(store, "old-2", long_ago)
    for mid in ("old-1", "old-2"):
        finish(db_url, mid, long_ago + 1)
    finish(db_url, "young", now - 59)
    assert store.retention.purge(now - 120, 1) == 1
    assert stored(db_url) == ["young", "old-2"]
    assert kept(db_url) == []
    # Once the horizon passes it, the walk goes on past it.
    assert store.retention.purge(now, 1) == 2
    assert stored(db_url) == []


def test_daemons_taking_turns_in_small_steps_purge_everything_and_keep_the_pending(
    store: Store, db_url: str
) -> None:
    now = time.time()
    long_ago = now - 30 * DAY
    names = [f"m{i:02d}" for i in range(24)]
    store.ingestion.insert_messages(
        [new_message(name, received_at=long_ago) for name in names], long_ago
    )
    pending = names[::5]
    for name in names:
        if name not in pending:
            finish(db_url, name, long_ago + 1)
    other = Store(db_url)
    try:
        before = now - 7 * DAY
        # Two processes, one step each in turn, and then both at once.
        for _ in range(3):
            store.retention.advance(before, 2)
            other.retention.advance(before, 3)
        threads = [
            threading.Thread(target=s.retention.purge, args=(before, 2)) for s in (store, other)
        ]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        assert stored(db_url) == pending
        assert kept(db_url) == pending
        assert sql(db_url, "SELECT count(*) FROM deliveries WHERE status = 'pending'") == [
            (len(pending),)
        ]
        sql(db_url, "UPDATE deliveries SET status = 'delivered', finished_at = :at", at=long_ago)
        assert other.retention.purge(before, 2) == len(pending)
        assert stored(db_url) == []
        assert kept(db_url) == []
        assert orphans(db_url) == [(0, 0)]
    finally:
        other.dispose()


def test_a_step_starts_at_the_cursor(store: Store, db_url: str) -> None:
    now = time.time()
    long_ago = now - 30 * DAY
    store.ingestion.insert_messages(
        [new_message(f"m{i}", received_at=long_ago) for i in range(5)], long_ago
    )
    finish(db_url, "m0", long_ago)
    step = store.retention.advance(now - 7 * DAY, 2)
    assert (step.purged, step.looked_at) == (1, 2)
    [(cursor,)] = sql(db_url, "SELECT cursor_pk FROM jobs WHERE name = 'retention'")
    assert cursor == step.last
    # The next step looks only past it, not at the kept message again.
    step = store.retention.advance(now - 7 * DAY, 2)
    assert (step.purged, step.looked_at) == (0, 2)
    assert step.last == cursor + 2
    assert kept(db_url) == ["m1", "m2", "m3"]


def test_the_lag_is_the_oldest_message_the_walk_has_not_reached(store: Store, db_url: str) -> None:
    now = time.time()
    before = now - 7 * DAY
    assert store.retention.lag(before).behind_seconds == 0
    insert(store, "old", now - 30 * DAY)
    insert(store, "pending", now - 29 * DAY)
    insert(store, "new", now)
    finish(db_url, "old", now - 30 * DAY)
    lag = store.retention.lag(before)
    assert lag.oldest_at == pytest.approx(now - 30 * DAY)
    assert lag.behind_seconds == pytest.approx(23 * DAY)
    assert lag.kept == 0
    store.retention.purge(before, 1000)
    lag = store.retention.lag(before)
    assert (lag.oldest_at, lag.behind_seconds, lag.kept) == (None, 0.0, 1)


def test_a_replay_of_a_message_retention_purged_creates_nothing(store: Store, db_url: str) -> None:
    now = time.time()
    insert(store, "gone", now - 30 * DAY)
    finish(db_url, "gone", now - 30 * DAY)
    operations = OperationsStore(store)
    found = operations.replay_sources("web", "gone")
    assert found is not None
    pk, _, originals = found
    assert store.retention.purge(now - 7 * DAY, 1000) == 1
    assert operations.replay(pk, [(originals["d"], "d")], now) is None
    assert sql(db_url, "SELECT count(*) FROM deliveries") == [(0,)]


def _upgrade_to(url: str, revision: str) -> None:
    engine = make_engine(url, writer=True)
    config = migrate._config()
    try:
        with engine.connect() as conn:
            config.attributes["connection"] = conn
            command.upgrade(config, revision)
            conn.commit()
    finally:
        engine.dispose()


def test_the_migration_keeps_every_row_and_retention_carries_on(db_url: str) -> None:
    _upgrade_to(db_url, "0011")
    now = time.time()
    # The rows as ingestion wrote them then: today's writes columns that came later.
    for pk, mid in enumerate(("done", "pending"), start=1):
        sql(
            db_url,
            "INSERT INTO messages (id, source, message_id, type, user_id, timestamp,"
            " received_at, body, message_key) VALUES (:pk, 'web', :mid, 'track', 'u', :at, :at,"
            " '{}', :key)",
            pk=pk,
            mid=mid,
            at=now - 30 * DAY,
            key=message_key("web", mid),
        )
        sql(
            db_url,
            "INSERT INTO deliveries (message_pk, destination, status, attempts, created_at,"
            " next_attempt_at, lease_token) VALUES (:pk, 'd', 'pending', 0, :at, :at, 0)",
            pk=pk,
            at=now - 30 * DAY,
        )
    old = Store(db_url)
    try:
        old.jobs.claim_job("retention", interval=600, owner="A", now=now - 3600)
    finally:
        old.dispose()
    sql(db_url, "UPDATE deliveries SET status = 'failed', finished_at = :at WHERE id = 1", at=now)
    sql(
        db_url,
        "INSERT INTO attempts (delivery_id, hook_url, attempted_at, duration_ms, outcome)"
        " VALUES (1, 'https://h.example/', :at, 1.5, 'fail')",
        at=now - 30 * DAY,
    )
    tables = ("messages", "deliveries", "attempts", "jobs")
    counts = {t: sql(db_url, f"SELECT count(*) FROM {t}") for t in tables}
    migrate.upgrade(db_url)
    assert {t: sql(db_url, f"SELECT count(*) FROM {t}") for t in tables} == counts
    assert sql(db_url, "SELECT name, owner, cursor_pk FROM jobs") == [("retention", "A", None)]
    sql(db_url, "UPDATE deliveries SET finished_at = :at WHERE id = 1", at=now - 29 * DAY)
    new = Store(db_url)
    try:
        assert new.retention.purge(now - 7 * DAY, 1000) == 1
    finally:
        new.dispose()
    assert stored(db_url) == ["pending"]
    assert orphans(db_url) == [(0, 0)]


async def test_a_daemon_runs_retention_soon_after_start_and_every_interval(
    db_url: str,
    receiver_factory: ReceiverFactory,
    daemon_factory: DaemonFactory,
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.INFO, logger="efd.services.periodic")
    receiver = await receiver_factory()
    settings = settings_dict(db_url, [receiver.url])
    # Finished messages are purged a second after their delivery, checked five times a second.
    settings["storage"].update(retention_days=1 / DAY, retention_interval_seconds=0.2)
    settings["server"]["admin_token"] = TOKEN
    daemon = await daemon_factory(settings)
    track = {"type": "track", "userId": "u", "event": "E"}
    assert (await post(daemon.port, "/v1/track", {**track, "messageId": "a"}))[0] == 200
    await eventually(lambda: receiver.received, timeout=30)
    await eventually(lambda: stored(db_url) == [], timeout=30)
    assert sql(db_url, "SELECT count(*) FROM deliveries") == [(0,)]
    # A second message, long after the first run: the next runs purge it too.
    assert (await post(daemon.port, "/v1/track", {**track, "messageId": "b"}))[0] == 200
    await eventually(lambda: stored(db_url) == [], timeout=30)
    assert any(
        record.getMessage().startswith("retention: purged 1 messages") for record in caplog.records
    )
    status, answer = await api(daemon.port, "GET", "/admin/destinations", token=TOKEN)
    assert status == 200
    assert answer["retention"]["behindSeconds"] == 0
    assert answer["retention"]["oldestUnpurgedAt"] is None
    assert answer["retention"]["kept"] == 0
    text = await metrics_text(daemon.port, TOKEN)
    assert metric(text, "efd_retention_purged_total") == 2
    assert metric(text, "efd_retention_behind_seconds") == 0


async def test_the_admin_api_and_metrics_tell_how_far_behind_retention_is(
    db_url: str, daemon_factory: DaemonFactory
) -> None:
    settings = settings_dict(db_url)
    settings["server"]["admin_token"] = TOKEN
    daemon = await daemon_factory(settings)
    now = time.time()
    store = Store(db_url)
    try:
        insert(store, "old", now - 10 * DAY)
        insert(store, "pending", now - 9 * DAY)
        sql(
            db_url,
            "UPDATE deliveries SET status = 'delivered', finished_at = :at",
            at=now - 8 * DAY,
        )
        sql(
            db_url,
            "UPDATE deliveries SET status = 'pending', finished_at = NULL WHERE message_pk ="
            " (SELECT id FROM messages WHERE message_id = 'pending')",
        )
    finally:
        store.dispose()
    status, answer = await api(daemon.port, "GET", "/admin/destinations", token=TOKEN)
    assert status == 200
    lag = answer["retention"]
    assert lag["behindSeconds"] == pytest.approx(3 * DAY, abs=60)
    assert lag["oldestUnpurgedAt"].startswith(
        time.strftime("%Y-%m-%d", time.gmtime(now - 10 * DAY))
    )
    text = await metrics_text(daemon.port, TOKEN)
    assert metric(text, "efd_retention_behind_seconds") == pytest.approx(3 * DAY, abs=60)
    sql(db_url, "DELETE FROM jobs")  # the retention job's turn, now
    await daemon.retention()
    status, answer = await api(daemon.port, "GET", "/admin/destinations", token=TOKEN)
    assert answer["retention"] == {**answer["retention"], "behindSeconds": 0, "kept": 1}
    text = await metrics_text(daemon.port, TOKEN)
    assert metric(text, "efd_retention_kept_messages") == 1
    assert stored(db_url) == ["pending"]


def test_messages_stored_after_the_newest_was_purged_are_purged_in_turn(
    store: Store, db_url: str
) -> None:
    # SQLite gives the ids of purged newest rows again: the cursor must not pass them by.
    now = time.time()
    for round_ in range(3):
        insert(store, f"m{round_}", now - 30 * DAY)
        finish(db_url, f"m{round_}", now - 30 * DAY)
        assert store.retention.purge(now - 7 * DAY, 1000) == 1
        assert stored(db_url) == []
