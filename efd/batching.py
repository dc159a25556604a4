"""Group commit: coalesce concurrent submissions into one call, so one transaction.

While a flush runs, new submissions queue up; the next flush takes them all. Under load
this turns many small transactions into few large ones with no added latency when idle.
"""

from __future__ import annotations

import asyncio
import logging
from collections import deque
from collections.abc import Awaitable, Callable, Sequence
from typing import Generic, TypeVar

T = TypeVar("T")
R = TypeVar("R")

log = logging.getLogger(__name__)


class GroupCommit(Generic[T, R]):
    def __init__(
        self,
        flush: Callable[[list[T]], Awaitable[Sequence[R]]],
        *,
        max_items: int,
        name: str,
    ) -> None:
        self._flush = flush
        self._max_items = max_items
        self._name = name
        self._pending: deque[tuple[list[T], asyncio.Future[list[R]] | None]] = deque()
        self._ready = asyncio.Event()
        self._closing = False
        self._task: asyncio.Task[None] | None = None

    def start(self) -> None:
        self._task = asyncio.create_task(self._run(), name=self._name)

    async def submit(self, items: list[T]) -> list[R]:
        """Flush `items` with whatever else is waiting; return their results in order."""
        if self._closing:
            raise RuntimeError(f"{self._name} is shutting down")
        future: asyncio.Future[list[R]] = asyncio.get_running_loop().create_future()
        self._pending.append((items, future))
        self._ready.set()
        return await future

    def add(self, items: list[T]) -> None:
        """Queue `items` for the next flush without waiting for it (no results, no future:
        for callers that learn the outcome some other way)."""
        if self._closing:
            raise RuntimeError(f"{self._name} is shutting down")
        self._pending.append((items, None))
        self._ready.set()

    async def close(self) -> None:
        """Flush everything submitted so far, then stop."""
        self._closing = True
        self._ready.set()
        if self._task is not None:
            await self._task

    async def _run(self) -> None:
        while True:
            await self._ready.wait()
            self._ready.clear()
            while self._pending:
                group: list[tuple[list[T], asyncio.Future[list[R]] | None]] = []
                count = 0
                while self._pending and (
                    not group or count + len(self._pending[0][0]) <= self._max_items
                ):
                    entry = self._pending.popleft()
                    group.append(entry)
                    count += len(entry[0])
                await self._flush_group(group)
            if self._closing:
                return

    async def _flush_group(
        self, group: list[tuple[list[T], asyncio.Future[list[R]] | None]]
    ) -> None:
        items = [item for entry, _ in group for item in entry]
        try:
            results = await self._flush(items)
        except Exception as error:
            if len(group) == 1:
                future = group[0][1]
                if future is None:
                    log.error("%s: %d items not flushed: %s", self._name, len(items), error)
                elif not future.done():
                    future.set_exception(error)
                return
            # One submission may be to blame: retry each alone, so only it fails.
            log.warning(
                "%s: group of %d failed (%s); retrying one by one", self._name, len(group), error
            )
            for single in group:
                await self._flush_group([single])
            return
        offset = 0
        for submitted, result_future in group:
            if result_future is not None and not result_future.done():
                result_future.set_result(list(results[offset : offset + len(submitted)]))
            offset += len(submitted)
