"""Batched delivery's store (efd/store/batches.py) on real SQLite files and real PostgreSQL
databases: batches formed once with a guarded UPDATE (a delivery is never in two batches,
even when two daemons form at once), claimed under a fenced lease, their outcomes copied to
every member, split after a 413, deleted by retention with their last member; and migration
0014 keeping every row of an existing database."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator, Sequence

import pytest
from alembic.script import ScriptDirectory

from efd.delivery import batching
from efd.delivery.lanes import Lanes
from efd.records import AttemptRow, ClaimRequest, DeliveryStatus
from efd.store import Steps, Store, migrate
from efd.store.batches import (
    BatchAttempt,
    BatchOutcome,
    Candidates,
    Formed,
    LeasedBatch,
    NewBatch,
)
from tests.conftest import sql
from tests.integration.test_store import _downgrade
from tests.support.rows import new_message

ROUTE = "bulk/ingest"
DELIVERED = DeliveryStatus.DELIVERED.value
PENDING = DeliveryStatus.PENDING.value
NOW = 1_000_000.0


@pytest.fixture
def store(db_url: str) -> Iterator[Store]:
    migrate.upgrade(db_url)
    s = Store(db_url)
    yield s
    s.dispose()


def ordered_steps() -> Steps:
    return Steps(lanes=Lanes([ROUTE]))


def ingest(
    store: Store, count: int, *, user: str | None = "u", at: float = NOW, first: int = 0
) -> None:
    store.ingestion.insert_messages(
        [
            new_message(f"m{i}", destinations=(ROUTE,), user=user, received_at=at)
            for i in range(first, first + count)
        ],
        at,
    )


def planner(
    size: int, *, wait: float = 0.0, max_bytes: int = batching.MAX_BYTES_DEFAULT
) -> batching.BatchPolicy:
    return batching.BatchPolicy(size=size, max_bytes=max_bytes, wait_seconds=wait)


def plan_with(policy: batching.BatchPolicy, now: float = NOW) -> object:
    """A formation's plan as the dispatcher makes it: efd.delivery.batching.form over the
    candidates, each batch's body and webhook-id."""

    def plan(found: Candidates) -> list[NewBatch]:
        candidates = [
            batching.Candidate(
                delivery_id=w.delivery_id,
                body=(w.body or "").encode(),
                key=batching.batch_key(policy.keys, w.url or "", "POST", ()),
                lane=w.lane,
                since=w.since,
            )
            for w in found.waiting
        ]
        formed = batching.form(candidates, policy, now, busy=found.busy)
        return [new_batch(b.delivery_ids, [c.body for c in b.members]) for b in formed.ready]

    return plan


def new_batch(members: Sequence[int], bodies: Sequence[bytes] | None = None) -> NewBatch:
    bodies = bodies if bodies is not None else [b'{"type":"track"}'] * len(members)
    return NewBatch(
        members=tuple(members),
        body=batching.array(bodies),
        webhook_id=batching.webhook_id(ROUTE, [f"msg_{m}" for m in members]),
    )


def form(
    store: Store,
    size: int,
    *,
    ordered: bool = False,
    now: float = NOW,
    owner: str = "A",
    limit: int = 1000,
) -> Formed:
    return store.batches.form(
        ROUTE,
        plan_with(planner(size), now),  # type: ignore[arg-type]
        ordered=ordered,
        limit=limit,
        owner=owner,
        now=now,
        lease_until=now + 60,
    )


def outcome(
    batch: LeasedBatch,
    status: str = DELIVERED,
    *,
    token: int | None = None,
    at: float = NOW + 1,
    retry_at: float | None = None,
    error: str | None = None,
) -> BatchOutcome:
    return BatchOutcome(
        batch_id=batch.id,
        lease_token=batch.lease_token if token is None else token,
        status=status,
        attempts=batch.attempts + 1,
        first_attempt_at=batch.first_attempt_at or at,
        next_attempt_at=retry_at,
        finished_at=None if status == PENDING else at,
        last_error=error,
    )


