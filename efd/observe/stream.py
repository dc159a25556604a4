"""The live stream's fan-out: accepted messages and recorded attempts, to each subscriber of
GET /admin/stream, never at the cost of ingestion or delivery.

Publishing is synchronous and cheap: with no subscriber it does nothing; otherwise each
subscriber takes at most `rate` events a second (beyond that it counts them and is told
`sampled {"dropped": N}` before its next event), into a buffer of `buffer` events. A
subscriber whose buffer is full is not reading fast enough: it is dropped, its connection
closed, and the publisher never waits for it. At most `max_subscribers` subscribe at once:
each costs every publish a little, so their number is bounded.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections import deque
from collections.abc import Callable
from typing import Any

RATE = 1000  # events a second per subscriber, beyond which it gets a sample
BUFFER = 2000  # events waiting for one subscriber, beyond which it is dropped
MAX_SUBSCRIBERS = 16  # at once; the console needs one per open tab


class Subscriber:
    def __init__(self, *, buffer: int, rate: int, on_drop: Callable[[], None]) -> None:
        self._buffer = buffer
        self._rate = rate
        self._on_drop = on_drop
        self._queue: deque[tuple[str, str]] = deque()
        self._ready = asyncio.Event()
        self._second = 0.0  # start of the current one-second budget
        self._taken = 0  # events taken in it
        self.dropped_events = 0  # not sent since the last `sampled`
        self.closed = False

    def take(self, now: float) -> bool:
        """Whether this second's budget has room for one more event (else it is counted
        as left out)."""
        if self.closed:
            return False
        if now - self._second >= 1.0:
            self._second, self._taken = now, 0
        if self._taken >= self._rate:
            self.dropped_events += 1
            return False
        self._taken += 1
        return True

    def put(self, kind: str, payload: str) -> None:
        """Queue an event `take` made room for, after a `sampled` if some were left out."""
        if self.dropped_events:
            self._put("sampled", json.dumps({"dropped": self.dropped_events}))
            self.dropped_events = 0
        self._put(kind, payload)

    def _put(self, kind: str, payload: str) -> None:
        if len(self._queue) >= self._buffer:
            self.close()
            self._on_drop()
            return
        self._queue.append((kind, payload))
        self._ready.set()

    def close(self) -> None:
        self.closed = True
        self._ready.set()

    async def next(self, timeout: float) -> list[tuple[str, str]] | None:
        """What is waiting (possibly nothing, after `timeout`); None once closed."""
        if not self._queue and not self.closed:
            self._ready.clear()
            try:
                async with asyncio.timeout(timeout):
                    await self._ready.wait()
            except TimeoutError:
                return []
        if self.closed:
            return None
        items = list(self._queue)
        self._queue.clear()
        return items


class Hub:
    def __init__(
        self,
        *,
        buffer: int = BUFFER,
        rate: int = RATE,
        max_subscribers: int = MAX_SUBSCRIBERS,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._buffer = buffer
        self._rate = rate
        self.max_subscribers = max_subscribers
        self._clock = clock
        self._subscribers: set[Subscriber] = set()
        self.dropped_subscribers = 0  # slow consumers cut off, since start

    @property
    def active(self) -> bool:
        """Whether anyone listens: publishers build events only then."""
        return bool(self._subscribers)

    @property
    def subscribers(self) -> int:
        return len(self._subscribers)

    def subscribe(self, on_drop: Callable[[], None]) -> Subscriber | None:
        """A new subscription, or None when `max_subscribers` are subscribed already."""
        if len(self._subscribers) >= self.max_subscribers:
            return None
        subscriber: Subscriber

        def dropped() -> None:
            self.dropped_subscribers += 1
            self._subscribers.discard(subscriber)
            on_drop()

        subscriber = Subscriber(buffer=self._buffer, rate=self._rate, on_drop=dropped)
        self._subscribers.add(subscriber)
        return subscriber

    def unsubscribe(self, subscriber: Subscriber) -> None:
        subscriber.close()
        self._subscribers.discard(subscriber)

    def close(self) -> None:
        """End every subscription (shutdown, a new admin token): their streams end cleanly.
        Later subscriptions are taken as before."""
        for subscriber in list(self._subscribers):
            self.unsubscribe(subscriber)

    def publish(self, kind: str, data: dict[str, Any] | Callable[[], dict[str, Any]]) -> None:
        """Offer an event to every subscriber; `data` may be a function building it, called
        only when some subscriber takes the event."""
        if not self._subscribers:
            return
        now = self._clock()
        takers = [s for s in self._subscribers if s.take(now)]
        if not takers:
            return  # over every subscriber's budget: not even serialised
        payload = json.dumps(data() if callable(data) else data)
        for subscriber in takers:
            subscriber.put(kind, payload)
