"""Runs the synchronous Store off the event loop: one writer thread, a few reader threads.

One writer thread is the single writer SQLite wants (no lock contention, no busy
retries), and it keeps each PostgreSQL process to one writing connection. It notes when a
write last failed (a store error): readiness (GET /readyz) learns of ingestion's failures
without adding work to any write that succeeds. A value the database refused
(StoreDataError) is the data's fault, not the store's, and is not noted.
"""

from __future__ import annotations

import asyncio
import functools
import math
import threading
import time
from collections import deque
from collections.abc import Callable, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any, ParamSpec, TypeVar

from efd.errors import StoreDataError, StoreError
from efd.records import AttemptRow, Claimed, ClaimRequest, Outcome
from efd.store import Store
from efd.store.database import edge
from efd.store.pauses import PauseRow
from efd.store.ratelimit import Buckets, HookTokens

P = ParamSpec("P")
R = TypeVar("R")


class _WriterThread:
    """One thread running writes in order, except that work queued as `later` runs only when
    nothing else waits. Ingestion queues its next flush ahead of time (efd/groupcommit.py);
    as `later` it cannot make a delivery's claim or outcome wait a whole commit longer."""

    def __init__(self) -> None:
        self._queues: tuple[deque[Any], deque[Any]] = (deque(), deque())  # (now, later)
        self._wake = threading.Condition()
        self._closed = False
        self.failed: tuple[float, str] | None = None  # the last store error: (when, what)
        self.turns = 0  # writes taken so far, the running one included
        self.ended = -math.inf  # when (time.monotonic) the last write before the running one ended
        self._thread = threading.Thread(target=self._loop, name="efd-db-writer", daemon=True)
        self._thread.start()

    def submit(self, fn: Callable[[], R], *, later: bool) -> Future[R]:
        future: Future[R] = Future()
        with self._wake:
            if self._closed:
                raise RuntimeError("cannot schedule new writes after shutdown")
            self._queues[later].append((fn, future))
            self._wake.notify()
        return future

    @property
    def waiting(self) -> int:
        """How many writes are queued for their turn (the running one left out)."""
        return len(self._queues[0]) + len(self._queues[1])

    def _loop(self) -> None:
        while True:
            with self._wake:
                while not (self._queues[0] or self._queues[1] or self._closed):
                    self._wake.wait()
                queue = self._queues[0] or self._queues[1]
                if not queue:
                    return  # closed and drained
                fn, future = queue.popleft()
                self.turns += 1
            if future.set_running_or_notify_cancel():
                try:
                    with edge():
                        result = fn()
                    future.set_result(result)
                except BaseException as error:
                    if isinstance(error, StoreError) and not isinstance(error, StoreDataError):
                        self.failed = (time.monotonic(), str(error).splitlines()[0][:200])
                    future.set_exception(error)
                self.ended = time.monotonic()

    def shutdown(self) -> None:
        """Finish what was queued, then stop."""
        with self._wake:
            self._closed = True
            self._wake.notify()
        self._thread.join()


class AsyncStore:
    """The store off the event loop: writes in order on one thread, reads on a small pool.
    Anything the driver raises reaches the caller as efd.errors.StoreError."""

    def __init__(self, store: Store) -> None:
        self.store = store
        self._writer = _WriterThread()
        self._reader = ThreadPoolExecutor(2, thread_name_prefix="efd-db-reader")

    async def write(self, fn: Callable[P, R], *args: P.args, **kwargs: P.kwargs) -> R:
        call = functools.partial(fn, *args, **kwargs)
        return await asyncio.wrap_future(self._writer.submit(call, later=False))

    async def write_later(self, fn: Callable[[], R]) -> R:
        """Like write, but after any other write that is waiting (see _WriterThread)."""
        return await asyncio.wrap_future(self._writer.submit(fn, later=True))

    @property
    def writes_waiting(self) -> int:
        """How many writes of this process wait for the writer, not counting the one it
        runs: from inside a write, the others queued behind it."""
        return self._writer.waiting

    @property
    def write_turns(self) -> int:
        """How many writes this process's writer has taken so far, the running one included:
        from inside a write, whether others ran since an earlier one."""
        return self._writer.turns

    @property
    def write_ended(self) -> float:
        """When (time.monotonic) the writer last ended a write: from inside a write, the one
        before it."""
        return self._writer.ended

    @property
    def write_failed(self) -> tuple[float, str] | None:
        """When (time.monotonic) a write last failed with a store error (not a refused
        value: StoreDataError), and the error's first line; None if none has."""
        return self._writer.failed

    async def read(self, fn: Callable[P, R], *args: P.args, **kwargs: P.kwargs) -> R:
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(
            self._reader, _at_edge, functools.partial(fn, *args, **kwargs)
        )

    def close(self) -> None:
        self._writer.shutdown()
        self._reader.shutdown(wait=True)
        self.store.dispose()


def _at_edge(call: Callable[[], R]) -> R:
    with edge():
        return call()


class AsyncDeliveries:
    """The dispatcher's `Deliveries` on the store: claims and outcomes through the writer
    thread, the due-time lookup on a reader."""

    def __init__(self, db: AsyncStore) -> None:
        self._db = db
        self._tokens = HookTokens(db.store.database, db.store.queue)

    async def claim_limited(
        self, request: ClaimRequest, buckets: Buckets
    ) -> tuple[list[Claimed], float]:
        return await self._db.write(self._tokens.claim, request, buckets)

    async def claim(self, request: ClaimRequest) -> list[Claimed]:
        return await self._db.write(self._db.store.queue.claim, request)

    async def renew(self, leases: Sequence[tuple[int, int]], until: float) -> list[int]:
        return await self._db.write(self._db.store.queue.renew, leases, until)

    async def record(self, outcomes: Sequence[Outcome], attempts: Sequence[AttemptRow]) -> int:
        return await self._db.write(self._db.store.queue.record, outcomes, attempts)

    async def release(self, leases: Sequence[tuple[int, int]], now: float) -> None:
        await self._db.write(self._db.store.queue.release, leases, now)

    async def next_due(self, destination: str) -> float | None:
        return await self._db.read(self._db.store.queue.next_due, destination)

    async def wake(self, destination: str, hook: Sequence[str], now: float) -> int:
        return await self._db.write(self._db.store.queue.wake, destination, hook, now)

    async def expire_waiting(self, destination: str, window: float, now: float) -> int:
        return await self._db.write(self._db.store.queue.expire_waiting, destination, window, now)


class AsyncPauses:
    """The dispatcher's `Pauses` (efd/delivery/pausing.py) on the store: the pauses read on
    a reader, the runs of failures written through the writer thread."""

    def __init__(self, db: AsyncStore) -> None:
        self._db = db
        self._pauses = db.store.pauses

    async def all(self) -> list[PauseRow]:
        return await self._db.read(self._pauses.all, failing=True)

    async def failing(self, destination: str, hook: int, began: float) -> PauseRow:
        return await self._db.write(self._pauses.failing, destination, hook, began)

    async def answered(self, destination: str, hook: int) -> bool:
        return await self._db.write(self._pauses.answered, destination, hook)

    async def disable(
        self, destination: str, hook: int, reason: str, started_before: float, now: float
    ) -> bool:
        return await self._db.write(
            self._pauses.disable, destination, hook, reason, started_before, now
        )