def attempt(batch: LeasedBatch, code: int = 200, at: float = NOW + 1) -> BatchAttempt:
    row = AttemptRow(
        delivery_id=batch.members[0],
        hook_url="https://warehouse.example.com/ingest",
        attempted_at=at,
        duration_ms=3.0,
        outcome="success" if code < 300 else "fail",
        status_code=code,
        error_class=None,
        error=None,
        response_head="ok",
    )
    return BatchAttempt(batch.id, row)


def memberships(url: str) -> dict[int, int | None]:
    return dict(sql(url, "SELECT id, batch_id FROM deliveries ORDER BY id"))


# -- forming ----------------------------------------------------------------------------------


def test_forming_records_each_batch_with_its_members_and_exact_body(
    store: Store, db_url: str
) -> None:
    ingest(store, 5)
    formed = form(store, 2)
    assert not formed.contended
    assert [b.members for b in formed.batches] == [(1, 2), (3, 4), (5,)]
    assert all(b.lease_token == 1 and b.attempts == 0 for b in formed.batches)
    assert memberships(db_url) == {1: 1, 2: 1, 3: 2, 4: 2, 5: 3}
    rows = sql(
        db_url,
        "SELECT id, route, body, webhook_id, status, lease_owner, lease_token, next_attempt_at"
        " FROM batches ORDER BY id",
    )
    assert rows[0] == (
        1,
        ROUTE,
        '[{"type":"track"},{"type":"track"}]',
        formed.batches[0].webhook_id,
        PENDING,
        "A",
        1,
        NOW + 60,
    )
    assert formed.batches[2].body == b'[{"type":"track"}]'
    # Nothing waits any more: forming again records nothing.
    assert form(store, 2) == Formed(())
    assert store.batches.candidates(ROUTE, ordered=False, limit=100).waiting == ()


def test_an_action_deliverys_own_body_and_url_are_the_candidates(store: Store) -> None:
    store.ingestion.insert_messages(
        [
            new_message(
                "m", destinations=(), mapped=((ROUTE, '{"a":1}', "https://w.example/1", None),)
            )
        ],
        NOW,
    )
    [waiting] = store.batches.candidates(ROUTE, ordered=False, limit=10).waiting
    assert (waiting.body, waiting.url, waiting.message_id, waiting.source) == (
        '{"a":1}',
        "https://w.example/1",
        "m",
        "web",
    )


def test_a_formation_with_a_member_already_batched_records_nothing(
    store: Store, db_url: str
) -> None:
    ingest(store, 5)
    [first] = store.batches.form(
        ROUTE, lambda _: [new_batch([1, 2])], ordered=False, limit=10, owner="A", now=NOW,
        lease_until=NOW + 60,
    ).batches  # fmt: skip
    # A plan made from a stale read: 2 is in a batch already. The whole formation rolls back,
    # the batch before it in the plan too.
    stale = store.batches.form(
        ROUTE,
        lambda _: [new_batch([3, 4]), new_batch([2, 5])],
        ordered=False,
        limit=10,
        owner="B",
        now=NOW,
        lease_until=NOW + 60,
    )
    assert stale == Formed((), contended=True)
    assert memberships(db_url) == {1: first.id, 2: first.id, 3: None, 4: None, 5: None}
    assert sql(db_url, "SELECT count(*) FROM batches") == [(1,)]
    # A member listed twice is refused alike.
    twice = store.batches.form(
        ROUTE, lambda _: [new_batch([3, 3])], ordered=False, limit=10, owner="B", now=NOW,
        lease_until=NOW + 60,
    )  # fmt: skip
    assert twice.contended
    assert sql(db_url, "SELECT count(*) FROM batches") == [(1,)]


def test_a_finished_delivery_never_joins_a_batch(store: Store, db_url: str) -> None:
    ingest(store, 2)
    sql(db_url, "UPDATE deliveries SET status = 'discarded' WHERE id = 2")
    assert [w.delivery_id for w in store.batches.candidates(ROUTE, ordered=False, limit=9).waiting]
    stale = store.batches.form(
        ROUTE, lambda _: [new_batch([1, 2])], ordered=False, limit=10, owner="A", now=NOW,
        lease_until=NOW + 60,
    )  # fmt: skip
    assert stale.contended
    assert memberships(db_url) == {1: None, 2: None}


