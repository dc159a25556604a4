"""Runs the synchronous Store off the event loop: one writer thread, a few reader threads.

One writer thread is the single writer SQLite wants (no lock contention, no busy
retries), and it keeps each PostgreSQL process to one writing connection.
"""

from __future__ import annotations

import asyncio
import functools
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import ParamSpec, TypeVar

from efd.store.sql import Store

P = ParamSpec("P")
R = TypeVar("R")


class AsyncStore:
    def __init__(self, store: Store) -> None:
        self.store = store
        self._writer = ThreadPoolExecutor(1, thread_name_prefix="efd-db-writer")
        self._reader = ThreadPoolExecutor(2, thread_name_prefix="efd-db-reader")

    async def write(self, fn: Callable[P, R], *args: P.args, **kwargs: P.kwargs) -> R:
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(self._writer, functools.partial(fn, *args, **kwargs))

    async def read(self, fn: Callable[P, R], *args: P.args, **kwargs: P.kwargs) -> R:
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(self._reader, functools.partial(fn, *args, **kwargs))

    def close(self) -> None:
        self._writer.shutdown(wait=True)
        self._reader.shutdown(wait=True)
        self.store.dispose()
