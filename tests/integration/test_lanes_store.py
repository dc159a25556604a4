"""Ordered delivery's lanes in the store, on real SQLite files and real PostgreSQL databases:
only a lane's head is ever claimable, heads hand on in the order efd acknowledged the
messages, a failing head holds only its own lane, and redrive, expiry, discard and turning
ordering off keep every lane moving. Several writers on PostgreSQL take turns per lane."""

from __future__ import annotations

import threading
import time
from collections import defaultdict
from collections.abc import Iterator, Sequence

import pytest

from efd.delivery.lanes import Lanes
from efd.records import (
    AttemptRow,
    Claimed,
    ClaimRequest,
    DeliveryQuery,
    DeliveryStatus,
    NewMessage,
    Outcome,
)
from efd.store import Steps, Store, migrate
from efd.store.operations import OperationsStore
from tests.conftest import sql
from tests.support.rows import new_message

ORDERED, PLAIN = "crm", "log"


@pytest.fixture
def store(db_url: str, ordering: Ordering) -> Iterator[Store]:
    migrate.upgrade(db_url)
    s = Store(db_url, steps=ordering)
    yield s
    s.dispose()


class Ordering:
    """The steps the daemon gives its store while ORDERED has ordering = "per_user" (`on`)
    or not; a test switches it as a reload would."""

    def __init__(self) -> None:
        self.on = True

    def __call__(self) -> Steps:
        return Steps(lanes=Lanes([ORDERED])) if self.on else Steps()


@pytest.fixture
def ordering() -> Ordering:
    return Ordering()


def message(
    mid: str,
    user: str | None,
    *,
    anonymous: str | None = None,
    destinations: tuple[str, ...] = (ORDERED,),
    received_at: float | None = None,
) -> NewMessage:
    return new_message(
        mid, destinations=destinations, user=user, anonymous=anonymous, received_at=received_at
    )


def claim(store: Store, destination: str = ORDERED, now: float | None = None) -> list[Claimed]:
    now = time.time() if now is None else now
    return store.queue.claim(
        ClaimRequest(destination, 1000, owner="t", now=now, lease_until=now + 60)
    )


def outcome(c: Claimed, status: DeliveryStatus, *, retry_at: float | None = None) -> Outcome:
    now = time.time()
    return Outcome(
        delivery_id=c.delivery_id,
        lease_token=c.lease_token,
        status=status,
        attempts=c.attempts + 1,
        first_attempt_at=c.first_attempt_at or now,
        next_attempt_at=retry_at if status is DeliveryStatus.PENDING else None,
        finished_at=None if status is DeliveryStatus.PENDING else now,
        failed_hooks=frozenset(),
        last_error=None if status is DeliveryStatus.DELIVERED else "HTTP 503",
    )


def attempt(c: Claimed, result: str) -> AttemptRow:
    return AttemptRow(c.delivery_id, "h", time.time(), 1.0, result, None, None, None, None)


def deliver(store: Store, claimed: Sequence[Claimed]) -> None:
    store.queue.record([outcome(c, DeliveryStatus.DELIVERED) for c in claimed], [])


def lane_of(db_url: str, delivery_id: int) -> str:
    [(lane,)] = sql(db_url, "SELECT lane FROM deliveries WHERE id = :i", i=delivery_id)
    return str(lane)


def statuses(db_url: str, destination: str = ORDERED) -> dict[str, str]:
    rows = sql(
        db_url,
        "SELECT m.message_id, d.status FROM deliveries d JOIN messages m ON m.id = d.message_pk"
        " WHERE d.destination = :d",
        d=destination,
    )
    return {mid: status for mid, status in rows}


def test_only_each_lanes_first_message_is_claimable(store: Store, db_url: str) -> None:
    store.ingestion.insert_messages(
        [message(f"{u}{i}", u) for i in range(3) for u in ("a", "b", "c")], time.time()
    )
    first = claim(store)
    assert sorted(c.message_id for c in first) == ["a0", "b0", "c0"]
    assert claim(store) == []  # leased; the others wait
    assert set(statuses(db_url).values()) == {"pending", "queued"}
    deliver(store, first)
    assert sorted(c.message_id for c in claim(store)) == ["a1", "b1", "c1"]


