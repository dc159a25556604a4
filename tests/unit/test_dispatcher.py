"""The dispatcher's rules, against an in-memory twin of the delivery store and a fake
sender: capacity per hook, claiming ahead, one slow receiver never starving another,
wake-ups on new work and on due retries, and what a stop gives back. No database, no
network, and virtual time (tests/unit/clocks.py): each test takes milliseconds, whatever
the seconds it lets pass, and what must not happen by a moment is checked at that moment.
The real store and real receivers are tests/integration/test_delivery.py's."""

from __future__ import annotations

import asyncio
from collections import Counter
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from contextlib import AsyncExitStack
from dataclasses import dataclass, field
from typing import Any, Protocol

import pytest

from efd import config
from efd.delivery import dispatcher, recorder
from efd.delivery.dispatcher import Dispatcher
from efd.delivery.retry import AttemptResult, Verdict
from efd.errors import StoreError
from efd.observe.metrics import Metrics
from efd.observe.tracing import RoundTrace
from efd.records import AttemptRow, DeliveryStatus, Outcome
from efd.segment import webhooks
from efd.segment.webhooks import Route, webhook_id
from efd.settings import Current
from tests.support.memory import MemoryDeliveries
from tests.unit.clocks import VirtualClock, advance, virtual_loop

pytestmark = pytest.mark.virtual_time

HOOK_A, HOOK_B = "https://a.example/hook", "https://b.example/hook"
HOOK_O = "https://o.example/hook"  # destination "o" is ordered per user
_STATUS = {Verdict.SUCCESS: 200, Verdict.RETRY: 503, Verdict.FAIL: 400}


@dataclass
class FakeRounds:
    """The dispatcher's `Rounds`: answers each URL with `verdicts[url]` (default success);
    rounds to URLs in `held` wait until released. Counts concurrency per URL."""

    verdicts: dict[str, Verdict] = field(default_factory=dict)
    # webhook-ids answered with a retry whatever the URL (a message the receiver refuses)
    refused: set[str] = field(default_factory=set)
    held: set[str] = field(default_factory=set)
    in_flight: Counter[str] = field(default_factory=Counter)
    most_in_flight: Counter[str] = field(default_factory=Counter)
    sent: Counter[str] = field(default_factory=Counter)
    completed: int = 0  # rounds answered
    webhook_ids: list[str] = field(default_factory=list)  # each round's, in order
    targets: list[str | None] = field(default_factory=list)  # each round's own URL, in order
    started: asyncio.Event = field(default_factory=asyncio.Event)
    gate: asyncio.Event = field(default_factory=asyncio.Event)
    clock: VirtualClock | None = None  # the dispatcher's: an attempt's start is read on it

    def start_round(
        self,
        route: Route,
        urls: Sequence[str],
        body: str,
        message: webhooks.MessageKey,
        url: str | None = None,
        trace: RoundTrace | None = None,
    ) -> asyncio.Future[list[AttemptResult]]:
        self.targets.append(url)
        return asyncio.ensure_future(
            self.send_round(route, urls, body, webhooks.webhook_id(*message))
        )

    async def send_round(
        self, route: Route, urls: Sequence[str], body: str, webhook_id: str
    ) -> list[AttemptResult]:
        self.webhook_ids.append(webhook_id)
        for url in urls:
            self.in_flight[url] += 1
            self.most_in_flight[url] = max(self.most_in_flight[url], self.in_flight[url])
            self.sent[url] += 1
        self.started.set()
        try:
            if self.held & set(urls):
                await self.gate.wait()
            assert self.clock is not None
            now = self.clock.now()
            refused = webhook_id in self.refused
            return [
                AttemptResult(url, now, 0.001, verdict, _STATUS[verdict])
                for url in urls
                for verdict in [
                    Verdict.RETRY if refused else self.verdicts.get(url, Verdict.SUCCESS)
                ]
            ]
        finally:
            self.completed += 1
            for url in urls:
                self.in_flight[url] -= 1


