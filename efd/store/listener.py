"""The listener: wakes this process's dispatcher when any process stores due work, where
the backend can notify (LISTEN/NOTIFY); elsewhere polling and in-process wake-ups cover it.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Protocol

from efd.store.database import Database


class Listens(Protocol):
    available: bool

    async def listen(self, on_notify: Callable[[], None]) -> None: ...


class Listener:
    """Owns the one connection that waits for other processes' notifications. Reads and
    writes no table."""

    def __init__(self, database: Database) -> None:
        self._backend = database.backend
        self._url = database.url
        self.available = database.backend.notifies

    async def listen(self, on_notify: Callable[[], None]) -> None:
        """Open a connection and call `on_notify` once listening (for anything stored while
        nothing listened) and at each notification, until cancelled. Raises
        StoreUnavailable when the connection fails: the caller listens again after a
        pause, and polling covers the gap. Only where `available`."""
        await self._backend.listen(self._url, on_notify)
