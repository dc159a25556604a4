"""The delivery queue's rules, written once and run against the in-memory twin
(tests/support/memory.py), real SQLite and real PostgreSQL, through the dispatcher's own
face (`Deliveries`): what the dispatcher's unit tests assume of the twin is what the
databases do."""

from __future__ import annotations

import asyncio
import contextlib
import itertools
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path

import pytest
from sqlalchemy import select

from efd.delivery.handoff import Grant, Room
from efd.delivery.lanes import Lanes
from efd.delivery.ports import Deliveries
from efd.records import AttemptRow, Claimed, ClaimRequest, DeliveryStatus, Outcome
from efd.store import Steps, Store, migrate
from efd.store.ingestion import Handoff
from efd.store.runner import AsyncDeliveries, AsyncStore
from efd.store.schema import deliveries
from tests.conftest import pg_database
from tests.support.memory import MemoryDeliveries
from tests.support.rows import new_message

T = 1_000_000.0  # the twin's clock; every time below is relative to it
LEASE = 60.0


@dataclass
class Queue:
    """A queue under test: its `Deliveries`, and a way to add pending deliveries created
    and due at a time (their ids, in order)."""

    deliveries: Deliveries
    add: Callable[[str, int, float], Awaitable[list[int]]]
    # deliveries to the ordered destination "o", in one lane (a user): (destination, lane,
    # count, time)
    add_lane: Callable[[str, int, float], Awaitable[list[int]]]
    # stored as ingestion stores them with a dispatcher's handoff: (destination or "o" with
    # a lane, count, time, the handoff); their ids
    ingest: Callable[[str, int, float, Handoff], Awaitable[list[int]]]
    # an action's delivery to "d", with the body and URL routing made: (body, url, time)
    add_action: Callable[[str, str, float], Awaitable[list[int]]]


def _twin() -> Queue:
    twin = MemoryDeliveries(clock=T)

    async def add(destination: str, count: int, at: float) -> list[int]:
        return twin.add(destination, count, due_in=at - T)

    async def add_lane(lane: str, count: int, at: float) -> list[int]:
        return twin.add("o", count, due_in=at - T, lane=lane)

    async def ingest(destination: str, count: int, at: float, handoff: Handoff) -> list[int]:
        twin.clock = at
        lane = "u" if destination == "o" else None
        return twin.ingest(destination, count, handoff, lane=lane)

    async def add_action(body: str, url: str, at: float) -> list[int]:
        return twin.add("d", 1, due_in=at - T, body=body, url=url)

    return Queue(twin, add, add_lane, ingest, add_action)


def _real(url: str) -> tuple[Queue, AsyncStore]:
    ordered = Steps(lanes=Lanes(["o"]))  # as the daemon sets it up for an ordered "o"
    store = Store(url, steps=lambda: ordered)
    db = AsyncStore(store)
    numbers = itertools.count()

    async def add(
        destination: str,
        count: int,
        at: float,
        user: str = "u",
        handoff: Handoff | None = None,
        mapped: tuple[tuple[str, str | None, str | None, str | None], ...] = (),
    ) -> list[int]:
        rows = [
            new_message(
                f"m{next(numbers)}",
                destinations=() if mapped else (destination,),
                user=user,
                received_at=at,
                mapped=mapped,
            )
            for _ in range(count)
        ]
        await db.write(store.ingestion.insert_messages, rows, at, handoff=handoff)

        def last() -> list[int]:
            with store.database.read() as conn:
                query = select(deliveries.c.id).order_by(deliveries.c.id.desc()).limit(count)
                return sorted(conn.execute(query).scalars())

        return await db.read(last)

    async def add_lane(lane: str, count: int, at: float) -> list[int]:
        return await add("o", count, at, user=lane)

    async def ingest(destination: str, count: int, at: float, handoff: Handoff) -> list[int]:
        return await add(destination, count, at, handoff=handoff)

    async def add_action(body: str, url: str, at: float) -> list[int]:
        return await add("d", 1, at, mapped=(("d", body, url, None),))

    return Queue(AsyncDeliveries(db), add, add_lane, ingest, add_action), db