def test_each_lane_is_sent_in_the_order_efd_acknowledged_it(store: Store) -> None:
    # Acknowledged in four batches, interleaved; the client's timestamps run backwards and
    # change nothing: the order is the acknowledgement's.
    base = time.time()
    for batch in range(4):
        store.ingestion.insert_messages(
            [
                message(f"{u}-{batch}-{i}", u, received_at=base - batch * 10 - i)
                for i in range(2)
                for u in ("x", "y")
            ],
            base,
        )
    seen: dict[str, list[str]] = defaultdict(list)
    while claimed := claim(store):
        assert len({c.message_id[0] for c in claimed}) == len(claimed)  # one per lane
        for c in claimed:
            seen[c.message_id[0]].append(c.message_id)
        deliver(store, claimed)
    for user in ("x", "y"):
        assert seen[user] == [f"{user}-{b}-{i}" for b in range(4) for i in range(2)]


def test_a_retrying_head_holds_only_its_own_lane(store: Store, db_url: str) -> None:
    store.ingestion.insert_messages(
        [message(f"{u}{i}", u) for i in range(3) for u in ("ok", "bad")], 0
    )
    sent: list[str] = []
    for _ in range(4):
        claimed = claim(store)
        sent += [c.message_id for c in claimed]
        store.queue.record(
            [
                outcome(c, DeliveryStatus.PENDING, retry_at=0.0)
                if c.message_id.startswith("bad")
                else outcome(c, DeliveryStatus.DELIVERED)
                for c in claimed
            ],
            [attempt(c, "retry") for c in claimed if c.message_id.startswith("bad")],
        )
    assert [m for m in sent if m.startswith("ok")] == ["ok0", "ok1", "ok2"]
    assert [m for m in sent if m.startswith("bad")] == ["bad0"] * 4  # the head, again
    assert statuses(db_url)["bad1"] == statuses(db_url)["bad2"] == "queued"
    blocked = store.lanes.blocked()[ORDERED]
    assert blocked.count == 1
    assert blocked.oldest_message_id == "bad0"
    waiting = sql(
        db_url,
        "SELECT d.id FROM deliveries d JOIN messages m ON m.id = d.message_pk"
        " WHERE m.message_id = 'bad2'",
    )
    assert store.lanes.waiting_for([waiting[0][0]]) == {waiting[0][0]: "bad0"}


@pytest.mark.parametrize(
    "final", [DeliveryStatus.DELIVERED, DeliveryStatus.FAILED, DeliveryStatus.EXPIRED]
)
def test_any_outcome_of_the_head_hands_the_lane_on(
    store: Store, db_url: str, final: DeliveryStatus
) -> None:
    store.ingestion.insert_messages([message("m1", "u"), message("m2", "u")], time.time())
    [head] = claim(store)
    store.queue.record([outcome(head, final)], [])
    [following] = claim(store)
    assert following.message_id == "m2"
    deliver(store, [following])
    assert sql(db_url, "SELECT count(*) FROM lanes") == [(0,)]  # idle: no row


def test_a_stale_outcome_hands_nothing_on(store: Store) -> None:
    now = time.time()
    store.ingestion.insert_messages([message("m1", "u"), message("m2", "u")], now)
    [first] = store.queue.claim(ClaimRequest(ORDERED, 10, owner="A", now=now, lease_until=now + 1))
    # A's lease lapses; B claims the head again and still holds it.
    [again] = store.queue.claim(
        ClaimRequest(ORDERED, 10, owner="B", now=now + 2, lease_until=now + 60)
    )
    assert again.delivery_id == first.delivery_id
    assert store.queue.record([outcome(first, DeliveryStatus.DELIVERED)], []) == 1  # stale
    assert claim(store, now=now + 3) == []  # m2 still waits for B's outcome
    deliver(store, [again])
    assert [c.message_id for c in claim(store, now=now + 3)] == ["m2"]


def test_a_message_joining_an_idle_lane_is_due_at_once(store: Store) -> None:
    store.ingestion.insert_messages([message("m1", "u")], time.time())
    deliver(store, claim(store))
    store.ingestion.insert_messages([message("m2", "u")], time.time())
    assert [c.message_id for c in claim(store)] == ["m2"]


def test_lanes_are_per_destination_and_unordered_destinations_are_untouched(
    store: Store, db_url: str
) -> None:
    store.ingestion.insert_messages(
        [message(f"m{i}", "u", destinations=(ORDERED, PLAIN)) for i in range(3)], time.time()
    )
    assert len(claim(store, PLAIN)) == 3
    assert len(claim(store, ORDERED)) == 1
    assert sql(db_url, "SELECT DISTINCT lane FROM deliveries WHERE destination = :d", d=PLAIN) == [
        (None,)
    ]