def test_a_partial_batch_waits_until_its_oldest_event_has_waited(store: Store) -> None:
    ingest(store, 3)
    waiting = store.batches.form(
        ROUTE, plan_with(planner(10, wait=5.0), NOW + 1), ordered=False, limit=10,  # type: ignore[arg-type]
        owner="A", now=NOW + 1, lease_until=NOW + 61,
    )  # fmt: skip
    assert waiting == Formed(())
    due = store.batches.form(
        ROUTE, plan_with(planner(10, wait=5.0), NOW + 5), ordered=False, limit=10,  # type: ignore[arg-type]
        owner="A", now=NOW + 5, lease_until=NOW + 65,
    )  # fmt: skip
    assert [b.members for b in due.batches] == [(1, 2, 3)]


def test_one_daemon_at_a_time_forms_a_route_on_postgresql(store: Store, db_url: str) -> None:
    if not store.backend.row_locks:
        pytest.skip("one process writes a SQLite file")
    ingest(store, 4)
    other = Store(db_url)
    inside, release = threading.Event(), threading.Event()
    results: list[Formed] = []

    def slow(found: Candidates) -> list[NewBatch]:
        inside.set()
        release.wait(10)
        return [new_batch([w.delivery_id for w in found.waiting])]

    def first() -> None:
        results.append(
            store.batches.form(
                ROUTE, slow, ordered=False, limit=10, owner="A", now=NOW, lease_until=NOW + 60
            )
        )

    thread = threading.Thread(target=first)
    thread.start()
    try:
        assert inside.wait(10)
        # The route's row is held: the second daemon forms nothing this turn, at once.
        started = time.monotonic()
        assert form(other, 2, owner="B") == Formed((), contended=True)
        assert time.monotonic() - started < 5
    finally:
        release.set()
        thread.join(10)
        other.dispose()
    [formed] = results
    assert [b.members for b in formed.batches] == [(1, 2, 3, 4)]


def test_concurrent_formations_never_put_a_delivery_in_two_batches(
    store: Store, db_url: str
) -> None:
    # On PostgreSQL the daemons really overlap; on SQLite the single writer takes turns.
    ingest(store, 120)
    other = Store(db_url)
    formed: list[LeasedBatch] = []
    lock = threading.Lock()

    def daemon(s: Store, owner: str) -> None:
        for _ in range(200):
            result = form(s, 7, owner=owner, limit=20)
            with lock:
                formed.extend(result.batches)
            if not result.batches and not result.contended:
                return

    threads = [
        threading.Thread(target=daemon, args=(store, "A")),
        threading.Thread(target=daemon, args=(other, "B")),
    ]
    try:
        for t in threads:
            t.start()
        for t in threads:
            t.join(60)
    finally:
        other.dispose()
    members = [pk for b in formed for pk in b.members]
    assert sorted(members) == list(range(1, 121))  # each exactly once
    stored = memberships(db_url)
    assert all(stored[pk] == b.id for b in formed for pk in b.members)
    assert sql(db_url, "SELECT count(*) FROM batches") == [(len(formed),)]


# -- claims and leases ------------------------------------------------------------------------


def request(now: float, owner: str = "A", limit: int = 10) -> ClaimRequest:
    return ClaimRequest(ROUTE, limit, owner=owner, now=now, lease_until=now + 60)