@pytest.fixture(params=["memory", "sqlite", "postgresql"])
async def queue(request: pytest.FixtureRequest, tmp_path: Path) -> AsyncIterator[Queue]:
    if request.param == "memory":
        yield _twin()
        return
    with contextlib.ExitStack() as databases:
        if request.param == "sqlite":
            url = f"sqlite:///{tmp_path / 'efd.db'}"
            migrate.upgrade(url)
        else:
            template = request.getfixturevalue("pg_template")  # skips without PostgreSQL
            url = databases.enter_context(pg_database(template, "efd_contract"))
        real, db = _real(url)
        try:
            yield real
        finally:
            await asyncio.to_thread(db.close)


async def claim(
    q: Queue,
    limit: int = 10,
    *,
    owner: str = "A",
    now: float = T,
    lease_until: float | None = None,
    due_by: float | None = None,
    lapsed_before: float | None = None,
) -> list[Claimed]:
    until = now + LEASE if lease_until is None else lease_until
    return await q.deliveries.claim(
        ClaimRequest(
            "d",
            limit,
            owner=owner,
            now=now,
            lease_until=until,
            due_by=due_by,
            lapsed_before=lapsed_before,
        )
    )


def ids(claimed: list[Claimed]) -> list[int]:
    return [c.delivery_id for c in claimed]


def outcome(
    c: Claimed,
    status: DeliveryStatus,
    *,
    at: float,
    next_at: float | None = None,
    failed: frozenset[str] = frozenset(),
    token: int | None = None,
) -> Outcome:
    return Outcome(
        delivery_id=c.delivery_id,
        lease_token=c.lease_token if token is None else token,
        status=status,
        attempts=c.attempts + 1,
        first_attempt_at=c.first_attempt_at if c.first_attempt_at is not None else at,
        next_attempt_at=next_at,
        finished_at=None if status is DeliveryStatus.PENDING else at,
        failed_hooks=failed,
        last_error=None if status is DeliveryStatus.DELIVERED else "HTTP 503",
    )


def attempt(c: Claimed, at: float) -> AttemptRow:
    return AttemptRow(
        c.delivery_id, "https://a.example/hook", at, 5.0, "retry", 503, None, None, None
    )


# -- claim ------------------------------------------------------------------------------------


async def test_a_claim_takes_only_due_deliveries_of_its_destination(queue: Queue) -> None:
    due = await queue.add("d", 2, T - 5)
    await queue.add("d", 1, T + 5)  # not due yet
    await queue.add("other", 1, T - 5)
    assert ids(await claim(queue)) == due
    assert await claim(queue, now=T + 4) == []


async def test_an_action_delivery_is_claimed_with_its_own_body_and_url(queue: Queue) -> None:
    body = '{"order":"o-17","email":"ann@x.com"}'
    url = "https://crm.example/orders/o%2F17?ref=a%20b"
    [action] = await queue.add_action(body, url, T)
    [plain] = await queue.add("d", 1, T)
    claimed = {c.delivery_id: c for c in await claim(queue)}
    assert (claimed[action].body, claimed[action].url) == (body, url)
    assert claimed[plain].url is None
    assert claimed[plain].body == '{"type":"track"}'


async def test_a_claim_takes_the_earliest_due_first_and_answers_in_id_order(queue: Queue) -> None:
    late = await queue.add("d", 1, T - 1)
    early = await queue.add("d", 2, T - 10)  # added after, due before
    assert ids(await claim(queue, limit=2)) == early
    assert ids(await claim(queue, limit=2)) == late


async def test_a_claim_takes_at_most_its_limit(queue: Queue) -> None:
    await queue.add("d", 5, T)
    assert len(await claim(queue, limit=3)) == 3
    assert len(await claim(queue, limit=3)) == 2
    assert await claim(queue, limit=3) == []