def test_the_anonymous_id_is_the_lane_without_a_user_id(store: Store, db_url: str) -> None:
    store.ingestion.insert_messages(
        [message("a1", None, anonymous="anon"), message("a2", "user", anonymous="anon")],
        time.time(),
    )
    claimed = claim(store)
    assert sorted(c.message_id for c in claimed) == ["a1", "a2"]  # two lanes
    assert sorted(lane_of(db_url, c.delivery_id) for c in claimed) == ["anon", "user"]


def test_redrive_puts_a_message_back_into_its_lane_ahead_of_later_ones(
    store: Store, db_url: str
) -> None:
    store.ingestion.insert_messages([message(f"m{i}", "u") for i in range(1, 5)], time.time())
    [m1] = claim(store)
    store.queue.record([outcome(m1, DeliveryStatus.FAILED)], [])
    [m2] = claim(store)
    # m2 is the head now: a redriven m1 waits, but before m3 and m4.
    ops = OperationsStore(store)
    assert ops.redrive(DeliveryQuery(destinations=(ORDERED,)), time.time()) == 1
    assert statuses(db_url)["m1"] == "queued"
    order = []
    deliver(store, [m2])
    while claimed := claim(store):
        order += [c.message_id for c in claimed]
        deliver(store, claimed)
    assert order == ["m1", "m3", "m4"]
    # Into an idle lane: the head at once.
    [(m1_id,)] = sql(
        db_url,
        "UPDATE deliveries SET status = 'failed' FROM messages m"
        " WHERE m.id = deliveries.message_pk AND m.message_id = 'm1' RETURNING deliveries.id",
    )
    assert ops.redrive(DeliveryQuery(destinations=(ORDERED,)), time.time()) == 1
    assert [c.delivery_id for c in claim(store)] == [m1_id]


def test_waiting_messages_expire_from_receipt_and_expired_heads_hand_on(
    store: Store, db_url: str
) -> None:
    window = 100.0
    now = time.time()
    store.ingestion.insert_messages([message(f"m{i}", "u") for i in range(1, 4)], now - 150)
    store.ingestion.insert_messages([message("m4", "u")], now - 10)
    # Every hook's circuit is open: the waiting head and m2, m3 received too long ago expire,
    # m4 (received 10 s ago) becomes the head.
    store.queue.expire_waiting(ORDERED, window, now)
    assert statuses(db_url) == {
        "m1": "expired",
        "m2": "expired",
        "m3": "expired",
        "m4": "pending",
    }
    assert [c.message_id for c in claim(store, now=now)] == ["m4"]


def test_tending_expires_waiting_messages_and_repairs_lanes(
    store: Store, ordering: Ordering
) -> None:
    now = time.time()
    store.ingestion.insert_messages([message(f"m{i}", "u") for i in range(1, 4)], now - 150)
    store.ingestion.insert_messages([message("m4", "u")], now)
    [head] = claim(store, now=now)
    # An outcome recorded by a process that did not know the destination was ordered.
    ordering.on = False
    deliver(store, [head])
    ordering.on = True
    assert claim(store, now=now) == []
    expired, promoted = store.lanes.tend([ORDERED], 100.0, now)
    assert (expired, promoted) == ({ORDERED: 2}, 1)
    assert [c.message_id for c in claim(store, now=now)] == ["m4"]


def test_discard_takes_waiting_messages_and_clears_the_lanes(store: Store, db_url: str) -> None:
    store.ingestion.insert_messages([message(f"m{i}", "u") for i in range(3)], time.time())
    ops = OperationsStore(store)
    query = DeliveryQuery(destinations=(ORDERED,))
    assert ops.count_discardable(query) == 3
    assert ops.discard(query, time.time(), 100) == 3
    assert set(statuses(db_url).values()) == {"discarded"}
    assert sql(db_url, "SELECT count(*) FROM lanes") == [(0,)]


def test_turning_ordering_off_releases_every_waiting_message(store: Store, db_url: str) -> None:
    store.ingestion.insert_messages([message(f"m{i}", "u") for i in range(3)], time.time())
    assert store.lanes.dissolve([], time.time()) == 2
    assert len(claim(store)) == 3
    assert sql(db_url, "SELECT count(*) FROM lanes") == [(0,)]


