"""The outcome recorder: rounds' outcomes and attempts written in batches, each lease dropped
once its outcome is written.

An outcome may wait a moment for company (`LINGER_SECONDS`, or until `GATHER` are held): at
a rate where each round ends alone, each would otherwise be a transaction of its own, and a
transaction costs more than the rows in it. Nothing waits on an outcome meanwhile: the
round's slots were freed when the receivers answered, and its lease stays ours. An outcome
that hands a lane on is the exception (`urgent`): the lane's next message waits for it.

While the store is unreachable the batch is retried (losing outcomes would resend delivered
messages). A batch the store refuses outright is split until the refused outcome is found:
it is logged and left to its lease, which lapses, so its delivery is sent again; the rest
are written.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable

from efd.delivery import reporting
from efd.delivery.leases import Leases
from efd.delivery.ports import Deliveries
from efd.errors import StoreError, StoreUnavailable
from efd.groupcommit import GroupCommit
from efd.loop import Backoff
from efd.observe.metrics import Metrics
from efd.observe.stream import Hub
from efd.records import AttemptRow, Outcome

log = logging.getLogger(__name__)

# What is written for one round: its outcome, its attempts, destination, messageId.
Recorded = tuple[Outcome, list[AttemptRow], str, str]

LINGER_SECONDS = 0.02  # the longest an outcome waits for others to share its transaction
GATHER = 64  # outcomes held that go to the store at once, without waiting longer


class Recorder:
    """Owns the batches of outcomes on their way to the store. Knows the store by its
    `record` call, the leases it drops, and tells `written` what each batch wrote."""

    def __init__(
        self,
        deliveries: Deliveries,
        leases: Leases,
        metrics: Metrics,
        *,
        hub: Hub | None,
        stopping: Callable[[], bool],
        written: Callable[[list[Recorded]], None],
    ) -> None:
        self._deliveries = deliveries
        self._leases = leases
        self._metrics = metrics
        self._hub = hub  # the live stream, told of each recorded attempt
        self._stopping = stopping
        self._written = written
        self._linger = LINGER_SECONDS
        self._held: list[Recorded] = []  # waiting for company, not yet queued
        self._timer: asyncio.TimerHandle | None = None
        self._batches: GroupCommit[Recorded, None] = GroupCommit(
            self._record, max_items=2000, name="efd-outcome-recorder"
        )

    def start(self) -> None:
        self._batches.start()

    async def close(self) -> None:
        """Write everything added so far, then stop."""
        self._queue_held()
        await self._batches.close()

    def add(self, item: Recorded, *, urgent: bool = False) -> None:
        """Hold one round's outcome for the next batch (not awaited); `urgent`: queue it,
        and whatever is held, for the next transaction now."""
        self._held.append(item)
        if urgent or len(self._held) >= GATHER or self._linger <= 0:
            self._queue_held()
        elif self._timer is None:
            self._timer = asyncio.get_running_loop().call_later(self._linger, self._queue_held)

    def _queue_held(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        held, self._held = self._held, []
        if held:
            self._batches.add(held)

    async def _record(self, take: Callable[[], list[Recorded]]) -> list[None]:
        items = take()
        written = await self._write(items)
        for outcome, _, _, _ in written:
            self._leases.held.pop(outcome.delivery_id, None)
        self._written(written)
        if self._hub is not None and self._hub.active:
            reporting.publish_attempts(self._hub, ((d, m, rows) for _, rows, d, m in written))
        return [None] * len(items)

    async def _write(self, items: list[Recorded]) -> list[Recorded]:
        """Write outcomes and attempts; the items written (see the module's docstring)."""
        outcomes = [outcome for outcome, _, _, _ in items]
        rows = [row for _, attempt_rows, _, _ in items for row in attempt_rows]
        backoff = Backoff()
        tries = 0
        while True:
            try:
                stale = await self._deliveries.record(outcomes, rows)
                self._leases.database_answered()
                break
            except StoreUnavailable as error:
                self._leases.database_failed()
                # At shutdown, give up after a few tries: the leases lapse and the rounds are
                # sent again.
                tries += 1
                if self._stopping() and tries >= 3:
                    log.error("giving up on %d outcomes at shutdown: %s", len(items), error)
                    return []
                delay = backoff.next()
                log.error(
                    "cannot record %d outcomes: %s; retrying in %.1f s", len(items), error, delay
                )
                await asyncio.sleep(delay)
            except StoreError as error:
                if len(items) > 1:
                    half = len(items) // 2
                    return [*await self._write(items[:half]), *await self._write(items[half:])]
                outcome, _, destination, message_id = items[0]
                self._leases.held.pop(outcome.delivery_id, None)  # not renewed: it lapses
                log.error(
                    "the store refused the outcome of message %s to %s (delivery %d); it "
                    "will be sent again: %s",
                    message_id,
                    destination,
                    outcome.delivery_id,
                    error,
                )
                return []
        if stale:
            self._metrics.stale_outcomes += stale
            log.warning("%d outcomes arrived after their lease moved on; not applied", stale)
        return items
