"""An ordered destination's lanes under a pause, on real SQLite files and real PostgreSQL
databases: the messages waiting behind a lane's head do not expire while their destination
is paused, however long, and resuming moves their window on by the paused time."""

from __future__ import annotations

import time
from collections.abc import AsyncIterator

import pytest

from efd import config
from efd.delivery.lanes import Lanes
from efd.observe.metrics import Metrics
from efd.services.periodic import Periodic
from efd.settings import Current
from efd.store import Steps, Store, migrate
from efd.store.computations import ComputationsStore
from efd.store.profiles import ProfilesStore
from efd.store.runner import AsyncStore
from efd.store.suppressions import Suppressions
from tests.conftest import settings_dict, sql
from tests.support.rows import new_message

WINDOW = 100.0
DEST = "hooks"  # settings_dict's one destination


@pytest.fixture
async def db(db_url: str) -> AsyncIterator[AsyncStore]:
    migrate.upgrade(db_url)
    store = Store(db_url, steps=lambda: Steps(lanes=Lanes([DEST])))
    async_store = AsyncStore(store)
    yield async_store
    async_store.close()


def periodic(db: AsyncStore, db_url: str) -> Periodic:
    raw = settings_dict(db_url)
    [destination] = raw["destinations"]
    assert destination["name"] == DEST
    destination["ordering"] = "per_user"
    raw["delivery"] = {"retry_window_seconds": WINDOW}
    return Periodic(
        settings=Current(config.Settings(**raw)),
        db=db,
        computations_store=ComputationsStore(db.store, Suppressions(db.store)),
        profiles=ProfilesStore(db.store),
        metrics=Metrics(),
        owner="test",
        on_sent=lambda: None,
    )


def statuses(db_url: str) -> list[str]:
    rows = sql(db_url, "SELECT status FROM deliveries WHERE destination = :d ORDER BY id", d=DEST)
    return [status for (status,) in rows]


async def test_lanes_of_a_paused_destination_wait_out_the_pause(
    db: AsyncStore, db_url: str
) -> None:
    t0 = time.time()
    store = db.store
    rows = [new_message(f"m{i}", destinations=(DEST,), received_at=t0 + i) for i in range(3)]
    store.ingestion.insert_messages(rows, t0)
    assert statuses(db_url) == ["pending", "queued", "queued"]
    runner = periodic(db, db_url)
    store.pauses.pause(DEST, None, "maintenance", t0 + 10)

    # Long past the window, while paused: nothing expires.
    sql(db_url, "DELETE FROM jobs WHERE name = 'lanes'")
    expired, _ = await runner.tend_lanes(now=t0 + 10 * WINDOW)
    assert expired.get(DEST, 0) == 0
    assert statuses(db_url) == ["pending", "queued", "queued"]

    # Resumed: the waiting messages' window moved on by the paused time.
    store.pauses.resume(DEST, None, [DEST], t0 + 10 * WINDOW)
    sql(db_url, "DELETE FROM jobs WHERE name = 'lanes'")
    expired, _ = await runner.tend_lanes(now=t0 + 10 * WINDOW + 1)
    assert expired.get(DEST, 0) == 0
    assert statuses(db_url) == ["pending", "queued", "queued"]

    # And once that window, too, has gone by without a pause, they expire as before.
    sql(db_url, "DELETE FROM jobs WHERE name = 'lanes'")
    expired, _ = await runner.tend_lanes(now=t0 + 12 * WINDOW)
    assert expired[DEST] == 2
    assert statuses(db_url) == ["pending", "expired", "expired"]