def test_a_claim_leases_due_batches_and_a_stale_token_changes_nothing(
    store: Store, db_url: str
) -> None:
    ingest(store, 4)
    [held, other] = form(store, 2).batches
    # Leased to their former until NOW + 60: nobody claims them meanwhile.
    assert store.batches.claim(request(NOW + 1, "B")) == []
    # The lease lapses (its holder died): another daemon takes both, the token moves on.
    claimed = store.batches.claim(request(NOW + 61, "B"))
    assert [(b.id, b.lease_token, b.members) for b in claimed] == [
        (held.id, 2, (1, 2)),
        (other.id, 2, (3, 4)),
    ]
    assert claimed[0].body == held.body
    assert claimed[0].webhook_id == held.webhook_id
    # The first holder comes back: its outcome, renewal and release are all stale.
    tried = [attempt(held)]
    assert store.batches.record([outcome(held, error="late")], tried) == 1
    assert store.batches.renew([(held.id, 1)], NOW + 500) == [held.id]
    store.batches.release([(held.id, 1)], NOW + 2)
    assert sql(db_url, "SELECT status, lease_owner, next_attempt_at FROM batches WHERE id = 1") == [
        (PENDING, "B", NOW + 121)
    ]
    assert sql(db_url, "SELECT DISTINCT status, attempts FROM deliveries") == [(PENDING, 0)]
    # Its request did happen: logged under the batch.
    assert sql(db_url, "SELECT delivery_id, batch_id, status_code FROM attempts") == [
        (1, held.id, 200)
    ]
    # The current holder's token renews and records.
    assert store.batches.renew([(held.id, 2)], NOW + 200) == []
    assert store.batches.record([outcome(claimed[0])], [attempt(claimed[0])]) == 0
    assert sql(db_url, "SELECT status FROM batches ORDER BY id") == [(DELIVERED,), (PENDING,)]


def test_released_batches_are_due_again_at_once(store: Store) -> None:
    ingest(store, 2)
    [batch] = form(store, 2).batches
    store.batches.release([(batch.id, batch.lease_token)], NOW + 1)
    [again] = store.batches.claim(request(NOW + 1, "B"))
    assert (again.id, again.lease_token) == (batch.id, 2)


# -- outcomes ---------------------------------------------------------------------------------


def test_an_outcome_is_copied_to_every_member(store: Store, db_url: str) -> None:
    ingest(store, 5)
    [retried, delivered, failed] = form(store, 2).batches
    stale = store.batches.record(
        [
            outcome(retried, PENDING, retry_at=NOW + 30, error="HTTP 503"),
            outcome(delivered, at=NOW + 2),
            outcome(failed, DeliveryStatus.FAILED.value, at=NOW + 3, error="HTTP 400"),
        ],
        [attempt(retried, 503), attempt(delivered), attempt(failed, 400)],
    )
    assert stale == 0
    assert sql(
        db_url,
        "SELECT id, batch_id, status, attempts, first_attempt_at, next_attempt_at,"
        " finished_at, last_error, lease_owner FROM deliveries ORDER BY id",
    ) == [
        (1, 1, PENDING, 1, NOW + 1, NOW + 30, None, "HTTP 503", None),
        (2, 1, PENDING, 1, NOW + 1, NOW + 30, None, "HTTP 503", None),
        (3, 2, DELIVERED, 1, NOW + 2, None, NOW + 2, None, None),
        (4, 2, DELIVERED, 1, NOW + 2, None, NOW + 2, None, None),
        (5, 3, "failed", 1, NOW + 3, None, NOW + 3, "HTTP 400", None),
    ]
    assert sql(db_url, "SELECT id, status, attempts, finished_at FROM batches ORDER BY id") == [
        (1, PENDING, 1, None),
        (2, DELIVERED, 1, NOW + 2),
        (3, "failed", 1, NOW + 3),
    ]
    # The retry is claimed when due, with the same bytes and webhook-id.
    assert store.batches.claim(request(NOW + 29)) == []
    [again] = store.batches.claim(request(NOW + 30))
    assert (again.id, again.body, again.webhook_id, again.attempts) == (
        retried.id,
        retried.body,
        retried.webhook_id,
        1,
    )
    assert again.first_attempt_at == NOW + 1


