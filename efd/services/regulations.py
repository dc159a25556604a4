"""The deletion-request runner: carries out the regulations the API recorded.

It works through each in steps, each its own transaction fenced by the regulation's lease:
one delete notification per user to every affected source's destinations (one transaction
per source, which also marks the source done), then for DELETE_ONLY and SUPPRESS_WITH_DELETE
the purge of the users' stored data. A regulation whose process died is taken over when its
lease lapses (at once on SQLite, at start-up), and resumes after the last finished step.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Callable, Sequence
from contextlib import AsyncExitStack
from datetime import UTC, datetime

from efd.config import Settings, SourceConfig
from efd.errors import LeaseLost, StoreError
from efd.loop import SYSTEM_CLOCK, Backoff, Clock, Worker
from efd.observe.metrics import Metrics
from efd.records import NewMessage, RegulationStatus
from efd.segment import webhooks
from efd.settings import Current
from efd.store.regulations import DELETE_TYPES, RegulationClaim, Regulations
from efd.store.runner import AsyncStore

log = logging.getLogger(__name__)

_POLL = 5.0  # seconds: how often other processes' regulations and lapsed leases are looked for
_PURGE_STEP = 20_000  # message pks per purge transaction


def delete_notifications(
    claim: RegulationClaim,
    source: str,
    destinations: Sequence[str],
    users: Sequence[str],
    now: float,
) -> list[NewMessage]:
    """One delete message per user to the source's destinations (docs/deletion.md): exactly type,
    userId and timestamp, the time of the request, so a resumed regulation sends the same
    bodies under the same messageIds."""
    when = datetime.fromtimestamp(claim.created_at, UTC)
    return [
        NewMessage(
            source=source,
            message_id=f"delete:{claim.id}:{n}",
            type="delete",
            user_id=user,
            anonymous_id=None,
            event=None,
            timestamp=claim.created_at,
            received_at=now,
            body=webhooks.encode(webhooks.delete_body(user, when)).decode("utf-8"),
            destinations=tuple(destinations),
        )
        for n, user in enumerate(users)
    ]


def notified_destinations(settings: Settings, source: SourceConfig) -> list[str]:
    """The source's destinations a delete notification goes to: all but the actions ones,
    which send only what their triggers match, and no trigger matches a delete (a delivery
    to one would wait for a route that never comes)."""
    kinds = {d.name: d.type for d in settings.destinations}
    return [name for name in source.destinations if kinds.get(name) != "actions"]


def sources_in_scope(settings: Settings, scope: str | None) -> list[SourceConfig]:
    return [s for s in settings.sources if scope is None or s.name == scope]


class RegulationRunner:
    """Claims regulations and works through them; several processes may run one each.

    Owns its worker loop and the regulation it holds the lease of (given back at a stop, so
    the next start resumes it). Every step is a transaction fenced by that lease. May not
    send: the delete notifications it stores are delivered by the dispatcher, like any
    message, which it wakes.
    """

    def __init__(
        self,
        *,
        db: AsyncStore,
        regulations: Regulations,
        settings: Current[Settings],
        metrics: Metrics,
        owner: str,
        on_notified: Callable[[], None],
        clock: Clock = SYSTEM_CLOCK,
    ) -> None:
        self._db = db
        self._clock = clock
        self._regulations = regulations
        self._settings = settings  # sources added or removed: regulations not yet past a
        # source see the change
        self._metrics = metrics
        self._owner = owner
        self._on_notified = on_notified
        self._lease = settings.value.delivery.lease_seconds
        self._worker = Worker(
            self._step, name="efd-regulations", clock=clock, retry_on=(StoreError,)
        )
        self._current: RegulationClaim | None = None

    async def start(self, stack: AsyncExitStack) -> None:
        self._worker.start()
        stack.push_async_callback(self.stop)

    def notify(self) -> None:
        self._worker.notify()

    async def stop(self) -> None:
        """Finish the current step, then give the regulation back for a quick resume."""
        await self._worker.stop()
        if self._current is not None:
            with contextlib.suppress(StoreError):
                await self._db.write(self._regulations.release_regulation, self._current)

    async def _step(self) -> float:
        """Claim a regulation and work through it; else look again after a poll."""
        now = self._clock.now()
        claim = await self._db.write(
            self._regulations.claim_regulation, self._owner, now, now + self._lease
        )
        if claim is None:
            return _POLL
        await self._work(claim)
        return 0.0

    def _until(self) -> float:
        return self._clock.now() + self._lease

    async def _work(self, claim: RegulationClaim) -> None:
        self._current = claim
        backoff = Backoff()
        try:
            while not self._worker.stopping:
                try:
                    await self._process(claim)
                    return
                except LeaseLost:
                    log.warning("regulation %s was taken over by another process", claim.id)
                    return
                except StoreError as error:
                    delay = backoff.next()
                    log.error(
                        "regulation %s: store error (%s); retrying in %.1f s",
                        claim.id,
                        error,
                        delay,
                    )
                    await self._worker.sleep(delay)
                except Exception as error:
                    log.exception("regulation %s failed", claim.id)
                    with contextlib.suppress(StoreError, LeaseLost):
                        await self._db.write(
                            self._regulations.finish_regulation,
                            claim,
                            RegulationStatus.FAILED,
                            claim.progress,
                            self._clock.now(),
                            f"{type(error).__name__}: {error}"[:1000],
                        )
                        self._metrics.regulations_finished[RegulationStatus.FAILED] += 1
                    return
        finally:
            if not self._worker.stopping:
                self._current = None

    async def _process(self, claim: RegulationClaim) -> None:
        db, store = self._db, self._regulations
        if claim.type in DELETE_TYPES:
            done = claim.progress.get("sources", {})
            for source in sources_in_scope(self._settings.value, claim.scope):
                if self._worker.stopping:
                    return
                notified = notified_destinations(self._settings.value, source)
                if source.name in done or not notified:
                    continue
                users = await db.read(store.requested_subjects, claim)
                now = self._clock.now()
                rows = delete_notifications(claim, source.name, notified, users, now)
                count = await db.write(
                    store.record_notifications,
                    claim,
                    source.name,
                    notified,
                    rows,
                    now=now,
                    lease_until=self._until(),
                )
                log.info(
                    "regulation %s: %d delete notifications queued for source %s",
                    claim.id,
                    count,
                    source.name,
                )
                self._on_notified()
            if not claim.progress.get("purge", {}).get("done"):
                await self._purge(claim)
        if self._worker.stopping:
            return
        await db.write(
            store.finish_regulation,
            claim,
            RegulationStatus.FINISHED,
            claim.progress,
            self._clock.now(),
        )
        self._metrics.regulations_finished[RegulationStatus.FINISHED] += 1
        log.info("regulation %s (%s) finished", claim.id, claim.type)

    async def _purge(self, claim: RegulationClaim) -> None:
        """Idempotent, so a resumed purge simply runs again; counts add up."""
        db, store = self._db, self._regulations
        await db.write(store.link_subjects, claim, self._until())
        top = await db.read(store.max_message_pk)
        for low in range(0, top, _PURGE_STEP):
            if self._worker.stopping:
                return
            high = min(low + _PURGE_STEP, top)
            await db.write(store.link_anonymous_ids, claim, low, high, self._until())
        purged = 0
        for low in range(0, top, _PURGE_STEP):
            if self._worker.stopping:
                return
            high = min(low + _PURGE_STEP, top)
            purged += await db.write(store.purge_messages, claim, low, high, self._until())
        counts = await db.write(store.purge_profiles, claim, self._until())
        log.info(
            "regulation %s: purged %d message payloads, %d profiles, %d events",
            claim.id,
            purged,
            counts["profiles"],
            counts["events"],
        )