async def test_a_limited_claim_takes_no_more_than_its_fewest_stocked_bucket(queue: Queue) -> None:
    await queue.add("d", 5, T)
    # Buckets slow enough that no real clock refills a token between the claims.
    slow = [("k-a", 0.001, 3.0, 0.0), ("k-b", 0.001, 5.0, 1.0)]  # b: 4 beyond its reserve
    request = ClaimRequest("d", 10, owner="A", now=T, lease_until=T + LEASE)
    claimed, left = await queue.deliveries.claim_limited(request, slow)
    assert len(claimed) == 3
    assert 0.0 <= left < 0.01  # a's last token went with the third
    again, left = await queue.deliveries.claim_limited(request, slow)
    assert again == []
    assert left < 1.0


async def test_a_leased_delivery_is_not_claimed_again_until_its_lease_lapses(queue: Queue) -> None:
    [pk] = await queue.add("d", 1, T)
    [first] = await claim(queue, owner="A", lease_until=T + LEASE)
    assert await claim(queue, owner="B", now=T + LEASE - 1) == []
    [again] = await claim(queue, owner="B", now=T + LEASE)
    assert (first.delivery_id, again.delivery_id) == (pk, pk)
    assert again.lease_token == first.lease_token + 1  # the new lease fences the old


async def test_a_claim_reaching_ahead_never_takes_a_live_lease(queue: Queue) -> None:
    [held] = await queue.add("d", 1, T)
    await claim(queue, owner="A", lease_until=T + LEASE)
    [later] = await queue.add("d", 1, T + 5)
    probe = await claim(queue, owner="B", now=T + 1, due_by=float("inf"))
    assert ids(probe) == [later]
    again = await claim(queue, owner="C", now=T + LEASE, due_by=float("inf"))
    assert ids(again) == [held]


async def test_concurrent_claims_never_share_a_delivery(queue: Queue) -> None:
    await queue.add("d", 30, T)
    rounds = await asyncio.gather(*(claim(queue, limit=4, owner=f"w{i}") for i in range(12)))
    taken = [pk for claimed in rounds for pk in ids(claimed)]
    assert len(taken) == 30
    assert len(set(taken)) == 30


async def test_a_claim_leaves_alone_leases_that_lapsed_at_or_after_lapsed_before(
    queue: Queue,
) -> None:
    # After a database outage a daemon claims only leases that lapsed before it began:
    # those that lapsed during it belong to a holder that renews them once it can.
    early, late = await queue.add("d", 2, T)
    await claim(queue, limit=1, owner="A", lease_until=T + 10)
    await claim(queue, limit=1, owner="A", lease_until=T + 30)
    after = await claim(queue, owner="B", now=T + 40, lapsed_before=T + 20)
    assert ids(after) == [early]
    assert ids(await claim(queue, owner="B", now=T + 40)) == [late]


# -- renew ------------------------------------------------------------------------------------


async def test_a_renewal_keeps_held_leases_lapsed_or_not_and_names_those_taken(
    queue: Queue,
) -> None:
    await queue.add("d", 3, T)
    taken, lapsed, held = await claim(queue, limit=3, owner="A", lease_until=T + 10)
    # All three lapse; B takes the oldest. A renews the three later still: it keeps the
    # two no claim took meanwhile, and learns it lost the first.
    [again] = await claim(queue, limit=1, owner="B", now=T + 15, lease_until=T + 75)
    assert again.delivery_id == taken.delivery_id
    leases = [(c.delivery_id, c.lease_token) for c in (taken, lapsed, held)]
    assert await queue.deliveries.renew(leases, T + 80) == [taken.delivery_id]
    assert await claim(queue, owner="C", now=T + 70) == []
    assert await queue.deliveries.next_due("d") == T + 75  # B's lease is untouched
    # Outcomes under the renewed leases still apply.
    done = [outcome(c, DeliveryStatus.DELIVERED, at=T + 20) for c in (lapsed, held)]
    assert await queue.deliveries.record(done, []) == 0


