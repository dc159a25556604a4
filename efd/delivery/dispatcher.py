"""The delivery scheduler: claim due deliveries, POST them, record what happened.

A plain asyncio loop, not APScheduler: it wakes on new work (ingestion, or NOTIFY from
other processes), on the next due time, on a freed slot, or on stop. Claims are batched per
destination and sized to the free capacity of its hook URLs, so a slow receiver holds
only its own slots and never starves the others. Outcomes are written in batches.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
import random
import time
from collections import Counter, deque
from collections.abc import Callable, Coroutine, Sequence
from typing import Any, Protocol

from efd.batching import GroupCommit
from efd.config import Settings
from efd.errors import StoreError
from efd.observe.metrics import Metrics
from efd.observe.stream import Hub
from efd.rows import AttemptRow, Claimed, DeliveryStatus, Outcome
from efd.rules import retry, webhooks
from efd.rules.circuit import Change, Circuits
from efd.rules.retry import AttemptResult, Backoff, RetryPolicy, Verdict
from efd.rules.webhooks import Route

log = logging.getLogger(__name__)

# What the recorder writes for one round: its outcome, its attempts, destination, messageId.
_Recorded = tuple[Outcome, list[AttemptRow], str, str]

_CLAIM_BATCH = 500
_IDLE_POLL = 1.0  # seconds; the longest a due retry can wait unnoticed
_COALESCE = 0.002  # seconds to let wake-ups pile up into one claim


class Rounds(Protocol):
    """Sends one round of a delivery: the in-process Sender, or the sender processes."""

    async def send_round(
        self, route: Route, urls: Sequence[str], body: str, webhook_id: str
    ) -> list[AttemptResult]: ...


class Deliveries(Protocol):
    """The deliveries the dispatcher works on: the store (efd/store/runner.py), or the
    tests' in-memory twin. Errors of the store are efd.errors.StoreError."""

    async def claim(
        self,
        destination: str,
        limit: int,
        *,
        owner: str,
        now: float,
        lease_until: float,
        due_by: float | None = None,
    ) -> list[Claimed]:
        """Lease up to `limit` deliveries of `destination` due by `due_by` (default `now`),
        oldest first; a delivery under another claimer's live lease is never taken."""
        ...

    async def record(self, outcomes: Sequence[Outcome], attempts: Sequence[AttemptRow]) -> int:
        """Write attempts and outcomes (fenced by token); return how many were stale."""
        ...

    async def release(self, leases: Sequence[tuple[int, int]], now: float) -> None:
        """Give back claimed deliveries never sent: due again at `now`."""
        ...

    async def next_due(self, destination: str) -> float | None:
        """The earliest next_attempt_at of the destination's pending deliveries."""
        ...

    async def wake(self, destination: str, hook: Sequence[str], now: float) -> int:
        """Make due at `now` the destination's pending deliveries, not leased, whose
        failed_hooks names none of `hook`'s forms (its label, and its URL as rows written
        before labels hold it); return how many moved."""
        ...

    async def expire_waiting(self, destination: str, window: float, now: float) -> int:
        """Expire the destination's pending deliveries, not leased, whose retry window
        (from their first attempt, or their creation if never attempted) has closed."""
        ...


def _ordered(settings: Settings) -> frozenset[str]:
    return frozenset(d.name for d in settings.destinations if d.ordering == "per_user")


