"""The operational events' emitter: what the dispatcher, the admin API and the periodic
checks notice becomes messages to the `[operations]` destination (efd/operations/events.py
has the rules), stored like any other and delivered by the dispatcher, which it wakes.

Each event is one log line and a count in efd_operations_events; the ones the Gate drops
are counted in efd_operations_events_dropped.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Callable
from contextlib import AsyncExitStack
from typing import Any

from efd.config import Settings
from efd.config.models import OperationsConfig
from efd.errors import StoreError
from efd.languages.filters import FilterSet
from efd.loop import SYSTEM_CLOCK, Clock, Worker
from efd.observe.metrics import Metrics
from efd.operations import events
from efd.operations.events import Event
from efd.records import NewMessage
from efd.segment.routing import ActionSet
from efd.settings import Current
from efd.store.runner import AsyncStore

log = logging.getLogger("efd.operations")

_MAX_WAITING = 10_000  # events held while the store cannot be written; older ones are dropped


def routing_of(
    settings: Settings, destination: str
) -> tuple[dict[str, FilterSet], dict[str, ActionSet]]:
    """The operations destination's filters and actions, as routing.shape takes them."""
    try:
        config = settings.destination(destination)
    except KeyError:
        return {}, {}
    filters = {destination: config.filter_set()} if config.filters else {}
    actions = {destination: config.action_set()} if config.type == "actions" else {}
    return filters, actions


def to_send(settings: Settings, event: Event, now: float) -> NewMessage | None:
    """The message of an event as `settings` route it, or None: no [operations], or the
    event is about the operations destination itself."""
    operations = settings.operations
    if operations is None or events.about_operations(event, operations.destination):
        return None
    filters, actions = routing_of(settings, operations.destination)
    return events.message(event, operations.destination, now, filters=filters, actions=actions)


def store_now(store: Any, settings: Settings, event: Event, now: float) -> bool:
    """For a process without the emitter (the CLI): store the event's message at once
    (`store`: efd.store.Store). Whether one was stored."""
    row = to_send(settings, event, now)
    if row is None:
        return False
    log.info(events.log_line(event))
    store.ingestion.insert_messages([row], now)
    return True


class Notices:
    """Takes events (events.Sink), bounds them with a Gate and stores them in the
    background, in order, each batch in one write; wakes the dispatcher after each.

    Owns its worker loop, the Gate (rebuilt when max_events_per_minute changes) and the
    messages not yet stored. May not send: the dispatcher does."""

    def __init__(
        self,
        *,
        db: AsyncStore,
        settings: Current[Settings],
        metrics: Metrics,
        on_stored: Callable[[], None],
        clock: Clock = SYSTEM_CLOCK,
    ) -> None:
        self._db = db
        self._settings = settings
        self._metrics = metrics
        self._on_stored = on_stored
        self._clock = clock
        self._gate = events.Gate(_cap(settings.value.operations))
        self._waiting: list[NewMessage] = []
        self._worker = Worker(self._step, name="efd-operations", clock=clock)

    async def start(self, stack: AsyncExitStack) -> None:
        self._worker.start()
        stack.push_async_callback(self.stop)

    async def stop(self) -> None:
        """Stop the loop, then store what is still waiting (best effort: the store may be
        gone)."""
        await self._worker.stop()
        if self._waiting:
            try:
                await self._db.write(
                    self._db.store.ingestion.insert_messages, self._waiting, self._clock.now()
                )
                self._waiting.clear()
            except StoreError as error:
                log.error("%d operational events were not stored: %s", len(self._waiting), error)

    def emit(self, event: Event) -> None:
        settings = self._settings.value
        operations = settings.operations
        if operations is None or events.about_operations(event, operations.destination):
            return
        if operations.max_events_per_minute != self._gate.per_minute:
            self._gate.per_minute = operations.max_events_per_minute
        now = self._clock.now()
        dropped = self._gate.dropped_total
        admitted = self._gate.admit(event, now)
        if self._gate.dropped_total != dropped:
            self._metrics.operations_dropped[event.name] += 1
        for one in admitted:
            self._queue(settings, one, now)
        self._worker.notify()

    def _queue(self, settings: Settings, event: Event, now: float) -> None:
        row = to_send(settings, event, now)
        if row is None:
            return
        log.warning(events.log_line(event))
        self._metrics.operations_events[event.name] += 1
        self._waiting.append(row)
        if len(self._waiting) > _MAX_WAITING:
            del self._waiting[: len(self._waiting) - _MAX_WAITING]

    async def _step(self) -> float:
        now = self._clock.now()
        for summary in self._gate.flush(now):
            self._queue(self._settings.value, summary, now)
        if self._waiting:
            rows = list(self._waiting)
            # A store error is the worker's to log and retry, with its backoff.
            await self._db.write(self._db.store.ingestion.insert_messages, rows, now)
            del self._waiting[: len(rows)]
            self._on_stored()
        due = self._gate.flush_due()
        return math.inf if due is None else max(0.0, due - self._clock.now())


def _cap(operations: OperationsConfig | None) -> int:
    return 60 if operations is None else operations.max_events_per_minute
