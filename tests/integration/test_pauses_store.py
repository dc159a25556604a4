"""The pauses table on real SQLite and PostgreSQL: one row per target, a pause that keeps its
start, a resume that moves the open deliveries' windows by the paused time, and the runs of
failures disable_after_hours follows."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from efd.errors import StoreError
from efd.store import Store, migrate
from efd.store.pauses import PausesStore
from efd.store.schema import pauses as table
from tests.conftest import sql
from tests.support.rows import new_message


@pytest.fixture
def store(db_url: str) -> Iterator[Store]:
    migrate.upgrade(db_url)
    s = Store(db_url)
    yield s
    s.dispose()


def _delivery(
    db_url: str,
    destination: str,
    status: str,
    *,
    created: float,
    first: float | None,
    due: float | None,
    owner: str | None = None,
) -> int:
    rows = sql(db_url, "SELECT max(id) FROM messages")
    sql(
        db_url,
        "INSERT INTO deliveries (message_pk, destination, status, created_at, first_attempt_at,"
        " next_attempt_at, lease_owner) VALUES (:pk, :d, :s, :c, :f, :n, :o)",
        pk=rows[0][0],
        d=destination,
        s=status,
        c=created,
        f=first,
        n=due,
        o=owner,
    )
    return int(sql(db_url, "SELECT max(id) FROM deliveries")[0][0])


def test_one_row_per_target_and_a_pause_again_keeps_its_start(store: Store) -> None:
    pauses: PausesStore = store.pauses
    assert pauses.pause("crm", None, "upgrade", 10.0) == ("crm", None, "paused", "upgrade", 10.0)
    assert pauses.pause("crm", None, "longer", 20.0) == ("crm", None, "paused", "longer", 10.0)
    assert pauses.pause("crm", 2, None, 30.0) == ("crm", 2, "paused", None, 30.0)
    assert pauses.all() == [
        ("crm", None, "paused", "longer", 10.0),
        ("crm", 2, "paused", None, 30.0),
    ]
    # The unique indexes, not only the store's own check, hold one row per target.
    for hook in (None, 2):
        with pytest.raises(StoreError), store.database.write() as conn:
            conn.execute(
                table.insert().values(destination="crm", hook=hook, kind="paused", since=1.0)
            )


def test_a_resume_moves_the_windows_by_the_paused_time_and_makes_them_due(
    store: Store, db_url: str
) -> None:
    store.ingestion.insert_messages([new_message("m-1", destinations=())], 1.0)
    sent_before = _delivery(db_url, "crm", "pending", created=90.0, first=100.0, due=900.0)
    sent_during = _delivery(db_url, "crm", "pending", created=160.0, first=170.0, due=180.0)
    never_sent = _delivery(db_url, "crm", "pending", created=160.0, first=None, due=160.0)
    in_flight = _delivery(
        db_url, "crm", "pending", created=90.0, first=100.0, due=260.0, owner="other"
    )
    waiting = _delivery(db_url, "crm", "queued", created=120.0, first=None, due=None)
    other = _delivery(db_url, "erp", "pending", created=90.0, first=100.0, due=900.0)
    done = _delivery(db_url, "crm", "delivered", created=90.0, first=100.0, due=None)
    store.pauses.pause("crm", None, None, 150.0)

    lifted, due = store.pauses.resume("crm", None, ["crm"], 200.0)
    assert lifted == ("crm", None, "paused", None, 150.0)
    assert due == 3  # pending and not in flight
    rows = {
        r[0]: (r[1], r[2])
        for r in sql(db_url, "SELECT id, first_attempt_at, next_attempt_at FROM deliveries")
    }
    assert rows[sent_before] == (150.0, 200.0)  # 50 s of its window were paused
    assert rows[sent_during] == (200.0, 180.0)  # first sent while paused: from the resume
    assert rows[never_sent] == (None, 160.0)  # its window starts at its first attempt
    assert rows[in_flight] == (150.0, 260.0)  # its lease is left alone
    assert rows[waiting] == (170.0, None)  # a lane's window counts from receipt
    assert rows[other] == (100.0, 900.0)
    assert rows[done] == (100.0, None)
    assert store.pauses.all() == []
    assert store.pauses.resume("crm", None, ["crm"], 300.0) == (None, 0)


def test_a_run_of_failures_is_noted_once_ended_by_a_success_and_disabled_when_old(
    store: Store,
) -> None:
    pauses = store.pauses
    assert pauses.failing("crm", 1, 100.0) == ("crm", 1, "failing", None, 100.0)
    assert pauses.failing("crm", 1, 150.0)[4] == 100.0  # the earlier start stands
    assert pauses.all() == []  # not a pause
    assert pauses.all(failing=True) == [("crm", 1, "failing", None, 100.0)]
    assert not pauses.disable("crm", 1, "r", started_before=99.0, now=500.0)  # too young
    assert pauses.answered("crm", 1)
    assert not pauses.answered("crm", 1)
    assert not pauses.disable("crm", 1, "r", started_before=1000.0, now=1000.0)  # ended

    pauses.failing("crm", 1, 200.0)
    assert pauses.disable("crm", 1, "failing since …", started_before=300.0, now=400.0)
    assert pauses.all() == [("crm", 1, "disabled", "failing since …", 400.0)]
    assert not pauses.answered("crm", 1)  # a success does not lift a disable
    assert pauses.failing("crm", 1, 500.0)[2] == "disabled"
    assert pauses.resume("crm", 1, ["crm"], 450.0)[0] == (
        "crm",
        1,
        "disabled",
        "failing since …",
        400.0,
    )
    # A paused hook's run is replaced by the pause; a resume of a run lifts nothing.
    pauses.failing("crm", 2, 10.0)
    assert pauses.resume("crm", 2, ["crm"], 20.0) == (None, 0)
    assert pauses.pause("crm", 2, None, 30.0) == ("crm", 2, "paused", None, 30.0)