class Dispatcher:
    def __init__(
        self,
        *,
        deliveries: Deliveries,
        rounds: Rounds,
        settings: Settings,
        metrics: Metrics,
        owner: str,
        rng: random.Random | None = None,
        hub: Hub | None = None,
    ) -> None:
        delivery = settings.delivery
        self._deliveries = deliveries
        self._rounds = rounds
        self._metrics = metrics
        self._owner = owner
        self._hub = hub  # the live stream, told of each recorded attempt
        self._rng = rng or random.Random()
        self._routes = {d.name: d.route(delivery.user_agent) for d in settings.destinations}
        self._ordered = _ordered(settings)
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
        # Claimed ahead, per destination: a freed slot starts the next round at once instead
        # of waiting for a claim, which queues behind ingestion's commits on the writer.
        self._ahead = min(self._max_in_flight, 4 * self._max_per_hook)
        self._ready: dict[str, deque[tuple[Claimed, float]]] = {
            name: deque() for name in self._routes
        }  # (claimed, its lease's end)
        # Per destination: whether its last claim was full, so more may be due right now.
        self._backlog: dict[str, bool] = dict.fromkeys(self._routes, False)
        self._timeout = delivery.timeout_seconds
        self._due_hint = math.inf  # the earliest next_attempt_at known to this process
        self._due_checked = 0.0  # when the store was last asked for it
        self._sleep_until = 0.0  # while the loop waits: when it will look again by itself
        self._in_flight_by_url: Counter[str] = Counter()
        self._leases: dict[int, int] = {}  # delivery id -> token, until recorded
        self._tasks: set[asyncio.Task[None]] = set()
        self._wake = asyncio.Event()
        self._stopping = False
        self._loop_task: asyncio.Task[None] | None = None
        self._recorder: GroupCommit[_Recorded, None] = GroupCommit(
            self._record, max_items=2000, name="efd-outcome-recorder"
        )

    # -- lifecycle -------------------------------------------------------------------------

    def start(self) -> None:
        self._recorder.start()
        self._loop_task = asyncio.create_task(self._run(), name="efd-dispatcher")

    def notify(self) -> None:
        """New work may be due: claim now rather than at the next poll."""
        self._wake.set()

    async def reload(self, settings: Settings) -> None:
        """Take the configuration's destinations (hooks, headers, secrets, user agent) for
        rounds that start from now on; rounds in flight finish with the Route they began
        with. Deliveries claimed for a destination no longer configured are given back
        (they stay pending, as any delivery to an unconfigured destination does)."""
        user_agent = settings.delivery.user_agent
        routes = {d.name: d.route(user_agent) for d in settings.destinations}
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
        self._ordered = _ordered(settings)
        if leases:
            with contextlib.suppress(StoreError):  # else the leases simply lapse
                await self._deliveries.release(leases, time.time())
        self._wake.set()

    async def stop(self, grace: float) -> None:
        """Stop claiming, give in-flight rounds `grace` seconds, record, release the rest."""
        self._stopping = True
        self._wake.set()
        if self._loop_task is not None:
            await self._loop_task
        if self._tasks:
            log.info("waiting up to %.1f s for %d deliveries in flight", grace, len(self._tasks))
            _, pending = await asyncio.wait(set(self._tasks), timeout=grace)
            for task in pending:
                task.cancel()
            if pending:
                await asyncio.wait(pending)
        await self._recorder.close()
        if self._leases:
            # Cut short before their outcome was known: due again at the next start.
            log.warning(
                "releasing %d claimed deliveries not finished at shutdown", len(self._leases)
            )
            with contextlib.suppress(StoreError):
                await self._deliveries.release(list(self._leases.items()), time.time())

    @property
    def circuits(self) -> Circuits:
        return self._circuits

    # -- the loop --------------------------------------------------------------------------

    async def _run(self) -> None:
        backoff = Backoff()
        while not self._stopping:
            self._wake.clear()
            try:
                busy = await self._claim_round()
                wait = 0.0 if busy else await self._idle_wait()
                backoff.reset()
            except StoreError as error:
                wait = backoff.next()
                log.error(
                    "dispatcher cannot reach the database: %s; retrying in %.1f s", error, wait
                )
            if wait > 0 and not self._stopping:
                self._sleep_until = time.time() + wait
                with contextlib.suppress(TimeoutError):
                    async with asyncio.timeout(wait):
                        await self._wake.wait()
                self._sleep_until = 0.0
                await asyncio.sleep(_COALESCE)
            else:
                await asyncio.sleep(0)

    def _capacity(self, route: Route) -> int:
        free = self._max_in_flight - self._in_flight
        for url, _ in route.hooks:
            free = min(free, self._max_per_hook - self._in_flight_by_url[url])
        return max(0, free)

    async def _claim_round(self) -> bool:
        """Claim what is due, start what fits; True when a destination may have more due now."""
        more = False
        for route in list(self._routes.values()):
            ready = self._ready.get(route.name)
            if ready is None:
                continue  # removed by a reload meanwhile
            limit = min(self._capacity(route) + self._ahead - len(ready), _CLAIM_BATCH)
            if limit <= 0 or self._stopping:
                continue
            now = time.time()
            hooks = [url for url, _ in route.hooks]
            if self._circuits.blocked(hooks, now):
                # Every hook is open and none may be probed yet: claim nothing.
                self._backlog[route.name] = False
                self._start_ready(route)
                continue
            if all(self._circuits.is_open(url) for url in hooks):
                # A probe is due: claim one delivery for it. Deliveries left waiting keep
                # their retry window, so those whose window closed meanwhile expire now.
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
            claimed = await self._deliveries.claim(
                route.name,
                limit,
                owner=self._owner,
                now=now,
                lease_until=now + self._lease,
                due_by=due_by,
            )
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

    def _start_ready(self, route: Route) -> None:
        ready = self._ready.get(route.name)
        if ready is None:
            return  # removed by a reload: what it had claimed was given back
        while ready and not self._stopping and self._capacity(route) > 0:
            item, lease_until = ready.popleft()
            if time.time() + self._timeout + 2 > lease_until:
                # Waited so long its lease could lapse mid-round: leave it to lapse (due
                # again in moments) rather than risk another process sending it too.
                self._leases.pop(item.delivery_id, None)
                continue
            self._start(route, item)
        if len(ready) <= self._ahead // 2 and self._backlog[route.name]:
            self._wake.set()  # claim more before the ready queue runs dry

    async def _idle_wait(self) -> float:
        """How long to sleep: until the next due retry, at most _IDLE_POLL.

        The store is asked at most once a poll, or when the earliest retry this process
        scheduled itself comes due; asking on every wake-up costs a query per claim. A
        destination with no free slot is left out: a finishing delivery wakes the loop.
        """
        now = time.time()
        wait = _IDLE_POLL
        open_routes = []
        for route in self._routes.values():
            if self._capacity(route) <= 0:
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
        return min(wait, max(0.0, self._due_hint - now))

    def _start(self, route: Route, item: Claimed) -> None:
        failed = webhooks.failed_labels(route, item.failed_hooks)
        urls = [url for url, label in route.labels.items() if label not in failed]
        now = time.time()
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
        self._in_flight_by_url.update(urls)
        task = asyncio.create_task(self._deliver(route, item, urls, failed))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    def _defer(self, leases: list[tuple[int, int]], at: float) -> None:
        async def defer() -> None:
            with contextlib.suppress(StoreError):  # else the lease lapses: due anyway
                await self._deliveries.release(leases, at)

        self._background(defer())

    def _background(self, work: Coroutine[Any, Any, None]) -> None:
        task = asyncio.create_task(work)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    def _circuit_changes(self, results: list[AttemptResult], urls: list[str], now: float) -> None:
        """Count the round's results against the hooks' circuits; log, expose and act on a
        circuit that opened or closed."""
        answered = set()
        for result in results:
            answered.add(result.hook_url)
            change = self._circuits.record(result, now)
            if change is None:
                continue
            url = result.hook_url
            routes = [r for r in self._routes.values() if url in r.labels]
            hook = routes[0].labels[url] if routes else webhooks.redact_url(url)
            names = [r.name for r in routes]
            for r in routes:
                self._metrics.circuit_open[(r.name, r.labels[url])] = int(change is Change.OPENED)
            if change is Change.OPENED:
                log.warning(
                    "circuit of %s (%s) opened after %d failed attempts in a row; "
                    "probing every %g s",
                    hook,
                    ", ".join(names),
                    self._circuits.threshold,
                    self._circuits.probe_seconds,
                )
            else:
                log.info(
                    "circuit of %s (%s) closed: the probe got an answer", hook, ", ".join(names)
                )
                for r in routes:
                    self._background(self._wake_waiting(r.name, (r.labels[url], url)))
        for url in urls:
            if url not in answered:
                self._circuits.release_probe(url)  # the round sent nothing (purged payload)

    async def _wake_waiting(self, destination: str, hook: tuple[str, ...]) -> None:
        now = time.time()
        try:
            woken = await self._deliveries.wake(destination, hook, now)
        except StoreError as error:
            log.error("cannot make the deliveries waiting on a closed circuit due: %s", error)
            return
        if woken:
            log.info("%d deliveries to %s waiting on the circuit are due now", woken, destination)
        self._due_hint = min(self._due_hint, now)
        self._backlog[destination] = True
        self._wake.set()

    def _release(self, route: Route, urls: list[str]) -> None:
        self._in_flight -= 1
        self._in_flight_by_url.subtract(urls)
        self._start_ready(route)
        if not self._ready.get(route.name) and self._due_hint <= time.time():
            self._wake.set()  # a slot is free and a retry this process scheduled is due

    # -- one round -------------------------------------------------------------------------

    async def _deliver(
        self, route: Route, item: Claimed, urls: list[str], failed: frozenset[str]
    ) -> None:
        results: list[AttemptResult] = []
        try:
            results, note = await self._send_round(route, item, urls)
        finally:
            # Counted before the slot is freed, so the next round sees a circuit that opened.
            self._circuit_changes(results, urls, time.time())
            # The slots are free once the receivers answered; recording the outcome may
            # wait behind a large commit, and the lease keeps the delivery ours meanwhile.
            self._release(route, urls)
        now = time.time()
        first = item.first_attempt_at or min((r.started_at for r in results), default=now)
        decision = retry.decide(
            results,
            hooks=route.labels,
            failed_hooks=failed,
            attempt=item.attempts + 1,
            first_attempt_at=first,
            now=now,
            policy=self._policy,
            rng=self._rng,
        )
        self._report(route, item, results, decision, note)
        if decision.next_attempt_at is not None:
            self._due_hint = min(self._due_hint, decision.next_attempt_at)
            if decision.next_attempt_at < self._sleep_until:
                self._wake.set()  # due before the loop meant to look again
        outcome = Outcome(
            delivery_id=item.delivery_id,
            lease_token=item.lease_token,
            status=decision.status,
            attempts=item.attempts + (1 if results else 0),
            first_attempt_at=first,
            next_attempt_at=decision.next_attempt_at,
            finished_at=None if decision.status is DeliveryStatus.PENDING else now,
            failed_hooks=decision.failed_hooks,
            last_error=note or decision.last_error,
        )
        rows = [
            AttemptRow(
                delivery_id=item.delivery_id,
                hook_url=route.labels.get(r.hook_url) or webhooks.redact_url(r.hook_url),
                attempted_at=r.started_at,
                duration_ms=round(r.duration * 1000, 3),
                outcome=r.verdict.value,
                status_code=r.status_code,
                error_class=r.error_class,
                error=r.error,
                response_head=r.response_head,
            )
            for r in results
        ]
        # Not awaited: the recorder writes outcomes in batches and then drops the leases.
        self._recorder.add([(outcome, rows, route.name, item.message_id)])

    async def _send_round(
        self, route: Route, item: Claimed, urls: list[str]
    ) -> tuple[list[AttemptResult], str | None]:
        if item.body is None:
            return [], "message payload was purged by a deletion request"
        webhook_id = webhooks.webhook_id(
            item.message_pk, item.source, item.message_id, item.received_at
        )
        return await self._rounds.send_round(route, urls, item.body, webhook_id), None

    def _report(
        self,
        route: Route,
        item: Claimed,
        results: list[AttemptResult],
        decision: retry.Decision,
        note: str | None,
    ) -> None:
        metrics = self._metrics
        destination = route.name
        for result in results:
            metrics.observe_attempt(destination, result.verdict.value, result.duration)
            if result.verdict is not Verdict.SUCCESS:
                log.warning(
                    "message %s to %s: attempt %d at %s failed (%s): %s",
                    item.message_id,
                    destination,
                    item.attempts + 1,
                    route.labels.get(result.hook_url) or webhooks.redact_url(result.hook_url),
                    result.error_class or f"HTTP {result.status_code}",
                    result.error or (result.response_head or "")[:120],
                )
        if decision.status is DeliveryStatus.DELIVERED:
            metrics.delivered[destination] += 1
            log.debug("message %s delivered to %s", item.message_id, destination)
        elif decision.status is DeliveryStatus.PENDING:
            metrics.retried[destination] += 1
            assert decision.next_attempt_at is not None
            log.info(
                "message %s to %s: retry in %.1f s",
                item.message_id,
                destination,
                decision.next_attempt_at - time.time(),
            )
        elif decision.status is DeliveryStatus.FAILED:
            metrics.failed[destination] += 1
            log.error(
                "message %s to %s failed for good: %s",
                item.message_id,
                destination,
                note or decision.last_error,
            )
        else:
            metrics.expired[destination] += 1
            log.error(
                "message %s to %s expired: retry window closed after %d attempts: %s",
                item.message_id,
                destination,
                item.attempts + 1,
                decision.last_error,
            )

    async def _record(self, take: Callable[[], list[_Recorded]]) -> list[None]:
        items = take()
        outcomes = [outcome for outcome, _, _, _ in items]
        rows = [row for _, attempt_rows, _, _ in items for row in attempt_rows]
        backoff = Backoff()
        tries = 0
        while True:
            try:
                stale = await self._deliveries.record(outcomes, rows)
                break
            except StoreError as error:
                # Keep the outcomes: losing them would resend delivered messages. At shutdown,
                # give up after a few tries: the leases lapse and the rounds are sent again.
                tries += 1
                if self._stopping and tries >= 3:
                    log.error("giving up on %d outcomes at shutdown: %s", len(items), error)
                    return [None] * len(items)
                delay = backoff.next()
                log.error(
                    "cannot record %d outcomes: %s; retrying in %.1f s", len(items), error, delay
                )
                await asyncio.sleep(delay)
        for outcome in outcomes:
            self._leases.pop(outcome.delivery_id, None)
        handed_on = {
            destination
            for outcome, _, destination, _ in items
            if destination in self._ordered and outcome.status is not DeliveryStatus.PENDING
        }
        if handed_on:
            # A head's outcome made the next message of its lane due now (efd/store/lanes.py).
            for destination in handed_on & self._backlog.keys():
                self._backlog[destination] = True
            self._due_hint = min(self._due_hint, time.time())
            self._wake.set()
        if self._hub is not None and self._hub.active:
            for _, attempt_rows, destination, message_id in items:
                for row in attempt_rows:
                    self._hub.publish(
                        "attempt",
                        {
                            "destination": destination,
                            "url": row.hook_url,
                            "messageId": message_id,
                            "statusCode": row.status_code,
                            "error": None
                            if row.error_class is None
                            else f"{row.error_class}: {row.error}",
                            "durationMs": row.duration_ms,
                            "delivered": row.outcome == "success",
                        },
                    )
        if stale:
            self._metrics.stale_outcomes += stale
            log.warning("%d outcomes arrived after their lease moved on; not applied", stale)
        return [None] * len(items)