def test_the_audit_query_names_the_request_that_carried_a_message(
    store: Store, db_url: str
) -> None:
    ingest(store, 3)
    [batch] = form(store, 3).batches
    store.batches.record([outcome(batch)], [attempt(batch)])
    rows = sql(
        db_url,
        """
        SELECT d.destination, b.id AS batch, b.webhook_id, a.attempted_at, a.status_code,
               a.error_class, a.error, a.response_head
        FROM messages m
        JOIN deliveries d ON d.message_pk = m.id
        LEFT JOIN batches b ON b.id = d.batch_id
        LEFT JOIN attempts a ON a.batch_id = b.id
        WHERE m.message_id = 'm2' ORDER BY a.attempted_at
        """,
    )
    assert rows == [(ROUTE, batch.id, batch.webhook_id, NOW + 1, 200, None, None, "ok")]


def test_ordered_members_share_their_batch_and_finished_heads_hand_their_lanes_on(
    db_url: str,
) -> None:
    migrate.upgrade(db_url)
    store = Store(db_url, steps=ordered_steps)
    try:
        ingest(store, 3, user="u")
        ingest(store, 1, user="v", first=3)
        assert sql(db_url, "SELECT head FROM lanes ORDER BY head") == [(1,), (4,)]
        found = store.batches.candidates(ROUTE, ordered=True, limit=10)
        # The head and the events queued behind it, in their order.
        assert [w.delivery_id for w in found.waiting] == [1, 2, 3, 4]
        [batch] = form(store, 10, ordered=True).batches
        assert batch.members == (1, 2, 3, 4)
        # A later event of u waits for the batch: its lane is busy.
        ingest(store, 1, user="u", first=4, at=NOW + 1)
        found = store.batches.candidates(ROUTE, ordered=True, limit=10)
        assert [w.delivery_id for w in found.waiting] == [5]
        assert found.busy == {lane for (lane,) in sql(db_url, "SELECT lane FROM lanes")}
        assert len(found.busy) == 2
        assert form(store, 10, ordered=True, now=NOW + 1) == Formed(())
        # A retry keeps the events behind each lane's head queued: one pending a lane.
        store.batches.record([outcome(batch, PENDING, retry_at=NOW + 1.5, error="503")], [])
        assert sql(db_url, "SELECT id, status FROM deliveries WHERE id < 5 ORDER BY id") == [
            (1, PENDING),
            (2, "queued"),
            (3, "queued"),
            (4, PENDING),
        ]
        [batch] = store.batches.claim(request(NOW + 1.5))
        store.batches.record([outcome(batch, at=NOW + 2)], [attempt(batch, at=NOW + 2)])
        assert sql(db_url, "SELECT DISTINCT status, attempts FROM deliveries WHERE id < 5") == [
            (DELIVERED, 2)
        ]
        # u's lane moved on to the event that waited; v's is idle.
        assert sql(db_url, "SELECT head FROM lanes") == [(5,)]
        assert sql(db_url, "SELECT status FROM deliveries WHERE id = 5") == [(PENDING,)]
        [after] = form(store, 10, ordered=True, now=NOW + 3).batches
        assert after.members == (5,)
    finally:
        store.dispose()


# -- 413 --------------------------------------------------------------------------------------


def test_a_413_splits_the_batch_into_two_new_batches(store: Store, db_url: str) -> None:
    ingest(store, 5)
    [batch] = form(store, 5).batches
    halves = (new_batch([1, 2]), new_batch([3, 4, 5]))
    too_large = outcome(batch, DeliveryStatus.FAILED.value, error="HTTP 413")
    stale = store.batches.split(
        outcome(batch, token=0),
        halves,
        [attempt(batch, 413)],
        ordered=False,
        owner="A",
        now=NOW + 1,
        lease_until=NOW + 61,
    )
    assert stale is None  # fenced: nothing moved
    assert memberships(db_url) == dict.fromkeys(range(1, 6), batch.id)
    split = store.batches.split(
        too_large, halves, [], ordered=False, owner="A", now=NOW + 1, lease_until=NOW + 61
    )
    assert split is not None
    first, second = split
    assert (first.members, second.members) == ((1, 2), (3, 4, 5))
    assert first.body == halves[0].body
    assert second.webhook_id == halves[1].webhook_id
    assert memberships(db_url) == {
        1: first.id,
        2: first.id,
        3: second.id,
        4: second.id,
        5: second.id,
    }
    assert sql(db_url, "SELECT status, last_error, finished_at FROM batches WHERE id = 1") == [
        ("split", "HTTP 413", NOW + 1)
    ]
    # The halves keep the batch's first attempt (the retry window), and are sent at once.
    assert sql(db_url, "SELECT first_attempt_at, lease_token FROM batches WHERE id > 1") == [
        (NOW + 1, 1),
        (NOW + 1, 1),
    ]
    assert sql(db_url, "SELECT DISTINCT status FROM deliveries") == [(PENDING,)]
    # The split batch is done: never claimed again.
    assert [b.id for b in store.batches.claim(request(NOW + 100))] == [first.id, second.id]