# Two hooks of one destination that differ only in their credentials and query value.
SECRET_1 = "https://user:pw-one@c.example/hook?token=t0k3n-one"
SECRET_2 = "https://user:pw-two@c.example/hook?token=t0k3n-two"
LABEL_1, LABEL_2 = "https://***@c.example/hook?token=***", "https://***@c.example/hook?token=*** #2"


def settings(**delivery: Any) -> config.Settings:
    return config.load(
        None,
        delivery={"retry_initial_seconds": 0.01, "retry_max_seconds": 0.02, **delivery},
        destinations=[
            {"name": "a", "hooks": [{"url": HOOK_A}]},
            {"name": "b", "hooks": [{"url": HOOK_B}]},
            {"name": "c", "hooks": [{"url": SECRET_1}, {"url": SECRET_2}]},
            {"name": "o", "hooks": [{"url": HOOK_O}], "ordering": "per_user"},
        ],
    )


class Start(Protocol):
    """The `running` fixture: a started dispatcher on `store` and `rounds`, on `clock`
    (by default one that starts at the store's clock)."""

    async def __call__(
        self,
        store: MemoryDeliveries,
        rounds: FakeRounds,
        metrics: Metrics | None = None,
        clock: VirtualClock | None = None,
        holder: Current[config.Settings] | None = None,
        **delivery: Any,
    ) -> Dispatcher: ...


@pytest.fixture
async def running() -> AsyncIterator[Start]:
    started: list[Dispatcher] = []

    async def start(
        store: MemoryDeliveries,
        rounds: FakeRounds,
        metrics: Metrics | None = None,
        clock: VirtualClock | None = None,
        holder: Current[config.Settings] | None = None,
        **delivery: Any,
    ) -> Dispatcher:
        clock = clock or VirtualClock(start=store.clock)
        rounds.clock = clock
        d = Dispatcher(
            deliveries=store,
            rounds=rounds,
            settings=holder or Current(settings(**delivery)),
            metrics=metrics or Metrics(),
            owner="test",
            clock=clock,
        )
        await d.start(stack)
        started.append(d)
        return d

    async with AsyncExitStack() as stack:
        yield start
        for d in started:
            await d.stop(grace=0.1)  # before the stack's stop, which gives a round's timeout


async def test_a_claimed_deliverys_own_url_goes_to_its_round_and_the_hook_names_it(
    running: Start,
) -> None:
    store, rounds = MemoryDeliveries(), FakeRounds()
    [first, _] = store.add("a", 2)
    store.rows[first].url = "http://a.example/users/u%201?ref=o-17"
    await running(store, rounds)
    await store.wait(lambda: store.status("a")["delivered"] == 2)
    assert sorted(rounds.targets, key=str) == [None, "http://a.example/users/u%201?ref=o-17"]
    assert {row.hook_url for row in store.attempts} == {HOOK_A}
    assert rounds.sent == {HOOK_A: 2}


async def test_every_due_delivery_is_delivered_once(running: Start) -> None:
    store, rounds = MemoryDeliveries(), FakeRounds()
    store.add("a", 300)
    store.add("b", 200)
    await running(store, rounds)
    await store.wait(lambda: store.status() == {"delivered": 500})
    assert rounds.sent == {HOOK_A: 300, HOOK_B: 200}
    assert len(store.attempts) == 500


async def test_a_delivery_whose_payload_was_purged_sends_nothing_and_says_why(
    running: Start,
) -> None:
    store, rounds = MemoryDeliveries(), FakeRounds()
    [purged, kept] = store.add("a", 2)
    store.rows[purged].purged = True
    await running(store, rounds)
    await store.wait(lambda: store.rows[purged].last_error is not None)
    await store.wait(lambda: store.status("a")["delivered"] == 1)
    assert rounds.webhook_ids == [webhook_id(kept, "web", f"m{kept}", 1_700_000_000.0 + kept)]
    assert [a.delivery_id for a in store.attempts] == [kept]
    row = store.rows[purged]
    assert row.last_error == "message payload was purged by a deletion request"
    assert row.attempts == 0  # no request went out


