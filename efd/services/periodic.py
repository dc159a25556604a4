"""The coarse periodic jobs: retention, the lanes' tending, the audience and computed
trait syncs, and the operational events' look at backlogs and blocked lanes.

APScheduler runs them (memory job store), and each runs once per cluster per interval:
a process runs a job only after advancing its row in the `jobs` table, which one process
wins (efd/store/jobs.py, claim_job).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
import time
from collections.abc import Callable
from contextlib import AsyncExitStack
from datetime import UTC, datetime, timedelta
from typing import Any, TypeVar

from apscheduler.jobstores.base import JobLookupError
from apscheduler.schedulers.asyncio import AsyncIOScheduler

from efd.config import Settings
from efd.errors import StoreError
from efd.observe.metrics import Metrics
from efd.operations import events
from efd.operations.events import Crossings, Sink
from efd.personas.sync import (
    AUDIENCE,
    TRAIT,
    Computation,
    SyncResult,
    longest_lookback,
    run_sync,
)
from efd.services.pacing import SMALL_STEP, contended, look_again, may_step, next_step
from efd.settings import Current
from efd.store.computations import Computations
from efd.store.health import HealthStore
from efd.store.profiles import Profiles
from efd.store.runner import AsyncStore

log = logging.getLogger(__name__)
_T = TypeVar("_T")

# Waiting messages of lanes whose retry window closed expire within this (seconds).
LANES_EVERY = 30.0
_FIRST_RETENTION_DELAY = 30.0  # seconds after start-up, at most
_FIRST_SYNC_DELAY = 1.0  # seconds after start-up
_EVENT_MARGIN = 3600.0  # events are kept this much longer than the longest lookback


def _operations_every(settings: Settings) -> float:
    operations = settings.operations
    return 60.0 if operations is None else operations.check_interval_seconds


def computations(settings: Settings) -> list[Computation]:
    """The audiences and computed traits of a configuration."""
    found = [
        Computation(AUDIENCE, a.name, a.condition, tuple(a.destinations), a.sync_interval_seconds)
        for a in settings.audiences
    ]
    found += [
        Computation(TRAIT, t.name, t.expression, tuple(t.destinations), t.sync_interval_seconds)
        for t in settings.computed_traits
    ]
    return found


class Periodic:
    """The coarse periodic jobs on APScheduler: retention and the audience and computed
    trait syncs, each once per cluster per interval (the jobs table decides which process).

    Owns the scheduler and the syncs running now; rebuilds the sync jobs on a reload. May
    not send: what a sync stores is delivered by the dispatcher, which it wakes.
    """

    def __init__(
        self,
        *,
        settings: Current[Settings],
        db: AsyncStore,
        computations_store: Computations,
        profiles: Profiles,
        metrics: Metrics,
        owner: str,
        on_sent: Callable[[], None],
        notices: Sink | None = None,
    ) -> None:
        self._settings = settings
        # backlog.high and lane.blocked: this process's look, each told once per crossing.
        self._notices = notices
        self._crossings = Crossings()
        self._operations_every = _operations_every(settings.value)
        self._db = db
        self.computations = computations(settings.value)
        settings.subscribe(self._configure)
        self._computations = computations_store
        self._profiles = profiles
        self._metrics = metrics
        self._owner = owner
        self._on_sent = on_sent
        self._sync_locks: dict[str, asyncio.Lock] = {}
        self._sync_tasks: set[asyncio.Task[Any]] = set()
        self._scheduler: AsyncIOScheduler | None = None
        self._retention_every = settings.value.storage.retention_interval_seconds
        self._retention_run: asyncio.Task[None] | None = None
        # The last retention step: when it ended (time.monotonic) and how long it held the writer;
        # the writer's turn when retention last looked at it, and when another write last ended.
        self._last_end, self._last_step, self._last_look = -math.inf, 0.0, 0
        # Whether other writes wanted the writer during the last step, or queued behind it.
        self._forced = False
        self._others_ended = -math.inf

    async def start(self, stack: AsyncExitStack) -> None:
        scheduler = self._scheduler = AsyncIOScheduler()
        interval = self._retention_every = self._settings.value.storage.retention_interval_seconds
        scheduler.add_job(
            self._retention_job,
            "interval",
            seconds=interval,
            id="retention",
            next_run_time=datetime.now(UTC)
            + timedelta(seconds=min(interval, _FIRST_RETENTION_DELAY)),
            misfire_grace_time=max(60, math.ceil(interval)),
            coalesce=True,
        )
        scheduler.add_job(
            self.tend_lanes,
            "interval",
            seconds=LANES_EVERY,
            id="lanes",
            misfire_grace_time=30,
            coalesce=True,
        )
        scheduler.add_job(
            self._operations_job,
            "interval",
            seconds=self._operations_every,
            id="operations",
            misfire_grace_time=60,
            coalesce=True,
        )
        self._schedule_syncs()
        scheduler.start()
        stack.push_async_callback(self.stop)

    def _schedule_syncs(self) -> None:
        assert self._scheduler is not None
        first = datetime.now(UTC) + timedelta(seconds=_FIRST_SYNC_DELAY)
        for computation in self.computations:
            self._scheduler.add_job(
                self._sync_job,
                "interval",
                seconds=computation.interval,
                args=[computation],
                id=f"sync:{computation.store_key}",
                next_run_time=first,
                misfire_grace_time=max(60, math.ceil(computation.interval)),
                coalesce=True,
                replace_existing=True,
            )

    def _configure(self, settings: Settings) -> None:
        """Take the configuration's retention interval, and its audiences and computed
        traits: each is synced on its own interval from now on (first about a second from
        now; the jobs table still keeps it to once per cluster per interval). A sync running
        now finishes."""
        found = computations(settings)
        interval = settings.storage.retention_interval_seconds
        if self._scheduler is not None and interval != self._retention_every:
            self._scheduler.reschedule_job("retention", trigger="interval", seconds=interval)
        self._retention_every = interval
        every = _operations_every(settings)
        if self._scheduler is not None and every != self._operations_every:
            self._scheduler.reschedule_job("operations", trigger="interval", seconds=every)
        self._operations_every = every
        if self._scheduler is not None:
            for computation in self.computations:
                with contextlib.suppress(JobLookupError):
                    self._scheduler.remove_job(f"sync:{computation.store_key}")
        self.computations = found
        if self._scheduler is not None:
            self._schedule_syncs()

    async def stop(self) -> None:
        if self._scheduler is not None:
            self._scheduler.shutdown(wait=False)
        for task in list(self._sync_tasks):
            task.cancel()  # each committed chunk is consistent; the next sync carries on
        if self._sync_tasks:
            await asyncio.wait(list(self._sync_tasks))

    # -- retention ------------------------------------------------------------------------

    async def _retention_job(self) -> None:
        """The periodic retention, in a task of its own: a run longer than the interval
        goes on, and the turns that come meanwhile are let pass."""
        if self._retention_run is not None and not self._retention_run.done():
            return
        task = self._retention_run = asyncio.create_task(self._retention_logged())
        self._sync_tasks.add(task)
        task.add_done_callback(self._sync_tasks.discard)

    async def _retention_logged(self) -> None:
        try:
            await self.retention()
        except StoreError as error:
            log.warning("retention: cannot run now: %s", str(error).splitlines()[0][:200])

    async def retention(self) -> None:
        """Purge the messages whose deliveries all finished `retention_days` ago, with their
        deliveries and attempts, in short transactions that yield the writer to other writes
        down to a floor share (efd/services/pacing.py); then the events no lookback needs.
        Once per cluster per interval; one log line per run."""
        store = self._db.store
        now = time.time()
        if not await self._db.write(
            store.jobs.claim_job,
            "retention",
            interval=self._retention_every,
            owner=self._owner,
            now=now,
        ):
            return  # another process of the cluster has this turn
        days = self._settings.value.storage.retention_days
        before = now - days * 86400
        started = time.monotonic()
        purged, after = 0, 0
        # First the messages left at earlier runs because some work of theirs was pending,
        # then the walk on from where the last run stopped.
        while True:
            step = await self._step(store.retention.revisit, before, after, SMALL_STEP)
            if not step.looked_at:
                break
            purged, after = purged + step.purged, step.last
            self._metrics.retention_purged += step.purged
        limit = SMALL_STEP
        while True:
            step = await self._step(store.retention.advance, before, limit)
            if not step.looked_at:
                break
            purged += step.purged
            self._metrics.retention_purged += step.purged
            limit = next_step(step.looked_at, limit, forced=self._forced)
        lag = await self._db.read(store.retention.lag, before)
        self._metrics.retention_behind = lag.behind_seconds
        self._metrics.retention_kept = lag.kept
        log.info(
            "retention: purged %d messages finished more than %g days ago in %.1f s; "
            "%d kept for work still pending or recent; %.0f s behind",
            purged,
            days,
            time.monotonic() - started,
            lag.kept,
            lag.behind_seconds,
        )
        # Events: kept as long as the longest lookback needs; forever when one has none.
        lookback = longest_lookback(self.computations)
        if lookback is None:
            return
        total = await self._purge_events(now - lookback - _EVENT_MARGIN)
        if total:
            log.info("retention: purged %d events beyond the longest lookback", total)

    # -- operational events ---------------------------------------------------------------

    async def _operations_job(self) -> None:
        try:
            await self.check_operations()
        except StoreError as error:
            log.warning(
                "operational events: cannot look at the backlogs now: %s",
                str(error).splitlines()[0][:200],
            )

    async def check_operations(self, now: float | None = None) -> list[events.Event]:
        """Tell backlog.high for each configured destination whose backlog or oldest pending
        delivery crossed its threshold, and lane.blocked for each ordered one whose longest
        blocked lane did, once per crossing (every process looks: each tells what it saw).
        Returns the events told."""
        operations = self._settings.value.operations
        if operations is None or self._notices is None:
            return []
        now = time.time() if now is None else now
        store = self._db.store
        configured = self._settings.value.route_names()
        backlog = await self._db.read(HealthStore(store).backlog)
        blocked = await self._db.read(store.lanes.blocked)
        told: list[events.Event] = []
        seen: set[tuple[str, ...]] = set()
        for destination, (pending, oldest) in sorted(backlog.items()):
            if destination not in configured:
                continue
            age = None if oldest is None else max(0.0, now - oldest)
            key = (events.BACKLOG_HIGH, destination)
            seen.add(key)
            high = events.backlog_is_high(
                pending,
                age,
                backlog_high=operations.backlog_high,
                oldest_high_seconds=operations.oldest_pending_high_seconds,
            )
            if self._crossings.rose(key, high):
                told.append(
                    events.backlog_high(
                        destination,
                        pending=pending,
                        oldest_seconds=age,
                        backlog_high=operations.backlog_high,
                        oldest_high_seconds=operations.oldest_pending_high_seconds,
                        at=now,
                    )
                )
        for destination, lanes in sorted(blocked.items()):
            if destination not in configured:
                continue
            since = lanes.oldest_since
            waited = 0.0 if since is None else max(0.0, now - since)
            key = (events.LANE_BLOCKED, destination)
            seen.add(key)
            if self._crossings.rose(key, waited >= operations.lane_blocked_seconds):
                told.append(
                    events.lane_blocked(
                        destination,
                        lanes=lanes.count,
                        message_id=lanes.oldest_message_id,
                        blocked_seconds=waited,
                        threshold_seconds=operations.lane_blocked_seconds,
                        at=now,
                    )
                )
        self._crossings.keep(seen)
        for event in told:
            self._notices.emit(event)
        return told

    # -- lanes ------------------------------------------------------------------------------

    async def tend_lanes(self, now: float | None = None) -> tuple[dict[str, int], int]:
        """Expire the waiting messages of ordered destinations whose retry window closed
        (counted from receipt: nothing waits forever), and move on any lane whose head has
        an outcome but was not handed on (a process that recorded it without knowing the
        destination ordered). Once per cluster per interval. Returns ({destination:
        expired}, promoted)."""
        now = time.time() if now is None else now
        store = self._db.store
        try:
            if not await self._db.write(
                store.jobs.claim_job, "lanes", interval=LANES_EVERY, owner=self._owner, now=now
            ):
                return {}, 0
            settings = self._settings.value
            # A paused or disabled destination's lanes wait out the pause: its windows stand
            # still until it is resumed (docs/operators.md#pause-resume-and-auto-disable).
            touched = {row[0] for row in await self._db.read(store.pauses.all)}
            held = {r for d in settings.destinations if d.name in touched for r in d.route_names()}
            ordered = settings.ordered() - held
            window = settings.delivery.retry_window_seconds
            expired, promoted = await self._db.write(store.lanes.tend, ordered, window, now)
        except StoreError as error:
            log.warning("lanes: cannot tend them now: %s", str(error).splitlines()[0][:200])
            return {}, 0
        for name, count in expired.items():
            if count:
                self._metrics.expired[name] += count
                log.error(
                    "%d messages to %s waiting in lanes expired: their retry window closed",
                    count,
                    name,
                )
        if promoted:
            self._on_sent()
        return expired, promoted

    async def _purge_events(self, before: float) -> int:
        total, since = 0, None
        while True:
            purged, since = await self._step(self._profiles.purge_events, before, SMALL_STEP, since)
            if not purged:
                return total
            total += purged

    async def _step(self, write: Callable[..., _T], *args: Any) -> _T:
        """One step of retention, when the writer may take it (efd/services/pacing.py): the
        decision is made inside the writer, where the writes queued behind it are known, and
        a step that defers looks again shortly. Only this process's writes are seen: on
        PostgreSQL another daemon's ingestion does not make it yield."""
        while True:
            done = await self._db.write(self._yielding, write, *args)
            if done is not None:
                return done[0]
            await asyncio.sleep(look_again(self._last_step))

    def _yielding(self, write: Callable[..., _T], *args: Any) -> tuple[_T] | None:
        """In the writer: run the step, or None when it should leave the writer to others."""
        started, turn = time.monotonic(), self._db.write_turns
        if turn - self._last_look > 1:  # others wrote since retention last looked
            self._others_ended = self._db.write_ended
        self._last_look = turn
        quiet, since_last = started - self._others_ended, started - self._last_end
        waiting = self._db.writes_waiting
        if not may_step(waiting, quiet, since_last, self._last_step):
            return None
        forced = contended(waiting, quiet, self._last_step)
        result = write(*args)
        self._last_end = time.monotonic()
        self._last_step = self._last_end - started
        # A write that queued behind this step waited for all of it: the next one is short.
        self._forced = forced or self._db.writes_waiting > 0
        return (result,)

    # -- audiences and computed traits ------------------------------------------------------

    def computation(self, name: str) -> Computation:
        for computation in self.computations:
            if name in (computation.name, computation.key, computation.store_key):
                return computation
        raise KeyError(name)

    async def sync(self, computation: Computation, now: float | None = None) -> SyncResult:
        """Run one sync of `computation` now (never two of the same at once here)."""
        lock = self._sync_locks.setdefault(computation.store_key, asyncio.Lock())
        task = asyncio.current_task()
        if task is not None:
            self._sync_tasks.add(task)
        try:
            async with lock:
                result = await run_sync(
                    self._db, self._computations, computation, now, on_sent=self._on_sent
                )
        finally:
            if task is not None:
                self._sync_tasks.discard(task)
        self._metrics.personas_sent[computation.store_key] += result.sent
        log.info(
            "sync %s: %d profiles, %d identify messages, %d rows read, %.2f s",
            computation.store_key,
            result.evaluated,
            result.sent,
            result.rows_read,
            result.seconds,
        )
        return result

    async def _sync_job(self, computation: Computation) -> None:
        """The periodic sync: once per cluster per interval."""
        try:
            if not await self._db.write(
                self._db.store.jobs.claim_job,
                f"sync:{computation.store_key}",
                interval=computation.interval,
                owner=self._owner,
                now=time.time(),
            ):
                return  # another process of the cluster has this turn
            await self.sync(computation)
        except asyncio.CancelledError:
            raise
        except Exception as error:
            log.exception("sync %s failed", computation.store_key)
            with contextlib.suppress(StoreError):
                await self._db.write(
                    self._computations.fail_sync, computation.store_key, f"{error}"[:1000]
                )
