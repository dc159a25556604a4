"""Retention's pacing on real SQLite files and real PostgreSQL databases: it yields the one
writer to the other writes of its process, keeps a floor share of it, and takes all of an
idle writer."""

from __future__ import annotations

import asyncio
import itertools
import time
from collections.abc import AsyncIterator
from typing import Any

import pytest

from efd import config
from efd.observe.metrics import Metrics
from efd.records import InsertStatus
from efd.services.pacing import CONTENDED_STEP, LARGE_STEP
from efd.services.periodic import Periodic
from efd.settings import Current
from efd.store import Store, migrate
from efd.store.computations import ComputationsStore
from efd.store.profiles import ProfilesStore
from efd.store.runner import AsyncStore
from efd.store.suppressions import Suppressions
from tests.conftest import settings_dict, sql
from tests.support.rows import new_message

DAY = 86400.0
HISTORY = 12_000  # finished messages older than the horizon: a few full steps


@pytest.fixture
async def db(db_url: str) -> AsyncIterator[AsyncStore]:
    migrate.upgrade(db_url)
    store = Store(db_url)
    old = time.time() - 2 * DAY
    for start in range(0, HISTORY, 2000):
        rows = [new_message(f"old-{i}", received_at=old + i) for i in range(start, start + 2000)]
        store.ingestion.insert_messages(rows, old)
    sql(
        db_url,
        "UPDATE deliveries SET status = 'delivered', finished_at = :at, next_attempt_at = NULL",
        at=old,
    )
    async_store = AsyncStore(store)
    yield async_store
    async_store.close()


def periodic(db: AsyncStore, db_url: str) -> Periodic:
    raw = settings_dict(db_url)
    raw["storage"].update(retention_days=1 / DAY)
    return Periodic(
        settings=Current(config.Settings(**raw)),
        db=db,
        computations_store=ComputationsStore(db.store, Suppressions(db.store)),
        profiles=ProfilesStore(db.store),
        metrics=Metrics(),
        owner="test",
        on_sent=lambda: None,
    )


def remaining(db_url: str) -> int:
    return int(sql(db_url, "SELECT count(*) FROM messages WHERE message_id LIKE 'old-%'")[0][0])


def counting(runner: Periodic, sizes: list[int] | None = None) -> list[bool]:
    """Each of retention's turns in the writer from now on: True where it stepped, False
    where it left the writer to others; and in `sizes` the limit of each step of the walk
    it took."""
    turns: list[bool] = []
    decide = runner._yielding

    def counted(*args: Any) -> Any:
        done = decide(*args)
        turns.append(done is not None)
        if done is not None and sizes is not None and args[0] == runner._db.store.retention.advance:
            sizes.append(args[-1])
        return done

    runner._yielding = counted  # type: ignore[method-assign,assignment]  # a counting wrapper
    return turns


async def test_retention_leaves_a_busy_writer_to_ingestion_but_for_its_floor(
    db: AsyncStore, db_url: str
) -> None:
    ids = itertools.count()
    ingested: list[int] = []  # the batches written

    def ingest() -> list[InsertStatus]:
        now = time.time()
        rows = [new_message(f"new-{next(ids)}", received_at=now) for _ in range(100)]
        return db.store.ingestion.insert_messages(rows, now)

    stopping = False

    async def client() -> None:
        while not stopping:
            await db.write(ingest)
            ingested.append(1)

    # Two clients: while one's batch is written the other's waits for the writer.
    clients = [asyncio.create_task(client()) for _ in range(2)]
    runner = periodic(db, db_url)
    sizes: list[int] = []
    turns = counting(runner, sizes)
    await asyncio.wait_for(runner.retention(), timeout=120)
    stopping = True
    await asyncio.gather(*clients)
    assert remaining(db_url) == 0  # the floor: retention finished however busy the writer was
    assert False in turns  # it left the writer to the queued batches at least once
    assert len(ingested) > turns.count(True)  # and ingestion went on between its steps
    # A step forced past the queued batches is followed by a short one, never a large one.
    assert CONTENDED_STEP in sizes
    assert LARGE_STEP not in sizes


async def test_retention_takes_an_idle_writer_with_steps_back_to_back(
    db: AsyncStore, db_url: str
) -> None:
    runner = periodic(db, db_url)
    sizes: list[int] = []
    turns = counting(runner, sizes)
    await runner.retention()
    assert remaining(db_url) == 0
    assert turns.count(True) >= 3
    assert False not in turns  # no other write waited: no step was put off
    assert LARGE_STEP in sizes  # full steps grew: the walk was behind
    assert CONTENDED_STEP not in sizes
