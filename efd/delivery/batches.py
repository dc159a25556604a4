"""Batched delivery (docs/actions.md#batches): the actions with `batch_size` above 1 send
their events many to a request, and only here.

A loop of its own beside the dispatcher's, per batched route: claim the batches that are due
(retries, and those a stop or a crash left), form new ones from the events waiting
(efd.delivery.batching.form inside the store's forming transaction), send each as one
request through the senders' batch path, and record its outcome, which the store copies to
every member. A 413 splits the batch in two (efd/store/batches.py records the halves), and
the halves go at once.

The dispatcher leaves these routes alone: it claims none of their deliveries, offers no
hand-over at ingestion for them, and expires none of their members (their batch decides).
Batches have their own slots, counted as the dispatcher counts its rounds: at most
`max_per_hook` requests to the action's hook and `max_in_flight` in all.

Events whose payload a deletion request purged before they were batched are failed without
a request (there is nothing to send), as a single delivery's round is.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import math
import random
from collections import Counter
from collections.abc import Callable, Sequence
from contextlib import AsyncExitStack
from dataclasses import dataclass, field
from typing import Protocol

from efd.config import Settings
from efd.delivery import batchbody, batching, ratelimit, reporting, retry
from efd.delivery.batching import BatchPolicy, Candidate, Plan
from efd.delivery.circuit import Circuits
from efd.delivery.leases import Leases
from efd.delivery.retry import AttemptResult, RetryPolicy
from efd.delivery.rounds import attempt_rows
from efd.errors import StoreError, StoreUnavailable
from efd.loop import SYSTEM_CLOCK, Backoff, Clock, Worker
from efd.observe.metrics import Metrics
from efd.observe.stream import Hub
from efd.operations.events import Sink
from efd.records import ClaimRequest, DeliveryStatus
from efd.segment import webhooks
from efd.segment.webhooks import Route
from efd.settings import Current
from efd.store.batches import (
    BatchAttempt,
    BatchOutcome,
    Candidates,
    LeasedBatch,
    NewBatch,
    Waiting,
)
from efd.store.runner import AsyncStore

log = logging.getLogger(__name__)

_IDLE_POLL = 1.0  # seconds; the longest a due retry (or another daemon's lapsed lease) waits
_COALESCE = 0.005  # seconds to let wake-ups pile up into one pass
# The least time between two formations of a route that found nothing ready: a stream of
# ingestion wake-ups then costs a read every this long, not one per flush.
_REFORM = 0.05
_READ_MAX = 20_000  # waiting events read by one formation
# Seconds between looks for batches of actions that no longer batch (while some are left).
_DRAIN_CHECK = 10.0
# Seconds between looks for redriven events still in a finished batch, per batched action.
_FREE_CHECK = 5.0
PURGED = "message payload was purged by a deletion request"
SPLIT_413 = "HTTP 413: the batch was split in two"
DISSOLVED = "some of its events were discarded: the others were formed into new batches"
PURGED_MEMBER = "a deletion request purged one of its events: the others went in new batches"
_OPEN = (DeliveryStatus.PENDING.value, DeliveryStatus.QUEUED.value)
SHUTDOWN_MARGIN = 2.0


class BatchRounds(Protocol):
    """Sends one batch's request: the in-process Sender, or the sender processes."""

    def start_batch(
        self,
        route: Route,
        body: bytes,
        webhook_id: str,
        url: str | None = None,
        first_event: int | None = None,
    ) -> asyncio.Future[list[AttemptResult]]: ...


@dataclass(frozen=True, slots=True)
class _Target:
    """A batched route as the batcher sends it."""

    route: Route
    policy: BatchPolicy
    ordered: bool

    @property
    def hook(self) -> str:
        return self.route.hooks[0][0]

    @property
    def headers(self) -> batching.Headers:
        return tuple(sorted(self.route.hooks[0][1].items()))


@dataclass(slots=True)
class _Sending:
    """A batch under way: what its request and outcome need besides the lease."""

    batch: LeasedBatch
    url: str | None
    first_event: int  # the byte length of its first event's body
    oldest: float  # since when its longest-waiting member waits
    message_ids: tuple[str, ...] = ()  # its members' messageIds, for the live stream


