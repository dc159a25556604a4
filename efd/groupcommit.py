"""Group commit: coalesce concurrent submissions into one call, so one transaction.

While a flush runs, new submissions queue up; the next flush takes them all. Under load
this turns many small transactions into few large ones with no added latency when idle.

The flush takes its group itself, by calling `take()` at the moment it writes. With
`depth` 2 the next flush is already queued behind the running one (in the store's writer
thread), so it starts the moment the last commit ends and takes everything that arrived
meanwhile. With one flush at a time, the writer would wait for the event loop to hear of
each commit, and under load the loop hears late: behind every request queued before it.
"""

from __future__ import annotations

import asyncio
import logging
import math
import threading
from collections import deque
from collections.abc import Awaitable, Callable, Sequence
from typing import Generic, TypeVar

from efd.loop import Worker

T = TypeVar("T")
R = TypeVar("R")

log = logging.getLogger(__name__)

_Entry = tuple[list[T], "asyncio.Future[list[R]] | None"]


class _Take(Generic[T, R]):
    """Removes the next group from the queue when first called, and remembers it."""

    def __init__(
        self,
        pending: deque[_Entry[T, R]],
        lock: threading.Lock,
        max_items: int,
        fixed: list[_Entry[T, R]] | None,
    ) -> None:
        self._pending = pending
        self._lock = lock
        self._max_items = max_items
        self.group: list[_Entry[T, R]] = fixed or []
        self.taken = fixed is not None

    def __call__(self) -> list[T]:
        if not self.taken:
            self.taken = True
            # A take may run in the writer thread while the loop appends (atomic) or another
            # flush takes: the lock keeps a peek and its popleft together.
            with self._lock:
                pending, count = self._pending, 0
                while pending and (not self.group or count + len(pending[0][0]) <= self._max_items):
                    entry = pending.popleft()
                    self.group.append(entry)
                    count += len(entry[0])
        return [item for items, _ in self.group for item in items]


class GroupCommit(Generic[T, R]):
    """`flush(take)` writes the items `take()` returns (maybe none; a second call returns
    the same) and returns their results in order. `take` may be called from any thread."""

    def __init__(
        self,
        flush: Callable[[Callable[[], list[T]]], Awaitable[Sequence[R]]],
        *,
        max_items: int,
        name: str,
        depth: int = 1,
    ) -> None:
        self._flush = flush
        self._max_items = max_items
        self._name = name
        self._depth = depth
        self._pending: deque[_Entry[T, R]] = deque()
        self._take_lock = threading.Lock()
        self._closing = False
        self._flushing = 0  # flushes started and not yet ended (at most `depth`)
        self._drained = asyncio.Event()  # closing, and everything submitted was flushed
        # Each step starts the flushes there is room for, as side tasks; a submission or a
        # flush that ends notifies it.
        self._worker = Worker(self._step, name=name)

    def start(self) -> None:
        self._worker.start()

    async def submit(self, items: list[T]) -> list[R]:
        """Flush `items` with whatever else is waiting; return their results in order."""
        if self._closing:
            raise RuntimeError(f"{self._name} is shutting down")
        future: asyncio.Future[list[R]] = asyncio.get_running_loop().create_future()
        self._pending.append((items, future))
        self._worker.notify()
        return await future

    def add(self, items: list[T]) -> None:
        """Queue `items` for the next flush without waiting for it (no results, no future:
        for callers that learn the outcome some other way)."""
        if self._closing:
            raise RuntimeError(f"{self._name} is shutting down")
        self._pending.append((items, None))
        self._worker.notify()

    async def close(self) -> None:
        """Flush everything submitted so far, then stop."""
        self._closing = True
        if self._worker.running:
            self._worker.notify()
            await self._drained.wait()
        await self._worker.stop()

    async def _step(self) -> float:
        while self._pending and self._flushing < self._depth:
            self._flushing += 1
            self._worker.spawn(self._flush_next(), name=f"{self._name} flush")
        if self._closing and not self._pending and not self._flushing:
            self._drained.set()
        return math.inf

    async def _flush_next(self) -> None:
        try:
            await self._flush_group(None)
        finally:
            self._flushing -= 1
            self._worker.notify()

    async def _flush_group(self, fixed: list[_Entry[T, R]] | None) -> None:
        take = _Take(self._pending, self._take_lock, self._max_items, fixed)
        try:
            results = await self._flush(take)
        except Exception as error:
            take()  # if the flush failed before taking, the group it would have taken fails
            group = take.group
            if len(group) == 1:
                future = group[0][1]
                if future is None:
                    count = len(group[0][0])
                    log.error("%s: %d items not flushed: %s", self._name, count, error)
                elif not future.done():
                    future.set_exception(error)
                return
            if not group:
                return
            # One submission may be to blame: retry each alone, so only it fails.
            log.warning(
                "%s: group of %d failed (%s); retrying one by one", self._name, len(group), error
            )
            for single in group:
                await self._flush_group([single])
            return
        offset = 0
        for submitted, result_future in take.group:
            if result_future is not None and not result_future.done():
                result_future.set_result(list(results[offset : offset + len(submitted)]))
            offset += len(submitted)