def test_waiting_messages_are_backlog_and_never_purged(store: Store, db_url: str) -> None:
    store.ingestion.insert_messages([message(f"m{i}", "u") for i in range(3)], time.time() - 86400)
    assert store.queue.backlog() == {ORDERED: 3}
    [head] = claim(store)
    deliver(store, [head])
    store.jobs.purge_finished(time.time(), 100)
    assert sorted(statuses(db_url)) == ["m1", "m2"]  # m0, finished, purged


def test_an_outcome_waits_for_a_message_joining_its_lane_to_commit(
    store: Store, db_url: str
) -> None:
    """PostgreSQL: m2 joins lane u in a transaction still open while another process records
    the head's outcome. The outcome must wait for that commit and then hand the lane to m2;
    without the lane's row lock it would find no waiting message, drop the lane, and m2
    would wait forever."""
    if store.single_process:
        pytest.skip("one writer on SQLite: nothing runs at once")
    store.ingestion.insert_messages([message("m1", "u")], time.time())
    [head] = claim(store)
    other = Store(db_url, steps=Ordering())
    recorder: threading.Thread | None = None
    try:
        with other.database.write() as conn:
            other.ingestion.insert_with_deliveries(conn, [message("m2", "u")], time.time())
            recorder = threading.Thread(target=deliver, args=(store, [head]))
            recorder.start()
            # Until the recorder either finished or waits on a lock (the lane's row).
            while recorder.is_alive() and not sql(
                db_url,
                "SELECT 1 FROM pg_stat_activity WHERE wait_event_type = 'Lock'"
                " AND datname = current_database()",
            ):
                time.sleep(0.01)
        recorder.join()
    finally:
        if recorder is not None:
            recorder.join()
        other.dispose()
    assert [c.message_id for c in claim(store)] == ["m2"]


def test_writers_at_once_take_turns_per_lane(store: Store, db_url: str) -> None:
    """Ingestion from several processes, and outcomes recorded meanwhile: every lane always
    has exactly one head while it has messages, and each is sent in the order stored."""
    if store.single_process:
        pytest.skip("one writer on SQLite: nothing runs at once")
    writers = [Store(db_url, steps=Ordering()) for _ in range(3)]
    users = [f"u{i}" for i in range(4)]
    per_writer = 40
    errors: list[BaseException] = []

    def ingest(w: Store, n: int) -> None:
        try:
            for i in range(per_writer):
                w.ingestion.insert_messages(
                    [message(f"w{n}-{i}-{u}", u) for u in users], time.time()
                )
        except BaseException as error:
            errors.append(error)

    threads = [threading.Thread(target=ingest, args=(w, n)) for n, w in enumerate(writers)]
    for t in threads:
        t.start()
    sent: dict[str, list[str]] = defaultdict(list)  # lane -> messageIds, in the order sent
    total = len(writers) * per_writer * len(users)
    deadline = time.monotonic() + 60
    while sum(len(v) for v in sent.values()) < total and time.monotonic() < deadline:
        claimed = claim(store)
        assert len({c.message_id.rsplit("-", 1)[1] for c in claimed}) == len(claimed)
        for c in claimed:
            sent[c.message_id.rsplit("-", 1)[1]].append(c.message_id)
        deliver(store, claimed)
    for t in threads:
        t.join()
    for w in writers:
        w.dispose()
    assert not errors
    assert sum(len(v) for v in sent.values()) == total
    # Each writer stored its batches one after the other: in every lane they go in that
    # order. (Between writers' concurrent batches there is no order to keep.)
    for lane, ids in sent.items():
        for n in range(len(writers)):
            mine = [int(m.split("-")[1]) for m in ids if m.startswith(f"w{n}-")]
            assert mine == list(range(per_writer)), (lane, n, mine)
    assert sql(db_url, "SELECT count(*) FROM lanes") == [(0,)]


def test_a_head_whose_message_is_gone_fails_and_hands_its_lane_on(
    store: Store, db_url: str
) -> None:
    # PostgreSQL declares no foreign key from deliveries to messages (migration 0011): a
    # message deleted by hand leaves its delivery behind, and its lane must not stall on it.
    store.ingestion.insert_messages([message("first", "u1"), message("second", "u1")], time.time())
    sql(db_url, "DELETE FROM messages WHERE message_id = 'first'")
    assert claim(store) == []  # the head is failed in the claim; the next is due from now on
    assert sql(db_url, "SELECT status FROM deliveries ORDER BY id") == [("failed",), ("pending",)]
    assert [c.message_id for c in claim(store)] == ["second"]