@dataclass(slots=True)
class _Formation:
    """What the plan decided in the forming transaction, read after it."""

    plan: Plan | None = None
    purged: list[int] = field(default_factory=list)
    sending: dict[tuple[int, ...], _Sending] = field(default_factory=dict)


class Batcher:
    """Owns the batched routes' loop, the batches it holds leased (renewed until their
    outcome is written), their slots and the outcomes' writes. Shares the hooks' circuits
    with the dispatcher. Knows the store through the async runner."""

    def __init__(
        self,
        *,
        db: AsyncStore,
        rounds: BatchRounds,
        settings: Current[Settings],
        metrics: Metrics,
        owner: str,
        circuits: Circuits,
        hub: Hub | None = None,
        paused: Callable[[str], bool] = lambda _route: False,
        notices: Sink | None = None,
        rng: random.Random | None = None,
        clock: Clock = SYSTEM_CLOCK,
    ) -> None:
        self._db = db
        # Whether the pauses in effect send nothing to a route: the dispatcher reads them.
        self._paused = paused
        self._notices = notices  # operational events: a hook's circuit opened or closed
        self._hub = hub  # the live stream, told of each recorded request, per member
        self._store = db.store.batches
        self._rounds = rounds
        self._metrics = metrics
        self._owner = owner
        self._circuits = circuits
        self._rng = rng or random.Random()
        self._clock = clock
        self._targets: dict[str, _Target] = {}
        self._take(settings.value)
        delivery = settings.value.delivery
        self._lease = delivery.lease_seconds
        self._timeout = delivery.timeout_seconds
        self._max_in_flight = delivery.max_in_flight
        self._max_per_hook = delivery.max_per_hook
        self._in_flight = 0
        self._by_hook: Counter[str] = Counter()
        self._claim_at: dict[str, float] = {}  # route -> when to claim its due batches again
        self._form_at: dict[str, float] = {}  # route -> when to form again (0: at once)
        self._formed_at: dict[str, float] = {}  # route -> when it was last formed
        # A route held back by its hook's rate limit: when its tokens are worth asking again.
        self._paced: dict[str, float] = {}
        self._notified = 0  # how many wake-ups for new events so far
        self._held = Leases(self._lease, self._renew, clock)
        self._worker = Worker(
            self._step, name="efd-batcher", clock=clock, retry_on=(StoreError,), coalesce=_COALESCE
        )
        self._stopped = False
        self._draining: set[str] = set()  # actions not batching now with batches pending
        self._free_at: dict[str, float] = {}  # route -> when to look for redriven members
        self._drain_check_at = 0.0
        settings.subscribe(self._configure, early=True)

    def _take(self, settings: Settings) -> None:
        delivery = settings.delivery
        self._policy = RetryPolicy(
            initial=delivery.retry_initial_seconds,
            maximum=delivery.retry_max_seconds,
            window=delivery.retry_window_seconds,
        )
        policies = {
            d.route_name(a): a.batch
            for d in settings.destinations
            if d.type == "actions"
            for a in d.actions
        }
        self._buckets = {
            name: found for name, found in settings.route_buckets().items() if name in policies
        }
        ordered = settings.ordered()
        actions = {
            r.name: _Target(r, policies[r.name], r.name in ordered)
            for d in settings.destinations
            for r in d.routes(delivery.user_agent)
            if r.name in policies
        }
        self._targets = {name: t for name, t in actions.items() if t.policy.batched}
        # An action that stopped batching (a reload, or a restart with another
        # configuration) still has its batches formed before sent, as they were formed.
        self._actions = actions

    # -- lifecycle ---------------------------------------------------------------------------

    async def start(self, stack: AsyncExitStack) -> None:
        """Start the loop (its first pass looks for batches of actions that stopped
        batching); at shutdown, stop with a grace of a request's timeout and a margin."""
        self._worker.start()
        self._held.start()
        stack.push_async_callback(self.stop, self._timeout + SHUTDOWN_MARGIN)

    def notify(self) -> None:
        """New events may wait for a batch: form soon rather than at the next poll (at most
        every _REFORM seconds a route, so a stream of ingestion flushes costs one read each
        that long)."""
        if self._targets:
            self._notified += 1
            for name in self._targets:
                soon = self._formed_at.get(name, 0.0) + _REFORM
                self._form_at[name] = min(self._form_at.get(name, 0.0), soon)
            self._worker.notify()

    async def _configure(self, settings: Settings) -> None:
        """Routes that start or stop batching take effect at the next pass; batches in
        flight end with the Route they began with."""
        self._take(settings)
        self._drain_check_at = 0.0  # look for batches of actions that stopped batching
        self._worker.notify()

    async def _check_draining(self, now: float) -> None:
        pending = await self._db.read(self._store.routes_pending)
        self._draining = {
            name for name in pending if name in self._actions and name not in self._targets
        }
        # Looked for again while some are left; else at the next reload or start.
        self._drain_check_at = now + _DRAIN_CHECK if self._draining else math.inf
        if self._draining:
            log.info(
                "sending the batches formed before batching was turned off: %s",
                ", ".join(sorted(self._draining)),
            )

    async def stop(self, grace: float) -> None:
        """Stop forming, give requests in flight `grace` seconds, release the rest."""
        if self._stopped:
            return
        self._stopped = True
        await self._worker.stop(grace)
        await self._held.stop()
        if self._held.held:
            log.warning("releasing %d batches not finished at shutdown", len(self._held.held))
            with contextlib.suppress(StoreError):
                await self._db.write(
                    self._store.release, list(self._held.held.items()), self._clock.now()
                )

    async def _renew(self, leases: Sequence[tuple[int, int]], until: float) -> list[int]:
        return await self._db.write(self._store.renew, leases, until)

    # -- the loop ----------------------------------------------------------------------------

    async def _step(self) -> float:
        try:
            wait = await self._pass()
        except StoreError:
            self._held.database_failed()
            raise
        self._held.database_answered()
        return wait

    def _capacity(self, target: _Target) -> int:
        free = min(
            self._max_in_flight - self._in_flight, self._max_per_hook - self._by_hook[target.hook]
        )
        return max(free, 0)

    async def _pass(self) -> float:
        """Claim and form for each batched route with a free slot; how long to wait then."""
        wait = _IDLE_POLL
        again = False
        if self._drain_check_at <= self._clock.now():
            await self._check_draining(self._clock.now())
        for name in list(self._draining):
            target = self._actions.get(name)
            if target is None or name in self._targets:
                self._draining.discard(name)
                continue
            if self._paused(name):
                continue
            free = self._capacity(target)
            if free > 0 and self._claim_at.get(name, 0.0) <= self._clock.now():
                await self._claim(target, free, self._clock.now())
        for name, target in list(self._targets.items()):
            if self._worker.stopping:
                break
            if self._paused(name):
                continue  # neither formed nor sent; the dispatcher's read of pauses wakes it
            now = self._clock.now()
            free = self._capacity(target)
            if free <= 0:
                continue  # a finishing request wakes the loop
            if self._free_at.get(name, 0.0) <= now:
                await self._free_redriven(name, now)
            hook = target.hook
            if self._circuits.blocked([hook], now):
                at = self._circuits.next_probe_at(hook)
                if at is not None:
                    wait = min(wait, at - now)
                continue
            paced = self._paced.get(name, 0.0)
            if paced > now:
                wait = min(wait, paced - now)
                continue
            if self._circuits.is_open(hook):
                free = 1  # the probe
            if self._claim_at.get(name, 0.0) <= now:
                free -= await self._claim(target, free, now)
                if free <= 0:
                    again = True
                    continue
            wait = min(wait, self._claim_at.get(name, now + _IDLE_POLL) - now)
            form_at = self._form_at.get(name, 0.0)
            if form_at > now:
                wait = min(wait, form_at - now)
                continue
            notified = self._notified
            plan = await self._form(target, free, now)
            self._formed_at[name] = now
            if plan is not None and plan.more:
                again = True  # more were ready than slots were free: form when one is
                continue
            ends = now + _IDLE_POLL
            if plan is not None and plan.wake_at is not None:
                ends = min(ends, plan.wake_at)
            if plan is None or self._notified != notified:
                ends = min(ends, now + _REFORM)  # contended, or events came meanwhile
            self._form_at[name] = max(ends, now + _REFORM)
            wait = min(wait, self._form_at[name] - now)
        return 0.0 if again else max(0.0, wait)

    async def _free_redriven(self, name: str, now: float) -> None:
        """Redriven events of finished batches (efd redrive, POST /admin/redrive) are taken
        out of them, to be formed again: looked for every _FREE_CHECK seconds a route."""
        self._free_at[name] = now + _FREE_CHECK
        freed = await self._db.write(self._store.free_redriven, name)
        if freed:
            log.info("%d redriven events of %s wait for a new batch", freed, name)
            self._form_at[name] = 0.0

    async def _dissolve(self, batch: LeasedBatch, why: str = "") -> None:
        why = why or DISSOLVED
        try:
            await self._db.write(
                self._store.dissolve, batch.id, batch.lease_token, self._clock.now(), why
            )
        except StoreError as error:
            log.error("cannot dissolve batch %d: %s; its lease lapses", batch.id, error)
        self._held.held.pop(batch.id, None)
        log.info("batch %d: %s", batch.id, why)
        self.notify()

    async def _claim(self, target: _Target, free: int, now: float) -> int:
        """Lease the route's due batches (retries, and those a stop or a crash left) and
        start them; how many."""
        name = target.route.name
        request = ClaimRequest(
            name,
            free,
            owner=self._owner,
            now=now,
            lease_until=now + self._lease,
            lapsed_before=self._held.lapsed_before(now),
        )
        buckets = self._buckets.get(name)
        if buckets:
            claimed, left = await self._db.write(
                self._store.claim_limited, request, [b.row for b in buckets]
            )
            self._pace(name, buckets, left, now)
        else:
            claimed = await self._db.write(self._store.claim, request)
        if len(claimed) < free:
            self._claim_at[name] = now + _IDLE_POLL
        if not claimed:
            return 0
        try:
            members = await self._db.read(self._store.members, [b.id for b in claimed])
        except StoreError:
            # Not held, so not renewed: their leases lapse and they are claimed again.
            log.warning("cannot read the members of %d claimed batches", len(claimed))
            raise
        for batch in claimed:
            self._held.held[batch.id] = batch.lease_token
        for batch in claimed:
            rows = members.get(batch.id, ())
            if not rows:
                # No member (or its message) is stored any more, deleted by hand: nothing to
                # send for, and it ends without a request.
                gone = BatchOutcome(
                    batch.id,
                    batch.lease_token,
                    DeliveryStatus.FAILED.value,
                    batch.attempts,
                    batch.first_attempt_at or now,
                    None,
                    now,
                    "no member of the batch is stored any more",
                )
                self._worker.spawn(self._record(target, gone, []))
                continue
            if not batch.body or any(w.body is None for w in rows):
                # A deletion request purged one of its events (and emptied its body): the
                # others leave it unsent, for a new batch; the purged one then fails unsent.
                self._worker.spawn(self._dissolve(batch, PURGED_MEMBER))
                continue
            if any(w.status not in _OPEN for w in rows):
                # Some of its events were discarded by hand: it no longer carries what it
                # should. The others leave it unsent, for a new batch.
                self._worker.spawn(self._dissolve(batch))
                continue
            first = rows[0]
            sending = _Sending(
                batch,
                first.url,
                batchbody.first_event_length(batch.body)
                if target.policy.signature == batching.FIRST_EVENT
                else 0,
                min((w.since for w in rows), default=now),
                tuple(w.message_id for w in rows),
            )
            self._send(target, sending)
        return len(claimed)

    async def _form(self, target: _Target, free: int, now: float) -> Plan | None:
        """Form the batches ready now (at most `free`), recorded leased to this process,
        and start them; the plan, or None when another daemon was forming the route."""
        name, policy = target.route.name, target.policy
        found = _Formation()
        buckets = self._buckets.get(name, ())
        formed = await self._db.write(
            self._store.form,
            name,
            functools.partial(self._plan, target, free, now, found),
            ordered=target.ordered,
            limit=min(_READ_MAX, (free + 1) * policy.size),
            owner=self._owner,
            now=now,
            lease_until=now + self._lease,
            buckets=[b.row for b in buckets],
        )
        if buckets:
            self._pace(name, buckets, formed.tokens_left, now)
        for batch in formed.batches:
            self._held.held[batch.id] = batch.lease_token
            made = found.sending.get(batch.members)
            if made is None:  # not as planned: cannot be, the store records what it is given
                made = _Sending(batch, None, batchbody.first_event_length(batch.body), now)
            made.batch = batch
            self._send(target, made)
        if found.purged:
            failed = await self._db.write(
                self._store.fail_unbatched, name, found.purged, self._clock.now(), PURGED
            )
            if failed:
                self._metrics.failed[name] += failed
                log.error("%d messages to %s failed for good: %s", failed, name, PURGED)
        return None if formed.contended else found.plan

    def _plan(
        self, target: _Target, free: int, now: float, found: _Formation, candidates: Candidates
    ) -> list[NewBatch]:
        """Inside the forming transaction (the writer's thread): the batches to record."""
        route, policy = target.route, target.policy
        headers, hook, method = target.headers, target.hook, route.method
        waiting: dict[int, Waiting] = {}
        usable: list[Candidate] = []
        for w in candidates.waiting:
            if w.body is None:
                found.purged.append(w.delivery_id)
                continue
            waiting[w.delivery_id] = w
            key = batching.batch_key(policy.keys, w.url or hook, method, headers)
            lane = w.lane if target.ordered else None
            usable.append(Candidate(w.delivery_id, _encoded(w.body), key, lane, w.since))
        limit = free if candidates.allowed is None else min(free, candidates.allowed)
        plan = batching.form(usable, policy, now, busy=candidates.busy, limit=limit)
        found.plan = plan
        chosen = []
        for batch in plan.ready:
            rows = [waiting[pk] for pk in batch.delivery_ids]
            ids = [webhooks.route_webhook_id(route, _message(w)) for w in rows]
            chosen.append(
                NewBatch(batch.delivery_ids, batch.body, batching.webhook_id(route.name, ids))
            )
            found.sending[batch.delivery_ids] = _Sending(
                _UNRECORDED,
                rows[0].url,
                len(batch.members[0].body),
                batch.oldest,
                tuple(w.message_id for w in rows),
            )
        return chosen

    def _pace(
        self, name: str, buckets: tuple[ratelimit.Bucket, ...], left: float, now: float
    ) -> None:
        """After a claim or a formation under rate limits: with less than a token left, the
        route is not asked for again until a quantum's worth has accrued."""
        if left < 1.0:
            self._paced[name] = now + ratelimit.next_claim_in(buckets, left)
        else:
            self._paced.pop(name, None)

    # -- one request -------------------------------------------------------------------------

    def _send(self, target: _Target, sending: _Sending) -> None:
        batch = sending.batch
        hook = target.hook
        now = self._clock.now()
        if self._paused(target.route.name):
            # Paused while it was formed or claimed (the pass looked before those awaits):
            # given back unsent, and claimed again once the route is resumed.
            self._held.held.pop(batch.id, None)
            self._worker.spawn(self._release([(batch.id, batch.lease_token)], now))
            return
        if self._circuits.is_open(hook) and not self._circuits.take_probe(hook, now):
            # Its hook's circuit opened meanwhile: due again at the next probe, unsent.
            at = max(self._circuits.next_probe_at(hook) or now, now + 0.001)
            self._held.held.pop(batch.id, None)
            self._worker.spawn(self._release([(batch.id, batch.lease_token)], at))
            return
        self._in_flight += 1
        self._by_hook[hook] += 1
        first_event = (
            sending.first_event if target.policy.signature == batching.FIRST_EVENT else None
        )
        future = self._rounds.start_batch(
            target.route, batch.body, batch.webhook_id, sending.url, first_event
        )
        self._worker.track(future, functools.partial(self._answered, target, sending))

    async def _release(self, leases: list[tuple[int, int]], at: float) -> None:
        with contextlib.suppress(StoreError):  # else the lease lapses: due anyway
            await self._db.write(self._store.release, leases, at)

    def _answered(
        self, target: _Target, sending: _Sending, future: asyncio.Future[list[AttemptResult]]
    ) -> None:
        """A batch's request ended: free its slot, count it against the circuit, decide and
        record its outcome (not awaited), or split it after a 413."""
        self._in_flight -= 1
        self._by_hook[target.hook] -= 1
        self._worker.notify()  # a slot is free
        if future.cancelled():
            return  # stopped mid-request: the lease is released at the stop
        error = future.exception()
        if error is not None:
            log.error("a batch to %s failed", target.route.name, exc_info=error)
            return  # a bug, not the network: nothing recorded, the lease lapses
        results = future.result()
        batch, route = sending.batch, target.route
        now = self._clock.now()
        for result in results:
            change = self._circuits.record(result, now, batch.members[0] if batch.members else 0)
            if change is not None:
                reporting.circuit_changed(
                    self._metrics,
                    self._circuits,
                    [route],
                    result.hook_url,
                    change,
                    self._notices,
                    result,
                    now,
                )
        for result in results:
            self._metrics.observe_attempt(route.name, result.verdict.value, result.duration)
        if target.ordered:
            first = batch.first_attempt_at or sending.oldest
        else:
            first = batch.first_attempt_at or min((r.started_at for r in results), default=now)
        attempts = batch.attempts + (1 if results else 0)
        tried = [
            BatchAttempt(batch.id, row)
            for row in attempt_rows(route, batch.members[0] if batch.members else 0, results)
        ]
        if len(batch.members) > 1 and results and results[-1].status_code == batching.TOO_LARGE:
            outcome = BatchOutcome(
                batch.id, batch.lease_token, "split", attempts, first, None, now, SPLIT_413
            )
            log.warning(
                "a batch of %d events to %s was answered 413: split in two",
                len(batch.members),
                route.name,
            )
            self._worker.spawn(self._split(target, outcome, tried, batch.body))
            return
        decision = retry.decide(
            results,
            hooks=route.labels,
            failed_hooks=frozenset(),
            attempt=batch.attempts + 1,
            first_attempt_at=first,
            now=now,
            policy=self._policy,
            rng=self._rng,
        )
        status = decision.status
        outcome = BatchOutcome(
            batch.id,
            batch.lease_token,
            status.value,
            attempts,
            first,
            decision.next_attempt_at,
            None if status is DeliveryStatus.PENDING else now,
            decision.last_error,
        )
        self._report(route.name, batch, decision, now)
        if decision.next_attempt_at is not None:
            at = decision.next_attempt_at
            self._claim_at[route.name] = min(self._claim_at.get(route.name, math.inf), at)
        self._worker.spawn(self._record(target, outcome, tried, sending.message_ids))

    def _report(self, name: str, batch: LeasedBatch, decision: retry.Decision, now: float) -> None:
        count = len(batch.members)
        status = decision.status
        if status is DeliveryStatus.DELIVERED:
            self._metrics.delivered[name] += count
            log.debug("a batch of %d events delivered to %s", count, name)
        elif status is DeliveryStatus.PENDING:
            self._metrics.retried[name] += count
            log.info(
                "a batch of %d events to %s (%s): retry in %.1f s: %s",
                count,
                name,
                batch.webhook_id,
                (decision.next_attempt_at or now) - now,
                decision.last_error,
            )
        elif status is DeliveryStatus.FAILED:
            self._metrics.failed[name] += count
            log.error(
                "a batch of %d events to %s (%s) failed for good: %s",
                count,
                name,
                batch.webhook_id,
                decision.last_error,
            )
        else:
            self._metrics.expired[name] += count
            log.error(
                "a batch of %d events to %s (%s) expired: retry window closed after %d "
                "attempts: %s",
                count,
                name,
                batch.webhook_id,
                batch.attempts + 1,
                decision.last_error,
            )

    async def _record(
        self,
        target: _Target,
        outcome: BatchOutcome,
        tried: Sequence[BatchAttempt],
        message_ids: Sequence[str] = (),
    ) -> None:
        """Write the outcome (copied to every member); retried while the store cannot be
        reached, since losing it would send the batch again."""
        tries = 0
        backoff = Backoff()
        while True:
            try:
                stale = await self._db.write(self._store.record, [outcome], tried)
                break
            except StoreUnavailable as error:
                tries += 1
                if self._worker.stopping and tries >= 3:
                    log.error("giving up on a batch's outcome at shutdown: %s", error)
                    return
                await asyncio.sleep(backoff.next())
            except StoreError as error:
                self._held.held.pop(outcome.batch_id, None)  # not renewed: it lapses
                log.error(
                    "the store refused the outcome of batch %d to %s; it will be sent again: %s",
                    outcome.batch_id,
                    target.route.name,
                    error,
                )
                return
        if self._held.held.get(outcome.batch_id) == outcome.lease_token:
            del self._held.held[outcome.batch_id]
        if stale:
            self._metrics.stale_outcomes += stale
            log.warning("a batch's outcome arrived after its lease moved on; not applied")
        elif self._hub is not None and self._hub.active and tried:
            rows = [t.row for t in tried]
            name = target.route.name
            reporting.publish_attempts(self._hub, ((name, m, rows) for m in message_ids))
        if outcome.status != DeliveryStatus.PENDING.value:
            self.notify()  # its lanes moved on, and a slot's events may form
        elif outcome.next_attempt_at is not None and outcome.next_attempt_at <= self._clock.now():
            # Due while its outcome was on its way (until then its lease kept it from a claim).
            name = target.route.name
            self._claim_at[name] = min(self._claim_at.get(name, 0.0), outcome.next_attempt_at)
            self._worker.notify()

    async def _split(
        self,
        target: _Target,
        outcome: BatchOutcome,
        tried: Sequence[BatchAttempt],
        body: bytes,
    ) -> None:
        """After a 413: the batch's two halves recorded in its place and sent at once (on an
        ordered route only the first; the second's events are formed again after it). The
        halves' bodies are cut from the batch's own bytes. Whatever happens, the batch's
        own lease is no longer renewed: a split not recorded lets it lapse, to be sent again."""
        try:
            recorded, halves = await self._record_split(target, outcome, tried, body)
        finally:
            self._held.held.pop(outcome.batch_id, None)
        for batch in recorded:
            self._held.held[batch.id] = batch.lease_token
            url, first_event, ids = halves[batch.members]
            self._send(target, _Sending(batch, url, first_event, outcome.first_attempt_at, ids))
        if target.ordered:
            self.notify()

    async def _record_split(
        self,
        target: _Target,
        outcome: BatchOutcome,
        tried: Sequence[BatchAttempt],
        body: bytes,
    ) -> tuple[
        tuple[LeasedBatch, ...], dict[tuple[int, ...], tuple[str | None, int, tuple[str, ...]]]
    ]:
        route = target.route
        members = (await self._db.read(self._store.members, [outcome.batch_id])).get(
            outcome.batch_id, ()
        )
        elements = batchbody.elements(body)
        if elements is None or len(elements) != len(members):
            elements = [_encoded(w.body) if w.body is not None else b"null" for w in members]
        halves = batching.split(batching.TOO_LARGE, members, [len(e) for e in elements])
        if halves is None:
            return (), {}  # its members left it meanwhile (the lease lapsed)
        index = {w.delivery_id: e for w, e in zip(members, elements, strict=True)}
        made = tuple(
            NewBatch(
                tuple(w.delivery_id for w in half),
                batching.array([index[w.delivery_id] for w in half]),
                batching.webhook_id(
                    route.name, [webhooks.route_webhook_id(route, _message(w)) for w in half]
                ),
            )
            for half in halves
        )
        now = self._clock.now()
        backoff = Backoff()
        while True:
            try:
                recorded = await self._db.write(
                    self._store.split,
                    outcome,
                    (made[0], made[1]),
                    tried,
                    ordered=target.ordered,
                    owner=self._owner,
                    now=now,
                    lease_until=now + self._lease,
                )
                break
            except StoreUnavailable:
                if self._worker.stopping:
                    return (), {}
                await asyncio.sleep(backoff.next())
        if recorded is None:
            log.warning("a batch's 413 arrived after its lease moved on; not applied")
            return (), {}
        sending = {
            new.members: (
                half[0].url,
                len(index[half[0].delivery_id]),
                tuple(w.message_id for w in half),
            )
            for new, half in zip(made, halves, strict=True)
        }
        return recorded, sending


# What a batch planned in the forming transaction stands on until the store recorded it.
_UNRECORDED = LeasedBatch(0, 0, "", (), b"", "", 0, None)


def _encoded(body: str) -> bytes:
    return body.encode("utf-8", "surrogatepass")


def _message(w: Waiting) -> webhooks.MessageKey:
    return (w.message_pk, w.source, w.message_id, w.received_at)
