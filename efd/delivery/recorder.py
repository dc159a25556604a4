"""The outcome recorder: rounds' outcomes and attempts written in batches, each lease dropped
once its outcome is written.

While the store is unreachable the batch is retried (losing outcomes would resend delivered
messages). A batch the store refuses outright is split until the refused outcome is found:
it is logged and left to its lease, which lapses, so its delivery is sent again; the rest
are written.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable

from efd.batching import GroupCommit
from efd.delivery import reporting
from efd.delivery.leases import Leases
from efd.delivery.ports import Deliveries
from efd.errors import StoreError, StoreUnavailable
from efd.observe.metrics import Metrics
from efd.observe.stream import Hub
from efd.rows import AttemptRow, Outcome
from efd.rules.retry import Backoff

log = logging.getLogger(__name__)

# What is written for one round: its outcome, its attempts, destination, messageId.
Recorded = tuple[Outcome, list[AttemptRow], str, str]


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
        self._batches: GroupCommit[Recorded, None] = GroupCommit(
            self._record, max_items=2000, name="efd-outcome-recorder"
        )

    def start(self) -> None:
        self._batches.start()

    async def close(self) -> None:
        """Write everything added so far, then stop."""
        await self._batches.close()

    def add(self, item: Recorded) -> None:
        """Queue one round's outcome for the next batch (not awaited)."""
        self._batches.add([item])

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