async def test_a_hook_never_has_more_than_max_per_hook_rounds_and_claims_stay_bounded(
    running: Start,
) -> None:
    rounds = FakeRounds(held={HOOK_A})
    store = MemoryDeliveries(rounds=rounds)
    store.add("a", 200)
    # Its time stands still while it is busy: no rate is ever counted, so it holds the floor
    # (efd/delivery/ahead.py).
    await running(store, rounds, max_per_hook=3)
    await rounds.started.wait()
    rounds.gate.set()  # let them all through, 3 at a time
    await store.wait(lambda: store.status("a") == {"delivered": 200})
    assert rounds.most_in_flight[HOOK_A] == 3
    # Claimed ahead: what is in flight plus at most 4 x max_per_hook held ready.
    assert store.most_held["a"] == 3 + 4 * 3


async def test_a_stuck_receiver_does_not_hold_up_another_destination(running: Start) -> None:
    store, rounds = MemoryDeliveries(), FakeRounds(held={HOOK_A})
    store.add("a", 100)
    store.add("b", 100)
    await running(store, rounds, max_per_hook=4)
    await store.wait(lambda: store.status("b") == {"delivered": 100})
    assert store.status("a") == {"pending": 100}  # held at the receiver, none lost
    assert rounds.in_flight[HOOK_A] == 4


async def test_the_dispatcher_keeps_the_time_of_its_clock(running: Start) -> None:
    # A minute of its clock passes without a minute passing: the delivery due in a minute
    # is sent when that clock says so.
    clock = VirtualClock(start=MemoryDeliveries().clock)
    store, rounds = MemoryDeliveries(), FakeRounds()
    [pk] = store.add("a", 1, due_in=60)
    await running(store, rounds, clock=clock)
    await asyncio.wait_for(rounds.started.wait(), timeout=90)
    assert store.clock + 60 <= clock.time < store.clock + 60 + 0.01  # when due, not a poll later
    await store.wait(lambda: store.status("a") == {"delivered": 1})
    assert store.rows[pk].attempts == 1
    assert max(clock.waits) <= dispatcher._IDLE_POLL  # it looked again at least every poll