async def test_a_renewal_names_a_finished_delivery(queue: Queue) -> None:
    await queue.add("d", 1, T)
    [c] = await claim(queue)
    assert await queue.deliveries.record([outcome(c, DeliveryStatus.DELIVERED, at=T)], []) == 0
    assert await queue.deliveries.renew([(c.delivery_id, c.lease_token)], T + 100) == [
        c.delivery_id
    ]
    assert await queue.deliveries.next_due("d") is None


# -- record -----------------------------------------------------------------------------------


async def test_a_delivered_outcome_finishes_the_delivery(queue: Queue) -> None:
    await queue.add("d", 1, T)
    [c] = await claim(queue)
    assert await queue.deliveries.record([outcome(c, DeliveryStatus.DELIVERED, at=T)], []) == 0
    assert await claim(queue, now=T + 10 * LEASE, due_by=float("inf")) == []
    assert await queue.deliveries.next_due("d") is None


async def test_a_retry_is_due_at_its_time_and_carries_its_history(queue: Queue) -> None:
    await queue.add("d", 1, T)
    [c] = await claim(queue)
    failed = frozenset({"https://b.example/hook"})
    retry = outcome(c, DeliveryStatus.PENDING, at=T + 1, next_at=T + 30, failed=failed)
    assert await queue.deliveries.record([retry], [attempt(c, T + 1)]) == 0
    assert await queue.deliveries.next_due("d") == T + 30
    assert await claim(queue, now=T + 29) == []
    [again] = await claim(queue, now=T + 30)
    assert (again.attempts, again.first_attempt_at, again.failed_hooks) == (1, T + 1, failed)


async def test_an_outcome_under_a_lapsed_lease_is_stale_and_changes_nothing(queue: Queue) -> None:
    await queue.add("d", 1, T)
    [old] = await claim(queue, owner="A", lease_until=T + LEASE)
    [new] = await claim(queue, owner="B", now=T + LEASE, lease_until=T + 2 * LEASE)
    stale = outcome(old, DeliveryStatus.DELIVERED, at=T + LEASE + 1)
    assert await queue.deliveries.record([stale], [attempt(old, T + LEASE + 1)]) == 1
    # B's lease stands: the delivery is still pending and B's outcome applies.
    assert await queue.deliveries.next_due("d") == T + 2 * LEASE
    current = outcome(new, DeliveryStatus.DELIVERED, at=T + LEASE + 2)
    assert await queue.deliveries.record([current], []) == 0
    assert await queue.deliveries.next_due("d") is None


async def test_an_outcome_for_a_finished_delivery_is_stale(queue: Queue) -> None:
    await queue.add("d", 1, T)
    [c] = await claim(queue)
    assert await queue.deliveries.record([outcome(c, DeliveryStatus.FAILED, at=T)], []) == 0
    again = outcome(c, DeliveryStatus.DELIVERED, at=T + 1)
    assert await queue.deliveries.record([again], []) == 1


# -- release ----------------------------------------------------------------------------------


async def test_a_release_makes_the_delivery_due_at_once(queue: Queue) -> None:
    await queue.add("d", 1, T)
    [c] = await claim(queue, lease_until=T + LEASE)
    await queue.deliveries.release([(c.delivery_id, c.lease_token)], T + 1)
    assert await queue.deliveries.next_due("d") == T + 1
    [again] = await claim(queue, now=T + 1)
    assert again.delivery_id == c.delivery_id


async def test_a_release_with_an_old_token_changes_nothing(queue: Queue) -> None:
    await queue.add("d", 1, T)
    [old] = await claim(queue, owner="A", lease_until=T + LEASE)
    await claim(queue, owner="B", now=T + LEASE, lease_until=T + 2 * LEASE)
    await queue.deliveries.release([(old.delivery_id, old.lease_token)], T + LEASE + 1)
    assert await queue.deliveries.next_due("d") == T + 2 * LEASE
    assert await claim(queue, owner="C", now=T + LEASE + 1) == []


# -- wake, expire, next_due -------------------------------------------------------------------