def test_a_413_on_an_ordered_route_sends_the_first_half_and_frees_the_second(
    db_url: str,
) -> None:
    migrate.upgrade(db_url)
    store = Store(db_url, steps=ordered_steps)
    try:
        ingest(store, 4, user="u")
        [batch] = form(store, 4, ordered=True).batches
        split = store.batches.split(
            outcome(batch, DeliveryStatus.FAILED.value, error="HTTP 413"),
            (new_batch([1, 2]), new_batch([3, 4])),
            [attempt(batch, 413)],
            ordered=True,
            owner="A",
            now=NOW + 1,
            lease_until=NOW + 61,
        )
        assert split is not None
        [first] = split
        assert memberships(db_url) == {1: first.id, 2: first.id, 3: None, 4: None}
        # The lane is busy with the first half: the second waits for its outcome.
        assert form(store, 4, ordered=True, now=NOW + 2) == Formed(())
        store.batches.record([outcome(first, at=NOW + 3)], [])
        [later] = form(store, 4, ordered=True, now=NOW + 4).batches
        assert later.members == (3, 4)
    finally:
        store.dispose()


def test_a_split_whose_halves_miss_a_member_changes_nothing(store: Store, db_url: str) -> None:
    ingest(store, 3)
    [batch] = form(store, 3).batches
    wrong = store.batches.split(
        outcome(batch, DeliveryStatus.FAILED.value),
        (new_batch([1]), new_batch([2])),
        [],
        ordered=False,
        owner="A",
        now=NOW + 1,
        lease_until=NOW + 61,
    )
    assert wrong is None
    assert memberships(db_url) == dict.fromkeys((1, 2, 3), batch.id)
    assert sql(db_url, "SELECT id, status FROM batches") == [(batch.id, PENDING)]


# -- retention --------------------------------------------------------------------------------


def test_retention_deletes_a_batch_with_its_last_member(store: Store, db_url: str) -> None:
    ingest(store, 4, at=NOW)
    ingest(store, 1, at=NOW + 1000, first=4)
    [early] = form(store, 4).batches
    [late] = form(store, 4, now=NOW + 1000).batches
    store.batches.record([outcome(early, at=NOW + 1)], [attempt(early)])
    store.batches.record([outcome(late, at=NOW + 1001)], [attempt(late, at=NOW + 1001)])
    # A member whose message another destination still needs keeps its batch.
    sql(
        db_url,
        "INSERT INTO deliveries (message_pk, destination, status, attempts, created_at,"
        " lease_token) VALUES (4, 'other', 'pending', 0, :t, 0)",
        t=NOW,
    )
    assert store.retention.purge(NOW + 500, 2) == 3
    assert sql(db_url, "SELECT id FROM batches ORDER BY id") == [(early.id,), (late.id,)]
    assert memberships(db_url) == {4: early.id, 5: late.id, 6: None}
    sql(db_url, "UPDATE deliveries SET status = 'delivered', finished_at = :t WHERE id = 6", t=NOW)
    assert store.retention.purge(NOW + 500, 2) == 1
    assert sql(db_url, "SELECT id FROM batches") == [(late.id,)]
    assert sql(db_url, "SELECT batch_id FROM attempts") == [(late.id,)]
    assert store.retention.purge(NOW + 5000, 100) == 1
    assert sql(db_url, "SELECT count(*) FROM batches") == [(0,)]
    assert sql(db_url, "SELECT count(*) FROM attempts") == [(0,)]


