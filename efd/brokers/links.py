"""One kept connection to one broker, opened again after it is lost, with a back-off after a
connect that failed: a broker that is down costs each publish to it nothing but a failure at
once, and never holds up another broker's publishes."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Awaitable, Callable
from typing import Generic, TypeVar

from efd.brokers.failures import TIMEOUT, PublishFailed

C = TypeVar("C")

BACKOFF_INITIAL = 0.5  # seconds after the first failed connect
BACKOFF_MAX = 30.0  # seconds: the longest wait between two connects


def backoff(failures: int) -> float:
    """Seconds before the next connect after `failures` failed ones in a row: doubling from
    BACKOFF_INITIAL up to BACKOFF_MAX."""
    return min(BACKOFF_MAX, BACKOFF_INITIAL * 2.0 ** min(max(0, failures - 1), 64))


class Link(Generic[C]):
    """A connection shared by every publish to one broker with the same credentials."""

    def __init__(
        self,
        opener: Callable[[], Awaitable[C]],
        alive: Callable[[C], bool],
        closer: Callable[[C], Awaitable[None]],
    ) -> None:
        self._open = opener
        self._alive = alive
        self._close = closer
        self._connection: C | None = None
        self._lock = asyncio.Lock()
        self._failures = 0
        self._next_try = 0.0
        self._last: PublishFailed | None = None
        self._closed = False
        self.connects = 0  # connections opened, for tests and metrics

    async def get(self, deadline: float) -> C:
        """The live connection, opened now if there is none, by `deadline` (loop time);
        PublishFailed if it cannot be, or if the back-off after the last failed connect
        has not run out (the same failure, and when the next connect is)."""
        connection = self._connection
        if connection is not None and self._alive(connection):
            return connection
        async with self._lock:
            connection = self._connection
            if connection is not None:
                if self._alive(connection):
                    return connection
                self._connection = None
                await self._quietly_close(connection)
            if self._closed:
                raise PublishFailed("interrupted", "the publisher is closed")
            loop = asyncio.get_running_loop()
            now = loop.time()
            if now < self._next_try and self._last is not None:
                raise PublishFailed(
                    self._last.error_class,
                    f"{self._last.reason} (next connect in {self._next_try - now:.1f} s)",
                )
            try:
                async with asyncio.timeout_at(deadline):
                    connection = await self._open()
            except TimeoutError:
                self._failed(PublishFailed(TIMEOUT, "no connection within the timeout"), now)
                raise self._last from None  # type: ignore[misc]
            except PublishFailed as failure:
                self._failed(failure, now)
                raise
            self._failures = 0
            self._last = None
            self.connects += 1
            self._connection = connection
            return connection

    def _failed(self, failure: PublishFailed, now: float) -> None:
        self._failures += 1
        self._last = failure
        self._next_try = now + backoff(self._failures)

    async def _quietly_close(self, connection: C) -> None:
        # A connection already lost may fail to close; nothing is owed to it.
        with contextlib.suppress(Exception):
            await self._close(connection)

    async def close(self) -> None:
        self._closed = True
        async with self._lock:
            connection, self._connection = self._connection, None
            if connection is not None:
                await self._quietly_close(connection)
