"""The delivery scheduler: claim due deliveries, POST them, record what happened.

A plain asyncio loop, not APScheduler: it wakes on new work (ingestion, or NOTIFY from
other processes), on the next due time, on a freed slot, or on stop. Claims are batched per
destination and sized to the free capacity of its hook URLs, so a slow receiver holds
only its own slots and never starves the others. Outcomes are written in batches.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import math
import random
from collections import Counter, deque
from collections.abc import Coroutine
from contextlib import AsyncExitStack
from typing import Any

from efd.config import Settings
from efd.delivery import pausing, ratelimit, reporting, retry
from efd.delivery.ahead import Ahead
from efd.delivery.circuit import Change, Circuits, tells_of_receiver
from efd.delivery.handoff import Grant, Room
from efd.delivery.leases import Leases
from efd.delivery.ports import Deliveries, Rounds
from efd.delivery.recorder import Recorded, Recorder
from efd.delivery.retry import AttemptResult, RetryPolicy, Verdict
from efd.delivery.rounds import attempt_rows, due_once_written, moves_lane_on, outcome_of
from efd.errors import StoreError
from efd.loop import SYSTEM_CLOCK, Clock, Worker
from efd.observe import tracing
from efd.observe.metrics import Metrics
from efd.observe.stream import Hub
from efd.observe.tracing import RoundTrace
from efd.operations.events import Sink
from efd.records import Claimed, ClaimRequest
from efd.segment import webhooks
from efd.segment.webhooks import Route
from efd.settings import Current

log = logging.getLogger(__name__)

_CLAIM_BATCH = 500
_IDLE_POLL = 1.0  # seconds; the longest a due retry can wait unnoticed
_COALESCE = 0.002  # seconds to let wake-ups pile up into one claim
# Seconds a stop gives rounds in flight beyond their timeout.
SHUTDOWN_MARGIN = 2.0
# Seconds between looks at the pauses table: how soon every daemon on the store applies a
# pause or resume made elsewhere (the CLI, another daemon's admin API).
PAUSE_POLL = 1.0
# Seconds a claimed delivery whose every remaining hook is paused is put back for; a resume
# makes it due at once anyway.
_PAUSED_RETRY = 60.0
# Seconds a hook's run of failures lasts, as this process sees it, before it is written to
# the store (disable_after_hours): shorter runs, a flapping receiver's, cost no write.
NOTE_AFTER = 30.0


class Dispatcher:
    """Claims due deliveries, sends each round through `Rounds`, and records outcomes.

    Owns: its worker loop and the rounds in flight (the loop's side tasks), the leases it
    holds until their outcome is recorded, the outcome recorder, the hooks' circuits, and
    the routes it builds from the destinations (rebuilt on each reload). Knows the store
    and the senders only by their Protocols (Deliveries, Rounds), and the time only through
    its clock. May not ingest, touch a message's payload beyond sending it, or decide a
    retry itself: efd/delivery/retry.py decides.
    """

    def __init__(
        self,
        *,
        deliveries: Deliveries,
        rounds: Rounds,
        settings: Current[Settings],
        metrics: Metrics,
        owner: str,
        rng: random.Random | None = None,
        hub: Hub | None = None,
        clock: Clock = SYSTEM_CLOCK,
        pauses: pausing.Pauses | None = None,
        notices: Sink | None = None,
    ) -> None:
        delivery = settings.value.delivery
        self._notices = notices  # operational events (efd/operations/events.py)
        self._clock = clock
        self._deliveries = deliveries
        self._rounds = rounds
        self._metrics = metrics
        self._owner = owner
        self._rng = rng or random.Random()
        self._routes = _routes(settings.value)
        # Pauses (efd/delivery/pausing.py): read from the store every PAUSE_POLL seconds.
        self._pauses = pauses
        self._targets = _targets(settings.value)
        self._pause_rows: tuple[pausing.Pause, ...] = ()
        self._paused = pausing.Held()
        self._pauses_read = -math.inf
        self._pauses_lock = asyncio.Lock()  # the loop's read and the admin API's, one at a time
        self._disable_after = delivery.disable_after_hours
        # disable_after_hours: (route, hook URL) -> when its run of failures began as this
        # process saw it; (destination, hook) -> the start of its run in the store, as last
        # read with the pauses; and the targets whose row is being written.
        self._run_began: dict[tuple[str, str], float] = {}
        self._runs: dict[tuple[str, int], float] = {}
        self._writing: set[tuple[str, int]] = set()
        self._buckets = _buckets(settings.value)
        # A destination held back by its hooks' rate limits: when to claim for it again.
        self._paced: dict[str, float] = {}
        self._ordered = settings.value.ordered()
        self._lease = delivery.lease_seconds
        self._max_in_flight = delivery.max_in_flight
        self._max_per_hook = delivery.max_per_hook
        self._policy = RetryPolicy(
            initial=delivery.retry_initial_seconds,
            maximum=delivery.retry_max_seconds,
            window=delivery.retry_window_seconds,
        )
        self._circuits = Circuits(
            threshold=delivery.circuit_failures, probe_seconds=delivery.circuit_probe_seconds
        )
        self._in_flight = 0
        self._ahead = Ahead(self._max_per_hook, self._max_in_flight, clock.monotonic)
        self._ready: dict[str, deque[tuple[Claimed, float]]] = {
            name: deque() for name in self._routes
        }  # (claimed, its lease's end)
        # Per destination: whether its last claim was full, so more may be due right now.
        self._backlog: dict[str, bool] = dict.fromkeys(self._routes, False)
        self._timeout = delivery.timeout_seconds
        self._due_hint = math.inf  # the earliest next_attempt_at known to this process
        self._due_checked = 0.0  # when the store was last asked for it
        self._in_flight_by_url: Counter[str] = Counter()
        self._held = Leases(self._lease, deliveries.renew, self._clock)
        # Free slots offered to ingestion's inserts (efd/delivery/handoff.py).
        self.room = Room(owner, self._lease)
        self._claiming = False  # a claim round is running: it offers when it ends
        self._leases = self._held.held  # delivery id -> token, until recorded
        # Rounds and deferred releases are the worker's side tasks.
        self._worker = Worker(
            self._step,
            name="efd-dispatcher",
            clock=clock,
            retry_on=(StoreError,),
            coalesce=_COALESCE,
        )
        self._stopped = False
        # Early: it knows a new destination before ingestion routes a message to it.
        settings.subscribe(self._configure, early=True)
        self._recorder = Recorder(
            deliveries,
            self._held,
            metrics,
            hub=hub,
            stopping=lambda: self._worker.stopping,
            written=self._outcomes_written,
        )

    # -- lifecycle -------------------------------------------------------------------------

    async def start(self, stack: AsyncExitStack) -> None:
        """Start claiming; at shutdown, stop with a grace of a round's timeout (and a margin)."""
        self._recorder.start()
        self._worker.start()
        self._held.start()
        stack.push_async_callback(self.stop, self._timeout + SHUTDOWN_MARGIN)

    def notify(self) -> None:
        """New work may be due: claim now rather than at the next poll."""
        self._worker.notify()

    async def pauses_changed(self) -> None:
        """A pause or resume was written: apply it before the admin API answers, so that
        nothing this process stores from then on is sent to what it paused."""
        try:
            if self._pauses is not None:
                await self._read_pauses()
        except StoreError:
            self._pauses_read = -math.inf  # the next pass reads them
        self._worker.notify()

    @property
    def running(self) -> bool:
        """Whether the claiming loop is alive."""
        return self._worker.running

    async def _configure(self, settings: Settings) -> None:
        """Take the configuration's destinations (hooks, headers, secrets, user agent) for
        rounds that start from now on; rounds in flight finish with the Route they began
        with. Deliveries claimed for a destination no longer configured are given back
        (they stay pending, as any delivery to an unconfigured destination does)."""
        routes = _routes(settings)
        removed = [name for name in self._routes if name not in routes]
        leases = []
        for name in removed:
            for item, _ in self._ready.pop(name, deque()):
                if self._leases.pop(item.delivery_id, None) is not None:
                    leases.append((item.delivery_id, item.lease_token))
            self._backlog.pop(name, None)
        for name in routes:
            self._ready.setdefault(name, deque())
            self._backlog.setdefault(name, True)  # look at once: it may have work waiting
        self._routes = routes
        self._targets = _targets(settings)
        self._paused = pausing.apply(self._targets, self._pause_rows)
        self._disable_after = settings.delivery.disable_after_hours
        self._buckets = _buckets(settings)
        self._paced = {name: at for name, at in self._paced.items() if name in self._buckets}
        self._ordered = settings.ordered()
        for name in removed:
            self.room.offer(name, 0)
        for route in routes.values():
            self._offer(route)
        if leases:
            with contextlib.suppress(StoreError):  # else the leases simply lapse
                await self._deliveries.release(leases, self._clock.now())
        self._worker.notify()

    async def stop(self, grace: float) -> None:
        """Stop claiming, give in-flight rounds `grace` seconds, record, release the rest."""
        if self._stopped:
            return
        self._stopped = True
        self.room.close()
        if self._worker.side_tasks:
            log.info(
                "waiting up to %.1f s for %d deliveries in flight", grace, self._worker.side_tasks
            )
        await self._worker.stop(grace)
        await self._recorder.close()
        await self._held.stop()
        if self._leases:
            # Cut short before their outcome was known: due again at the next start.
            log.warning(
                "releasing %d claimed deliveries not finished at shutdown", len(self._leases)
            )
            with contextlib.suppress(StoreError):
                await self._deliveries.release(list(self._leases.items()), self._clock.now())

    @property
    def circuits(self) -> Circuits:
        return self._circuits

    def holds(self, route: str) -> bool:
        """Whether the pauses in effect send nothing to `route`: each of its hooks paused or
        disabled (the batched actions' loop asks, efd/delivery/batches.py)."""
        return route in self._paused.held

    # -- the loop --------------------------------------------------------------------------

    async def _step(self) -> float:
        """One pass: claim and start what is due; how long the worker may then wait."""
        try:
            if self._pauses is not None and self._clock.now() - self._pauses_read >= PAUSE_POLL:
                await self._read_pauses()
            busy = await self._claim_round()
            wait = 0.0 if busy else await self._idle_wait()
        except StoreError:
            self._held.database_failed()
            raise  # the worker backs off and logs it
        self._held.database_answered()
        return wait

    async def _read_pauses(self) -> None:
        """Take the pauses in the store; log what changed, and look at once for the
        deliveries of a route that is sent to again."""
        assert self._pauses is not None
        async with self._pauses_lock:
            self._pauses_read = self._clock.now()
            every = [pausing.Pause(*row) for row in await self._pauses.all()]
            self._take_pauses(every)

    def _take_pauses(self, every: list[pausing.Pause]) -> None:
        """Apply the store's rows: the pauses and disables, and the runs of failures."""
        self._runs = {
            (p.destination, p.hook): p.since
            for p in every
            if p.kind == pausing.FAILING and p.hook is not None
        }
        rows = tuple(p for p in every if p.kind != pausing.FAILING)
        if rows == self._pause_rows:
            return
        before = {(p.destination, p.hook): p for p in self._pause_rows}
        after = {(p.destination, p.hook): p for p in rows}
        for key, p in after.items():
            was = before.get(key)
            if p.kind == pausing.PAUSED and (was is None or was.kind != p.kind):
                log.info(
                    "%s is paused: nothing is sent to it until resumed%s",
                    pausing.target_name(*key),
                    f" ({p.reason})" if p.reason else "",
                )
        for key, p in before.items():
            if key not in after:
                log.info("%s is resumed (it was %s)", pausing.target_name(*key), p.kind)
                # A hook resumed from a disable starts a new run of failures.
                for hook in self._targets.hooks.get(key[0], ()):
                    self._run_began.pop(hook, None)
        was_paused = self._paused.paused
        self._pause_rows = rows
        self._paused = pausing.apply(self._targets, rows)
        now = self._clock.now()
        for name in was_paused:
            if was_paused[name] != self._paused.paused.get(name) and name in self._backlog:
                self._backlog[name] = True
                self._due_hint = min(self._due_hint, now)
        for route in self._routes.values():
            self._offer(route)

    def _capacity(self, route: Route) -> int:
        # Comparisons, not min() and max(): this runs several times a round, and a call
        # parses its arguments.
        free = self._max_in_flight - self._in_flight
        by_url = self._in_flight_by_url
        for url, _ in route.hooks:
            room = self._max_per_hook - by_url[url]
            if room < free:
                free = room
        return free if free > 0 else 0

    async def _claim_round(self) -> bool:
        """Claim what is due, start what fits; True when a destination may have more due now."""
        self._claiming = True
        try:
            more = await self._claim_each()
        finally:
            self._claiming = False
        for route in self._routes.values():
            self._offer(route)
        return more

    async def _claim_each(self) -> bool:
        more = False
        for route in list(self._routes.values()):
            ready = self._ready.get(route.name)
            if ready is None:
                continue  # removed by a reload meanwhile
            if route.name in self._paused.held:
                # Paused or disabled, every hook: nothing is claimed, nothing expires.
                self._backlog[route.name] = False
                self._start_ready(route)  # what was claimed before the pause goes back
                continue
            buckets = self._buckets.get(route.name)
            now = self._clock.now()
            if buckets and now < self._paced.get(route.name, 0.0):
                continue  # its tokens are spent: _idle_wait knows when to look again
            # A rate-limited destination claims only what it starts at once: its tokens are
            # taken at the claim, so rounds held ready would leave later in a bunch.
            ahead = 0 if buckets else self._ahead.size(route.name)  # claimed ahead: ahead.py
            # Slots an insert took (efd/delivery/handoff.py) are as good as ready; none is
            # offered again until this claim ended and _claim_round offers anew.
            handed = self.room.withdraw(route.name)
            limit = min(self._capacity(route) + ahead - len(ready) - handed, _CLAIM_BATCH)
            if limit <= 0 or self._worker.stopping:
                continue
            hooks = [url for url, _ in route.hooks]
            if self._circuits.blocked(hooks, now):
                # Every hook is open and none may be probed yet: claim nothing.
                self._backlog[route.name] = False
                self._start_ready(route)
                continue
            if all(self._circuits.is_open(url) for url in hooks):
                # A probe is due: claim one delivery for it. Deliveries left waiting keep
                # their retry window, so those whose window closed meanwhile expire now;
                # not while a hook is paused, whose windows stand still.
                expired = 0
                if route.name not in self._paused.paused:
                    expired = await self._deliveries.expire_waiting(
                        route.name, self._policy.window, now
                    )
                if expired:
                    self._metrics.expired[route.name] += expired
                    log.error(
                        "%d deliveries to %s expired: retry window closed while every hook's "
                        "circuit was open",
                        expired,
                        route.name,
                    )
                limit = min(limit, 1 - len(ready))
                if limit <= 0:
                    self._start_ready(route)
                    continue
                # The probe is the earliest pending delivery, due or not: the hook is
                # probed every interval even while the backlog waits out its backoff.
                due_by = math.inf
            else:
                due_by = now
            request = ClaimRequest(
                route.name,
                limit,
                owner=self._owner,
                now=now,
                lease_until=now + self._lease,
                due_by=due_by,
                lapsed_before=self._held.lapsed_before(now),
            )
            if buckets:
                rows = [b.row for b in buckets]
                claimed, left = await self._deliveries.claim_limited(request, rows)
                self._pace(route, buckets, limit, len(claimed), left, now)
            else:
                claimed = await self._deliveries.claim(request)
            if self._ready.get(route.name) is not ready:
                # A reload removed the destination during the claim: give them back.
                leases = [(item.delivery_id, item.lease_token) for item in claimed]
                if leases:
                    self._defer(leases, now)
                continue
            for item in claimed:
                self._leases[item.delivery_id] = item.lease_token
                ready.append((item, now + self._lease))
            # A full claim may have left more due; a short one took everything there was.
            self._backlog[route.name] = len(claimed) == limit
            self._start_ready(route)
            if len(claimed) == limit and self._capacity(route) > 0:
                more = True
        return more

    def _pace(
        self,
        route: Route,
        buckets: tuple[ratelimit.Bucket, ...],
        want: int,
        claimed: int,
        left: float,
        now: float,
    ) -> None:
        """After a claim of a rate-limited destination: when its tokens, not its due
        deliveries, ran out, it is not claimed for again until a quantum's worth has
        accrued; and what it claimed while held back counts as held back."""
        if route.name in self._paced and claimed:
            for bucket in buckets:
                label = route.labels.get(bucket.url) or webhooks.redact_url(bucket.url)
                self._metrics.held_back[(route.name, label)] += claimed
        if claimed < want and left < 1.0:
            self._paced[route.name] = now + ratelimit.next_claim_in(buckets, left)
        else:
            self._paced.pop(route.name, None)

    def _start_ready(self, route: Route) -> None:
        ready = self._ready.get(route.name)
        if ready is None:
            return  # removed by a reload: what it had claimed was given back
        while ready and not self._worker.stopping and self._capacity(route) > 0:
            item, lease_until = ready.popleft()
            if self._leases.get(item.delivery_id) != item.lease_token:
                continue  # a renewal found it taken by another claim: never send it
            ends = self._clock.now() + self._timeout + 2
            if ends > lease_until and ends > self._held.renewed_until:
                # Its lease could lapse mid-round (renewals are failing): leave it to lapse
                # rather than risk another process sending it too.
                self._leases.pop(item.delivery_id, None)
                continue
            self._start(route, item)
        if len(ready) <= self._ahead.size(route.name) // 2 and self._backlog[route.name]:
            self._worker.notify()  # claim more before the ready queue runs dry

    async def _idle_wait(self) -> float:
        """How long to sleep: until the next due retry, at most _IDLE_POLL.

        The store is asked at most once a poll, or when the earliest retry this process
        scheduled itself comes due; asking on every wake-up costs a query per claim. A
        destination with no free slot is left out: a finishing delivery wakes the loop.
        """
        now = self._clock.now()
        wait = _IDLE_POLL
        open_routes = []
        for route in self._routes.values():
            if self._capacity(route) <= 0:
                continue
            if route.name in self._paused.held:
                continue  # a resume is seen at the next look at the pauses
            paced = self._paced.get(route.name)
            if paced is not None and paced > now:
                wait = min(wait, paced - now)  # held back by its rate limits until then
                continue
            hooks = [url for url, _ in route.hooks]
            if self._circuits.blocked(hooks, now):
                # Its due deliveries wait for the circuit: look again at the next probe.
                probes = [self._circuits.next_probe_at(url) for url in hooks]
                wait = min([wait, *(at - now for at in probes if at is not None)])
                continue
            open_routes.append(route)
        if not open_routes:
            return max(0.0, wait)
        if now - self._due_checked >= _IDLE_POLL or self._due_hint <= now:
            self._due_checked = now
            self._due_hint = math.inf
            for route in open_routes:
                due = await self._deliveries.next_due(route.name)
                if due is not None:
                    self._due_hint = min(self._due_hint, due)
        if self._due_hint <= now and self._held.lapsed_before(now) < now:
            # What is due (the claim came back short) are leases that lapsed in an outage,
            # held back from claims for now: look again at the poll, not at once.
            return wait
        return min(wait, max(0.0, self._due_hint - now))

    def _offer(self, route: Route) -> None:
        """Offer ingestion the slots of `route` a claim would fill at once with what it
        stores next (efd/delivery/handoff.py): none while older deliveries wait for a claim,
        and none where the claim itself decides (order, rate limits, open circuits)."""
        if self._claiming:
            return
        name = route.name
        free = 0
        ready = self._ready.get(name)
        if not (
            ready is None
            or self._backlog.get(name, True)
            or self._worker.stopping
            or name in self._ordered
            or name in self._buckets
            or name in self._paused.paused
        ):
            free = self._capacity(route) + self._ahead.size(name) - len(ready)
            if free > 0 and any(self._circuits.is_open(url) for url, _ in route.hooks):
                free = 0
        self.room.offer(name, free)

    def hand_over(self, grant: Grant) -> None:
        """Take the deliveries an insert leased to this process under `grant` (committed):
        they start as claimed ones do. Where it left pending ones, claim them now."""
        grant.settle()
        if grant.left_pending:
            self._worker.notify()
        for name in grant.short & self._backlog.keys():
            self._backlog[name] = True  # others wait for a claim: none is offered until then
        touched: dict[str, Route] = {}
        for item in grant.claimed:
            self._leases[item.delivery_id] = item.lease_token
            route = self._routes.get(item.destination)
            ready = self._ready.get(item.destination)
            if route is None or ready is None or self._stopped:
                # Removed by a reload, or stopping: given back (at the stop, with the rest).
                if not self._stopped:
                    self._leases.pop(item.delivery_id, None)
                    self._defer([(item.delivery_id, item.lease_token)], self._clock.now())
                continue
            ready.append((item, grant.lease_until))
            touched[route.name] = route
            self._metrics.handed_over[route.name] += 1
        for route in touched.values():
            self._start_ready(route)
        for name in touched.keys() | grant.short:
            if (route := self._routes.get(name)) is not None:
                self._offer(route)

    def _start(self, route: Route, item: Claimed) -> None:
        failed = webhooks.failed_labels(route, item.failed_hooks)
        urls = [url for url, label in route.labels.items() if label not in failed]
        now = self._clock.now()
        paused = self._paused.paused.get(route.name)
        if paused:
            sendable = [url for url in urls if url not in paused]
            if urls and not sendable:
                # Every hook it may still go to is paused: back to pending, unattempted.
                self._leases.pop(item.delivery_id, None)
                self._defer([(item.delivery_id, item.lease_token)], now + _PAUSED_RETRY)
                return
            urls = sendable
        closed = [
            url
            for url in urls
            if not self._circuits.is_open(url) or self._circuits.take_probe(url, now)
        ]
        if urls and not closed:
            # Every hook it may still go to is open: back to pending until a probe is due,
            # without an attempt (a probe's success makes it due at once anyway).
            probes = [self._circuits.next_probe_at(url) for url in urls]
            at = min((p for p in probes if p is not None), default=now)
            at = max(at, now + 0.001)
            self._leases.pop(item.delivery_id, None)
            self._defer([(item.delivery_id, item.lease_token)], at)
            return
        urls = closed
        self._in_flight += 1
        by_url = self._in_flight_by_url
        for url in urls:  # Counter.update's generality costs more than the round's bookkeeping
            by_url[url] += 1
        if item.body is None:
            note: str | None = "message payload was purged by a deletion request"
            round_: asyncio.Future[list[AttemptResult]] = asyncio.get_running_loop().create_future()
            round_.set_result([])  # its callback runs at the loop's next turn, not in here
        else:
            note = None
            message = (item.message_pk, item.source, item.message_id, item.received_at)
            if tracing.current() is None:
                round_ = self._rounds.start_round(route, urls, item.body, message, item.url)
            else:
                trace = RoundTrace(item.trace_context, item.attempts, item.delivery_id)
                round_ = self._rounds.start_round(route, urls, item.body, message, item.url, trace)
        # A callback, not a task per round: the round's end is handled in one plain call.
        self._worker.track(
            round_, functools.partial(self._answered, route, item, urls, failed, note)
        )

    def _defer(self, leases: list[tuple[int, int]], at: float) -> None:
        async def defer() -> None:
            with contextlib.suppress(StoreError):  # else the lease lapses: due anyway
                await self._deliveries.release(leases, at)

        self._background(defer())

    def _background(self, work: Coroutine[Any, Any, None]) -> None:
        self._worker.spawn(work)

    def _circuit_changes(
        self, results: list[AttemptResult], urls: list[str], delivery_id: int, now: float
    ) -> None:
        """Count the round's results, of one delivery, against the hooks' circuits; log,
        expose and act on a circuit that opened or closed."""
        for result in results:
            change = self._circuits.record(result, now, delivery_id)
            if change is None:
                continue
            url = result.hook_url
            routes = [r for r in self._routes.values() if url in r.labels]
            reporting.circuit_changed(
                self._metrics, self._circuits, routes, url, change, self._notices, result, now
            )
            if change is Change.CLOSED:
                for r in routes:
                    self._background(self._wake_waiting(r.name, (r.labels[url], url)))
        if len(results) < len(urls):  # a result per hook sent to: some were not
            answered = {result.hook_url for result in results}
            for url in urls:
                if url not in answered:
                    self._circuits.release_probe(url)  # the round sent nothing (purged payload)

    async def _wake_waiting(self, destination: str, hook: tuple[str, ...]) -> None:
        now = self._clock.now()
        try:
            woken = await self._deliveries.wake(destination, hook, now)
        except StoreError as error:
            log.error("cannot make the deliveries waiting on a closed circuit due: %s", error)
            return
        if woken:
            log.info("%d deliveries to %s waiting on the circuit are due now", woken, destination)
        self._due_hint = min(self._due_hint, now)
        self._backlog[destination] = True
        self._worker.notify()

    def _release(self, route: Route, urls: list[str]) -> None:
        self._ahead.answered(route.name)
        self._in_flight -= 1
        by_url = self._in_flight_by_url
        for url in urls:
            by_url[url] -= 1
        self._start_ready(route)
        self._offer(route)
        if not self._ready.get(route.name) and self._due_hint <= self._clock.now():
            self._worker.notify()  # a slot is free and a retry this process scheduled is due

    # -- one round -------------------------------------------------------------------------

    def _answered(
        self,
        route: Route,
        item: Claimed,
        urls: list[str],
        failed: frozenset[str],
        note: str | None,
        round_: asyncio.Future[list[AttemptResult]],
    ) -> None:
        """A round ended: free its slots, count it against the circuits, decide what comes
        next and hand the outcome to the recorder (not awaited: it writes in batches, then
        drops the leases; at once an outcome that moves a lane on)."""
        cancelled = round_.cancelled()
        error = None if cancelled else round_.exception()
        results = [] if cancelled or error is not None else round_.result()
        # Counted before the slot is freed, so the next round sees a circuit that opened.
        self._circuit_changes(results, urls, item.delivery_id, self._clock.now())
        # The slots are free once the receivers answered; the outcome may wait a moment for
        # others to share its transaction, and the lease keeps the delivery ours meanwhile.
        self._release(route, urls)
        if cancelled:
            return  # stopped mid-round: the lease is released at the stop
        if error is not None:
            # A bug, not the network: nothing is recorded, and the lease lapses.
            log.error("a round to %s failed", route.name, exc_info=error)
            return
        now = self._clock.now()
        first = item.first_attempt_at or (min([r.started_at for r in results]) if results else now)
        if self._disable_after is not None and self._pauses is not None and results:
            self._count_failures(route, results, now)
        # While one of its hooks is paused, the paused time does not count against the
        # window; a resume moves the stored window forward by it (efd/store/pauses.py).
        since = self._paused.since.get(route.name)
        decision = retry.decide(
            results,
            hooks=route.labels,
            failed_hooks=failed,
            attempt=item.attempts + 1,
            first_attempt_at=first if since is None else pausing.window_start(first, since, now),
            now=now,
            policy=self._policy,
            rng=self._rng,
        )
        reporting.report(
            self._metrics, self._clock.now(), route, item, results, decision, note, self._notices
        )
        if decision.next_attempt_at is not None:
            self._due_hint = min(self._due_hint, decision.next_attempt_at)
            if decision.next_attempt_at < self._worker.waking_at:
                self._worker.notify()  # due before the loop meant to look again
        outcome = outcome_of(item, decision, results, first_attempt_at=first, now=now, note=note)
        rows = attempt_rows(route, item.delivery_id, results)
        urgent = moves_lane_on(outcome, route.name in self._ordered)
        self._recorder.add((outcome, rows, route.name, item.message_id), urgent=urgent)

    # -- disable_after_hours --------------------------------------------------------------

    def _count_failures(self, route: Route, results: list[AttemptResult], now: float) -> None:
        """Follow each hook's run of failures and disable the hook whose run reached
        disable_after_hours. A run that lasts NOTE_AFTER is written to the store, so that it
        outlives a restart and counts every daemon's attempts; a success ends it there
        (seen in the store's rows, read with the pauses, so a healthy hook costs no write)."""
        assert self._disable_after is not None
        threshold = self._disable_after * 3600.0
        for result in results:
            if not tells_of_receiver(result):
                continue
            key = (route.name, result.hook_url)
            target = self._targets.number(*key)
            if target is None:
                continue
            if result.verdict is Verdict.SUCCESS:
                self._run_began.pop(key, None)
                if target in self._runs and target not in self._writing:
                    self._writing.add(target)
                    self._background(self._hook_answered(target))
                continue
            began = self._run_began.setdefault(key, now)
            stored = self._runs.get(target)
            if target in self._writing:
                continue
            if stored is not None:
                if now - stored >= threshold:
                    self._writing.add(target)
                    last = result.describe(route.labels.get(result.hook_url) or "hook")
                    self._background(self._disable(target, stored, last, now - threshold, now))
            elif now - began >= min(NOTE_AFTER, threshold / 2):
                self._writing.add(target)
                self._background(self._hook_failed(target, began))

    async def _hook_answered(self, target: tuple[str, int]) -> None:
        assert self._pauses is not None
        try:
            await self._pauses.answered(*target)
            self._runs.pop(target, None)
        except StoreError:
            pass  # ended at its next success
        finally:
            self._writing.discard(target)

    async def _hook_failed(self, target: tuple[str, int], began: float) -> None:
        assert self._pauses is not None
        try:
            row = pausing.Pause(*await self._pauses.failing(*target, began))
        except StoreError:
            return  # written at its next failure
        finally:
            self._writing.discard(target)
        if row.kind == pausing.FAILING:
            self._runs[target] = row.since  # an earlier start, if another daemon wrote one

    async def _disable(
        self,
        target: tuple[str, int],
        began: float,
        last: str,
        started_before: float,
        now: float,
    ) -> None:
        assert self._pauses is not None
        reason = pausing.disabled_reason(began, last)
        try:
            done = await self._pauses.disable(*target, reason, started_before, now)
        except StoreError:
            return  # tried again at its next failure
        finally:
            self._writing.discard(target)
        if not done:
            self._runs.pop(target, None)  # another answered, or it is paused: look again
            return
        reporting.hook_disabled(self._notices, *target, reason, now)
        self._pauses_read = -math.inf  # applied at once, not at the next look
        self._worker.notify()

    def _outcomes_written(self, written: list[Recorded]) -> None:
        now = self._clock.now()
        due = due_once_written(((d, o) for o, _, d, _ in written), self._ordered, now)
        if due:
            for destination in due & self._backlog.keys():
                self._backlog[destination] = True
            self._due_hint = min(self._due_hint, now)
            self._worker.notify()


def _targets(settings: Settings) -> pausing.Targets:
    """Each destination's hooks, numbered as pauses name them: every route's, the batched
    actions' too (efd/delivery/batches.py holds those while they are paused)."""
    user_agent = settings.delivery.user_agent
    return pausing.Targets.of((d.name, d.routes(user_agent)) for d in settings.destinations)


def _buckets(settings: Settings) -> dict[str, tuple[ratelimit.Bucket, ...]]:
    """The token buckets of each route that has rate-limited hooks."""
    return settings.route_buckets()


def _routes(settings: Settings) -> dict[str, Route]:
    """The routes this dispatcher claims and sends for: every route but the actions that
    batch, whose batches efd/delivery/batches.py sends (their deliveries never go alone)."""
    user_agent = settings.delivery.user_agent
    batched = {
        d.route_name(a)
        for d in settings.destinations
        if d.type == "actions"
        for a in d.actions
        if a.batch.batched
    }
    return {
        r.name: r
        for d in settings.destinations
        for r in d.routes(user_agent)
        if r.name not in batched
    }