def test_retention_deletes_a_split_batch_with_its_halves(store: Store, db_url: str) -> None:
    ingest(store, 4)
    [batch] = form(store, 4).batches
    halves = store.batches.split(
        outcome(batch, DeliveryStatus.FAILED.value, error="HTTP 413"),
        (new_batch([1, 2]), new_batch([3, 4])),
        [attempt(batch, 413)],
        ordered=False,
        owner="A",
        now=NOW + 1,
        lease_until=NOW + 61,
    )
    assert halves is not None
    store.batches.record(
        [outcome(h, at=NOW + 2) for h in halves], [attempt(h, at=NOW + 2) for h in halves]
    )
    # Step by step: the batches go as their last members go.
    assert store.retention.purge(NOW + 100, 1) == 4
    assert sql(db_url, "SELECT count(*) FROM batches") == [(0,)]
    assert sql(db_url, "SELECT count(*) FROM attempts") == [(0,)]
    assert sql(db_url, "SELECT count(*) FROM deliveries") == [(0,)]


# -- the migration ----------------------------------------------------------------------------


def test_migration_0014_keeps_every_row_of_an_existing_database(db_url: str) -> None:
    migrate.upgrade(db_url)
    _downgrade(db_url, _before_batches())
    assert "batch_id" not in _columns(db_url, "deliveries")
    sql(
        db_url,
        "INSERT INTO messages (id, source, message_id, type, timestamp, received_at, body)"
        " VALUES (1, 'web', 'm1', 'track', 1, 1, '{}'), (2, 'web', 'm2', 'track', 2, 2, '{}')",
    )
    sql(
        db_url,
        "INSERT INTO deliveries (id, message_pk, destination, status, attempts, created_at,"
        " lease_token, body, url) VALUES (1, 1, 'd', 'delivered', 1, 1, 1, NULL, NULL),"
        " (2, 2, 'd/a', 'pending', 0, 2, 0, :body, 'https://e.example/')",
        body='{"x":1}',
    )
    sql(
        db_url,
        "INSERT INTO attempts (delivery_id, hook_url, attempted_at, duration_ms, outcome,"
        " status_code) VALUES (1, 'https://e.example/', 1.5, 2, 'success', 200)",
    )
    migrate.upgrade(db_url)
    assert migrate.current_revision(db_url) == migrate.head_revision()
    assert sql(db_url, "SELECT id, message_id FROM messages ORDER BY id") == [(1, "m1"), (2, "m2")]
    assert sql(db_url, "SELECT id, status, body, url, batch_id FROM deliveries ORDER BY id") == [
        (1, "delivered", None, None, None),
        (2, "pending", '{"x":1}', "https://e.example/", None),
    ]
    assert sql(db_url, "SELECT delivery_id, status_code, batch_id FROM attempts") == [
        (1, 200, None)
    ]
    assert sql(db_url, "SELECT count(*) FROM batches") == [(0,)]
    assert sql(db_url, "SELECT count(*) FROM batch_routes") == [(0,)]


def _before_batches() -> str:
    """The revision the batches migration follows."""
    script = ScriptDirectory.from_config(migrate._config())
    [batches] = [r for r in script.walk_revisions() if r.revision == "0014"]
    down = batches.down_revision
    assert isinstance(down, str)
    return down


def _columns(url: str, table: str) -> set[str]:
    from tests.integration.test_store import _columns as columns

    return columns(url, table)


def test_a_batch_lists_its_members_in_the_order_efd_accepted_them() -> None:
    with pytest.raises(ValueError, match="ascending"):
        NewBatch(members=(2, 1), body=b"[]", webhook_id="batch_x")
    with pytest.raises(ValueError, match="ascending"):
        NewBatch(members=(), body=b"[]", webhook_id="batch_x")