async def test_wake_makes_waiting_deliveries_due_unless_the_hook_failed_for_them(
    queue: Queue,
) -> None:
    hook = "https://a.example/hook"
    await queue.add("d", 3, T)
    a, b, c = await claim(queue, limit=3)
    for claimed, failed, due in ((a, frozenset(), 100), (b, {hook}, 101), (c, frozenset(), 102)):
        retry = outcome(
            claimed, DeliveryStatus.PENDING, at=T, next_at=T + due, failed=frozenset(failed)
        )
        assert await queue.deliveries.record([retry], []) == 0
    assert ids(await claim(queue, now=T + 100, limit=1)) == [a.delivery_id]  # leased now
    assert await queue.deliveries.wake("other", [hook], T + 1) == 0
    assert await queue.deliveries.wake("d", [hook], T + 1) == 1
    assert ids(await claim(queue, now=T + 1)) == [c.delivery_id]


async def test_expire_counts_the_window_from_the_first_attempt_else_creation(
    queue: Queue,
) -> None:
    [tried] = await queue.add("d", 1, T - 1)
    await queue.add("d", 1, T)  # never tried
    [c] = await claim(queue, now=T + 50, limit=1)
    assert c.delivery_id == tried
    retry = outcome(c, DeliveryStatus.PENDING, at=T + 50, next_at=T + 500)
    assert await queue.deliveries.record([retry], []) == 0
    assert await queue.deliveries.expire_waiting("d", 100, T + 99) == 0
    assert await queue.deliveries.expire_waiting("other", 100, T + 110) == 0
    assert await queue.deliveries.expire_waiting("d", 100, T + 110) == 1  # the untried one
    assert await queue.deliveries.next_due("d") == T + 500
    assert await queue.deliveries.expire_waiting("d", 100, T + 150) == 1  # the tried one
    assert await queue.deliveries.next_due("d") is None
    assert await claim(queue, now=T + 1000, due_by=float("inf")) == []


async def test_expire_leaves_leased_deliveries(queue: Queue) -> None:
    await queue.add("d", 1, T)
    await claim(queue, lease_until=T + 1000)
    assert await queue.deliveries.expire_waiting("d", 10, T + 500) == 0
    assert await queue.deliveries.next_due("d") == T + 1000


async def test_next_due_is_the_earliest_pending_time_of_the_destination(queue: Queue) -> None:
    assert await queue.deliveries.next_due("d") is None
    await queue.add("d", 1, T + 20)
    await queue.add("d", 1, T + 10)
    await queue.add("other", 1, T)
    assert await queue.deliveries.next_due("d") == T + 10


# -- lanes (an ordered destination) ------------------------------------------------------------


async def claim_o(q: Queue, now: float = T) -> list[Claimed]:
    return await q.deliveries.claim(
        ClaimRequest("o", 10, owner="A", now=now, lease_until=now + LEASE)
    )


async def test_only_the_head_of_each_lane_is_claimed(queue: Queue) -> None:
    a = await queue.add_lane("a", 3, T)
    b = await queue.add_lane("b", 2, T)
    assert ids(await claim_o(queue)) == [a[0], b[0]]
    assert await claim_o(queue, now=T + 1) == []  # the heads are leased, the rest wait


async def test_a_heads_outcome_makes_the_next_of_its_lane_due(queue: Queue) -> None:
    _, second, third = await queue.add_lane("a", 3, T)
    [head] = await claim_o(queue)
    assert await queue.deliveries.record([outcome(head, DeliveryStatus.DELIVERED, at=T)], []) == 0
    [head] = await claim_o(queue, now=T + 1)
    assert head.delivery_id == second
    assert await queue.deliveries.record([outcome(head, DeliveryStatus.FAILED, at=T + 1)], []) == 0
    assert ids(await claim_o(queue, now=T + 2)) == [third]