async def test_new_work_wakes_an_idle_dispatcher_at_once(
    running: Start, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Without the wake-up the dispatcher would next look in an hour.
    monkeypatch.setattr(dispatcher, "_IDLE_POLL", 3600.0)
    store, rounds = MemoryDeliveries(), FakeRounds()
    d = await running(store, rounds)
    await store.asked_due.wait()  # it found nothing to claim and went idle
    store.add("a", 1)
    d.notify()
    woken = virtual_loop().time()
    await store.wait(lambda: rounds.sent[HOOK_A] == 1)
    assert virtual_loop().time() - woken < 0.1  # not at the next poll
    await store.wait(lambda: store.status("a") == {"delivered": 1})


async def test_a_retry_runs_when_due_without_a_wake_up(
    running: Start, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(dispatcher, "_IDLE_POLL", 3600.0)
    store, rounds = MemoryDeliveries(), FakeRounds(verdicts={HOOK_A: Verdict.RETRY})
    store.add("a", 1)
    await running(store, rounds)
    await store.wait(lambda: rounds.sent[HOOK_A] >= 1 and store.rows[1].attempts == 1)
    rounds.verdicts.clear()  # the receiver is back; the retry is due within 20 ms
    await store.wait(lambda: store.status("a") == {"delivered": 1})
    assert store.rows[1].attempts >= 2


async def test_every_round_of_a_delivery_goes_under_its_message_s_webhook_id(
    running: Start,
) -> None:
    store, rounds = MemoryDeliveries(), FakeRounds(verdicts={HOOK_A: Verdict.RETRY})
    store.add("a", 2)
    await running(store, rounds)
    await store.wait(lambda: all(r.attempts >= 2 for r in store.rows.values()))
    rounds.verdicts.clear()
    await store.wait(lambda: store.status("a") == {"delivered": 2})
    # The twin's rows: message pk = delivery id, source "web", messageId m<id>.
    expected = {pk: webhook_id(pk, "web", f"m{pk}", 1_700_000_000.0 + pk) for pk in (1, 2)}
    assert set(rounds.webhook_ids) == set(expected.values())
    assert Counter(rounds.webhook_ids) == {expected[pk]: r.attempts for pk, r in store.rows.items()}


async def test_a_failed_hook_is_final_and_the_delivery_fails(running: Start) -> None:
    store, rounds = MemoryDeliveries(), FakeRounds(verdicts={HOOK_A: Verdict.FAIL})
    store.add("a", 5)
    await running(store, rounds)
    await store.wait(lambda: store.status("a") == {"failed": 5})
    assert rounds.sent[HOOK_A] == 5  # never retried


async def test_stop_gives_back_what_was_claimed_but_not_sent(running: Start) -> None:
    store, rounds = MemoryDeliveries(), FakeRounds(held={HOOK_A})
    store.add("a", 50)
    d = await running(store, rounds, max_per_hook=2)
    await rounds.started.wait()
    await store.wait(lambda: store.most_leased["a"] > 2)  # some were claimed ahead
    await d.stop(grace=0.05)  # the 2 in flight are cut short too
    assert {pk for pk, _ in store.released} == {pk for pk, r in store.rows.items() if r.token}
    assert not any(r.leased for r in store.rows.values())  # all due again at once
    assert store.status("a") == {"pending": 50}  # none lost


async def test_an_outcome_after_the_lease_moved_on_is_counted_stale(running: Start) -> None:
    store, rounds, metrics = MemoryDeliveries(), FakeRounds(held={HOOK_A}), Metrics()
    store.add("a", 1)
    await running(store, rounds, metrics)
    await rounds.started.wait()
    store.rows[1].token += 1  # another process claimed it meanwhile
    rounds.gate.set()
    await store.wait(lambda: len(store.attempts) == 1)
    assert metrics.stale_outcomes == 1
    assert store.status("a") == {"pending": 1}  # the newer claim decides


async def test_a_saturated_destination_does_not_spin_the_dispatcher(running: Start) -> None:
    """Due deliveries but no free slot: the loop waits for a slot (or the idle poll), it
    does not ask the store again and again. Shown by turns of the event loop, not by time:
    a spinning loop would claim on each."""
    store, rounds = MemoryDeliveries(), FakeRounds(held={HOOK_A})
    store.add("a", 50)
    await running(store, rounds, max_per_hook=1)
    await rounds.started.wait()
    for _ in range(5):
        await asyncio.sleep(0)  # let the claim round that started the round finish
    before = Counter(store.calls)
    for _ in range(1000):
        await asyncio.sleep(0)
    assert store.calls == before
    assert rounds.in_flight[HOOK_A] == 1


async def test_an_idle_dispatcher_does_not_ask_the_store_again_and_again(running: Start) -> None:
    """Nothing due anywhere: after looking once, the loop waits for new work, a due retry
    or the idle poll. (It used to wake itself after every empty claim: 270 claims a
    second, a third of a core, doing nothing.)"""
    store, rounds = MemoryDeliveries(), FakeRounds()
    await running(store, rounds)
    await store.asked_due.wait()
    before = Counter(store.calls)
    for _ in range(1000):
        await asyncio.sleep(0)
    assert store.calls == before


async def test_an_open_circuit_gets_probes_only_and_its_closing_makes_the_backlog_due(
    running: Start,
) -> None:
    store, rounds = MemoryDeliveries(), FakeRounds(verdicts={HOOK_A: Verdict.RETRY})
    store.add("a", 5)
    metrics = Metrics()
    await running(
        store,
        rounds,
        metrics,
        circuit_failures=2,
        circuit_probe_seconds=0.05,
        # Backoffs far beyond the test: only probes (taken even before a delivery is due)
        # and the closing circuit can get these deliveries out.
        retry_initial_seconds=600,
        retry_max_seconds=600,
    )
    await store.wait(lambda: rounds.sent[HOOK_A] >= 5 + 2)  # the first rounds, two probes
    assert metrics.circuit_open[("a", HOOK_A)] == 1
    assert store.status("a") == {"pending": 5}
    rounds.verdicts.clear()  # back: the next probe succeeds and the rest are due at once
    await store.wait(lambda: store.status("a") == {"delivered": 5})
    assert metrics.circuit_open[("a", HOOK_A)] == 0


async def test_hooks_are_stored_by_label_and_rows_naming_them_by_url_still_count(
    running: Start,
) -> None:
    """failed_hooks, last_error and the attempt rows name hooks by label, never by URL; a
    delivery whose failed_hooks was written before, with the raw URL, skips that hook."""
    store = MemoryDeliveries()
    rounds = FakeRounds(verdicts={SECRET_1: Verdict.RETRY, SECRET_2: Verdict.FAIL})
    old, new = store.add("c", 2)
    store.rows[old].failed_hooks = frozenset({SECRET_1})
    metrics = Metrics()
    await running(
        store, rounds, metrics, circuit_failures=1, retry_initial_seconds=600, retry_max_seconds=600
    )
    await store.wait(lambda: store.status("c") == {"failed": 1, "pending": 1})
    assert store.rows[old].status is DeliveryStatus.FAILED  # never sent to the first hook
    assert store.rows[old].failed_hooks == frozenset({LABEL_1, LABEL_2})
    assert store.rows[new].status is DeliveryStatus.PENDING  # the first hook may still take it
    assert store.rows[new].failed_hooks == frozenset({LABEL_2})
    assert rounds.sent == {SECRET_1: 1, SECRET_2: 2}
    assert sorted(a.hook_url for a in store.attempts) == [LABEL_1, LABEL_2, LABEL_2]
    assert metrics.circuit_open == {("c", LABEL_1): 1}


async def test_a_destination_removed_by_a_reload_with_rounds_in_flight(running: Start) -> None:
    rounds = FakeRounds(held={HOOK_A})
    store = MemoryDeliveries(rounds=rounds)
    store.add("a", 20)
    holder = Current(settings(max_per_hook=2))
    d = await running(store, rounds, holder=holder)
    await rounds.started.wait()
    while rounds.in_flight[HOOK_A] < 2:  # two rounds at the receiver, held there
        await advance(0.001)
    remaining = config.load(None, destinations=[{"name": "b", "hooks": [{"url": HOOK_B}]}])
    await holder.replace(remaining)
    rounds.gate.set()  # the rounds in flight finish after the destination is gone
    await store.wait(lambda: store.status("a") == {"delivered": 2, "pending": 18})
    # The loop goes on: another destination's work is still delivered.
    store.add("b", 5)
    d.notify()
    await store.wait(lambda: store.status("b") == {"delivered": 5})
    assert not any(r.leased for r in store.rows.values())  # nothing of "a" held back
    assert d.running


def with_actions(*names: str) -> config.Settings:
    """An actions destination "crm" whose actions each send to their own hook."""
    urls = {"x": HOOK_A, "y": HOOK_B}
    actions = [{"name": n, "trigger": 'type = "track"', "url": urls[n]} for n in names]
    return config.load(
        None,
        delivery={"retry_initial_seconds": 0.01, "retry_max_seconds": 0.02},
        destinations=[{"name": "crm", "type": "actions", "actions": actions}],
    )


async def test_each_action_is_a_route_and_one_removed_by_a_reload_is_left_pending(
    running: Start,
) -> None:
    rounds = FakeRounds()
    store = MemoryDeliveries(rounds=rounds)
    holder = Current(with_actions("x", "y"))
    d = await running(store, rounds, holder=holder)
    await holder.replace(with_actions("x"))
    store.add("crm/x", 3)
    store.add("crm/y", 4)
    d.notify()
    await store.wait(lambda: store.status("crm/x") == {"delivered": 3})
    await advance(1.0)
    # Its route left the configuration: as a removed destination's, never claimed.
    assert store.status("crm/y") == {"pending": 4}
    assert {a.hook_url for a in store.attempts} == {HOOK_A}
    await holder.replace(with_actions("x", "y"))
    d.notify()
    await store.wait(lambda: store.status("crm/y") == {"delivered": 4})


# The shortest lease the configuration allows over a round's timeout of 0.05 s (more than
# 5 s above it); well above the 2 s beyond the timeout a round needs left on it to start.
LEASE = 5.1


def short_lease(**delivery: Any) -> config.Settings:
    return settings(timeout_seconds=0.05, lease_seconds=LEASE, **delivery)


StartTwo = Callable[[MemoryDeliveries, FakeRounds], Awaitable[list[Dispatcher]]]


@pytest.fixture
async def two_processes() -> AsyncIterator[StartTwo]:
    """Two dispatchers (two daemons) on one store and one set of receivers, one clock."""
    started: list[Dispatcher] = []

    async def start(store: MemoryDeliveries, rounds: FakeRounds) -> list[Dispatcher]:
        rounds.clock = VirtualClock(start=store.clock)
        for owner in ("one", "two"):
            d = Dispatcher(
                deliveries=store,
                rounds=rounds,
                settings=Current(short_lease()),
                metrics=Metrics(),
                owner=owner,
                clock=rounds.clock,
            )
            await d.start(stack)
            started.append(d)
        return started

    async with AsyncExitStack() as stack:
        yield start
        for d in started:
            await d.stop(grace=0.1)


async def test_outcomes_written_later_than_the_lease_are_not_sent_again(
    two_processes: StartTwo,
) -> None:
    """Outcome writes stall for twice the lease while the database answers everything
    else: the leases are renewed meanwhile, so neither process claims those deliveries
    again and no receiver gets a message twice."""
    stalled = asyncio.Event()
    store, rounds = MemoryDeliveries(slow_outcomes=stalled), FakeRounds()
    store.add("a", 20)
    await two_processes(store, rounds)
    try:
        async with asyncio.timeout(30):
            while rounds.completed < 20:  # answered; their outcomes wait
                await advance(0.01)
        await advance(2 * LEASE)
    finally:
        stalled.set()
    await store.wait(lambda: store.status("a") == {"delivered": 20})
    assert rounds.sent[HOOK_A] == 20
    assert set(Counter(rounds.webhook_ids).values()) == {1}


async def test_outcomes_held_up_by_a_database_outage_are_not_sent_again(
    two_processes: StartTwo,
) -> None:
    """The database stops after the rounds were sent and stays down until their leases
    lapsed. When it is back, new work wakes the other process at once: it leaves the
    lapsed leases to their holder, which renews them first, so no receiver gets a
    message twice."""
    store, rounds = MemoryDeliveries(), FakeRounds(held={HOOK_A})
    store.add("a", 20)
    processes = await two_processes(store, rounds)
    await rounds.started.wait()
    await advance(0.05)  # the first claim took all 20; the rounds wait
    store.down = True
    rounds.gate.set()  # answered, but their outcomes cannot be written
    await advance(LEASE + 0.3)  # every lease lapses
    store.down = False
    claims, back = store.calls["claim"], virtual_loop().time()
    for d in processes:
        d.notify()
    await store.wait(lambda: store.status("a") == {"delivered": 20})
    # A second sending starts at the latest at a process's next look (its idle poll), the
    # holder's next renewal or once half a lease has passed since the store was back.
    await advance(LEASE)
    assert rounds.sent[HOOK_A] == 20
    assert set(Counter(rounds.webhook_ids).values()) == {1}
    # Meanwhile the lapsed leases held back from claims did not make either process claim
    # again at once, over and over: each looked once a poll, a claim per destination.
    looks = (virtual_loop().time() - back) / dispatcher._IDLE_POLL + 2
    assert store.calls["claim"] - claims <= len(processes) * len(settings().destinations) * looks


# -- ordered destinations ------------------------------------------------------------------


def _webhook_id(pk: int) -> str:
    return webhook_id(pk, "web", f"m{pk}", 1_700_000_000.0 + pk)  # as the twin claims it


async def test_a_lane_is_sent_in_order_each_head_handing_on_at_once(
    running: Start, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Without the wake-up after a head's outcome the next would wait for an hour's poll.
    monkeypatch.setattr(dispatcher, "_IDLE_POLL", 3600.0)
    store, rounds = MemoryDeliveries(), FakeRounds()
    lanes = {user: store.add("o", 5, lane=user) for user in ("u1", "u2", "u3")}
    await running(store, rounds)
    await store.wait(lambda: store.status("o") == {"delivered": 15})
    sent = [rounds.webhook_ids.index(_webhook_id(pk)) for pk in range(1, 16)]
    for ids in lanes.values():
        assert [sent[pk - 1] for pk in ids] == sorted(sent[pk - 1] for pk in ids)
    assert len(rounds.webhook_ids) == 15  # each once: only heads are ever claimed


async def test_a_refused_head_holds_only_its_own_lane(running: Start) -> None:
    store, rounds = MemoryDeliveries(), FakeRounds()
    bad = store.add("o", 4, lane="bad")
    good = {user: store.add("o", 4, lane=user) for user in ("g1", "g2")}
    rounds.refused = {_webhook_id(bad[0])}
    await running(store, rounds, retry_window_seconds=3600)
    await store.wait(
        lambda: all(store.rows[pk].status is DeliveryStatus.DELIVERED for ids in good.values()
                    for pk in ids)
    )  # fmt: skip
    await store.wait(lambda: rounds.webhook_ids.count(_webhook_id(bad[0])) >= 3)
    assert [store.rows[pk].status.value for pk in bad] == ["pending"] + ["queued"] * 3
    assert not {_webhook_id(pk) for pk in bad[1:]} & set(rounds.webhook_ids)


@dataclass
class RefusingDeliveries(MemoryDeliveries):
    """A store that refuses (as PostgreSQL does a row it cannot hold) any batch of outcomes
    containing one of `refused`; it takes every other batch."""

    refused: set[int] = field(default_factory=set)
    refusals: int = 0

    async def record(self, outcomes: Sequence[Outcome], attempts: Sequence[AttemptRow]) -> int:
        if any(o.delivery_id in self.refused for o in outcomes):
            self.refusals += 1
            raise StoreError("invalid byte sequence for encoding UTF8")
        return await super().record(outcomes, attempts)


async def test_an_outcome_the_store_refuses_holds_up_no_other_and_is_sent_again(
    running: Start,
) -> None:
    store, rounds = RefusingDeliveries(), FakeRounds()
    ids = store.add("a", 40)
    store.refused = {ids[7]}
    await running(store, rounds, holder=Current(short_lease()))
    await store.wait(lambda: store.status("a")["delivered"] == 39)
    assert store.refusals >= 2  # the batch, then the halves holding it, down to the one
    assert store.rows[ids[7]].status is DeliveryStatus.PENDING
    first = rounds.sent[HOOK_A]
    store.refused.clear()  # the store takes it now: once its lease lapsed, it goes again
    await store.wait(lambda: store.status("a") == {"delivered": 40})
    assert rounds.sent[HOOK_A] == first + 1


# -- deliveries handed over at ingestion (efd/delivery/handoff.py) ----------------------------


async def test_an_idle_dispatcher_takes_fresh_deliveries_without_claiming_them(
    running: Start, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(dispatcher, "_IDLE_POLL", 3600.0)
    store, rounds, metrics = MemoryDeliveries(), FakeRounds(), Metrics()
    clock = VirtualClock(start=store.clock)
    d = await running(store, rounds, metrics, clock=clock, max_per_hook=2)
    await store.asked_due.wait()  # idle: its last claims were short
    claims = store.calls["claim"]
    grant = d.room.grant()
    store.clock = clock.now()  # ingestion inserts at the dispatcher's time
    # In flight plus held ready: 2 + 4 x 2 for "a"; nothing for the ordered "o".
    store.ingest("a", 12, grant)
    assert len(grant.claimed) == 10
    assert grant.left_pending
    assert grant.take("o", 5) == 0
    d.hand_over(grant)  # it left 2 pending: a claim finds them
    assert metrics.handed_over["a"] == 10
    await store.wait(lambda: store.status("a") == {"delivered": 12})
    assert rounds.sent[HOOK_A] == 12  # each once
    assert rounds.most_in_flight[HOOK_A] <= 2
    assert store.calls["claim"] > claims


async def test_a_destination_with_older_deliveries_waiting_is_offered_no_slot(
    running: Start,
) -> None:
    rounds = FakeRounds(held={HOOK_A})
    store = MemoryDeliveries(rounds=rounds)
    clock = VirtualClock(start=store.clock)
    store.add("a", 50)
    d = await running(store, rounds, clock=clock, max_per_hook=2)
    await rounds.started.wait()
    await store.wait(lambda: store.most_leased["a"] == 10)  # its claims were full
    grant = d.room.grant()
    store.clock = clock.now()
    store.ingest("a", 3, grant)
    assert (grant.claimed, grant.left_pending) == ([], True)  # they queue behind the rest
    rounds.gate.set()
    await store.wait(lambda: store.status("a") == {"delivered": 53})


async def test_handed_over_deliveries_not_started_at_a_stop_are_given_back(running: Start) -> None:
    rounds = FakeRounds(held={HOOK_A})
    store = MemoryDeliveries(rounds=rounds)
    clock = VirtualClock(start=store.clock)
    d = await running(store, rounds, clock=clock, max_per_hook=2)
    await store.asked_due.wait()
    grant = d.room.grant()
    store.clock = clock.now()
    store.ingest("a", 6, grant)
    d.hand_over(grant)
    await rounds.started.wait()
    await d.stop(grace=0.05)
    handed = {c.delivery_id for c in grant.claimed}
    assert len(handed) == 6
    assert {pk for pk, _ in store.released} == handed
    assert not any(r.leased for r in store.rows.values())
    assert store.status("a") == {"pending": 6}


async def test_a_lane_moves_on_without_waiting_for_the_recorder_s_linger(
    running: Start, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A head's final outcome is written at once, whatever the recorder holds back.
    monkeypatch.setattr(dispatcher, "_IDLE_POLL", 3600.0)
    monkeypatch.setattr(recorder, "LINGER_SECONDS", 3600.0)
    store, rounds = MemoryDeliveries(), FakeRounds()
    store.add("o", 5, lane="u1")
    await running(store, rounds)
    await store.wait(lambda: store.status("o") == {"delivered": 5})


async def test_a_retry_due_while_its_outcome_lingers_is_claimed_once_written(
    running: Start, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The retry comes due before its outcome is in the store (the row still carries the
    # lease then, and a claim passes it by): the write itself makes the dispatcher look.
    monkeypatch.setattr(dispatcher, "_IDLE_POLL", 3600.0)
    monkeypatch.setattr(recorder, "LINGER_SECONDS", 0.2)  # ten times the retry's backoff
    store, rounds = MemoryDeliveries(), FakeRounds(verdicts={HOOK_A: Verdict.RETRY})
    store.add("a", 1)
    await running(store, rounds)
    await store.wait(lambda: store.rows[1].attempts == 1)
    rounds.verdicts.clear()
    await store.wait(lambda: store.status("a") == {"delivered": 1})
    assert store.rows[1].attempts == 2