async def test_a_retrying_head_holds_only_its_own_lane(queue: Queue) -> None:
    bad = await queue.add_lane("bad", 2, T)
    good = await queue.add_lane("good", 2, T)
    heads = await claim_o(queue)
    await queue.deliveries.record(
        [
            outcome(h, DeliveryStatus.PENDING, at=T + 1, next_at=T + 2)
            if h.delivery_id == bad[0]
            else outcome(h, DeliveryStatus.DELIVERED, at=T + 1)
            for h in heads
        ],
        [],
    )
    assert ids(await claim_o(queue, now=T + 2)) == [bad[0], good[1]]


async def test_a_stale_outcome_hands_no_lane_on(queue: Queue) -> None:
    first, second = await queue.add_lane("a", 2, T)
    [old] = await claim_o(queue)
    [new] = await claim_o(queue, now=T + LEASE)  # the lease lapsed: claimed again
    assert await queue.deliveries.record([outcome(old, DeliveryStatus.DELIVERED, at=T)], []) == 1
    assert await claim_o(queue, now=T + LEASE) == []
    await queue.deliveries.record([outcome(new, DeliveryStatus.DELIVERED, at=T + LEASE)], [])
    assert ids(await claim_o(queue, now=T + LEASE)) == [second]
    assert new.delivery_id == first


async def test_waiting_deliveries_expire_from_their_creation_and_the_lane_moves_on(
    queue: Queue,
) -> None:
    await queue.add_lane("a", 2, T - 100)
    [late] = await queue.add_lane("a", 1, T)
    assert await queue.deliveries.expire_waiting("o", 50.0, T) == 2  # the head and one waiting
    assert ids(await claim_o(queue)) == [late]


# -- deliveries handed over at ingestion (efd/delivery/handoff.py) ----------------------------


def room(**free: int) -> Grant:
    r = Room("A", LEASE)
    for destination, count in free.items():
        r.offer(destination, count)
    return r.grant()


async def test_deliveries_handed_over_at_ingestion_are_leased_as_a_claim_leaves_them(
    queue: Queue,
) -> None:
    grant = room(d=2)
    stored = await queue.ingest("d", 3, T, grant)
    assert ids(grant.claimed) == stored[:2]
    assert [c.lease_token for c in grant.claimed] == [1, 1]
    assert grant.lease_until == T + LEASE
    assert grant.left_pending  # the third waits for a claim
    first = grant.claimed[0]
    assert (first.attempts, first.first_attempt_at, first.failed_hooks) == (0, None, frozenset())
    assert first.body == '{"type":"track"}'
    # Another process's claim finds only the third; the two are under a live lease.
    assert ids(await claim(queue, owner="B", now=T + 1)) == [stored[2]]
    # Their outcome applies under the handed-over token; the other's lease lapses.
    done = outcome(first, DeliveryStatus.DELIVERED, at=T + 2)
    assert await queue.deliveries.record([done], []) == 0
    late = await claim(queue, owner="B", now=T + LEASE + 0.5)
    assert ids(late) == [stored[1]]
    assert late[0].lease_token == 2  # fenced: the first holder's outcome is stale now
    stale = outcome(grant.claimed[1], DeliveryStatus.DELIVERED, at=T + LEASE + 2)
    assert await queue.deliveries.record([stale], []) == 1


async def test_an_insert_takes_no_more_than_the_room_and_leaves_nothing_pending_when_all_fit(
    queue: Queue,
) -> None:
    grant = room(d=5, other=3)
    stored = await queue.ingest("d", 4, T, grant)
    assert ids(grant.claimed) == stored
    assert not grant.left_pending
    assert await claim(queue, now=T + 1) == []
    grant = room(other=3)  # nothing offered for "d"
    stored = await queue.ingest("d", 2, T, grant)
    assert (grant.claimed, grant.left_pending) == ([], True)
    assert ids(await claim(queue, now=T + 1)) == stored


async def test_deliveries_of_an_ordered_destination_are_never_handed_over(queue: Queue) -> None:
    grant = room(o=5)
    await queue.ingest("o", 3, T, grant)
    assert grant.claimed == []
    assert grant.left_pending
    assert len(await claim_o(queue, now=T + 1)) == 1  # the lane's head, by a claim
