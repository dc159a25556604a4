"""The staggered race in which the sender opens a connection to one of a host's addresses
(Happy Eyeballs): an address that never answers delays a POST by one attempt delay, not by
the whole deadline.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Coroutine, Sequence
from typing import Any, TypeVar

ATTEMPT_DELAY = 0.25  # seconds before the next address is tried beside a pending one

T = TypeVar("T")


async def race(
    attempts: Sequence[Callable[[], Coroutine[Any, Any, T]]],
    delay: float,
    *,
    discard: Callable[[T], object],
    final: Callable[[Exception], bool],
) -> T:
    """The result of the first of `attempts` to succeed. They start in order, each `delay`
    seconds after the one before or at once when one fails, and the earlier ones keep
    running beside it. When one succeeds the others are cancelled, and `discard` gets the
    result of any that succeeds all the same. An error `final` says is final ends the race
    at once; when every attempt has failed, the last failure is raised."""
    if not attempts:
        raise ValueError("no attempt to race")
    loop = asyncio.get_running_loop()
    tasks: list[asyncio.Task[T]] = []
    running: set[asyncio.Task[T]] = set()
    winner: asyncio.Task[T] | None = None
    failure: Exception | None = None
    start_next = True
    next_at = 0.0

    def settle(task: asyncio.Task[T]) -> None:
        if task.cancelled():
            return
        if task.exception() is None:  # retrieved either way, so never logged as lost
            discard(task.result())

    try:
        while True:
            if start_next and len(tasks) < len(attempts):
                task = loop.create_task(attempts[len(tasks)]())
                tasks.append(task)
                running.add(task)
                next_at = loop.time() + delay
            if not running:
                assert failure is not None  # every attempt started, and each failed
                raise failure
            timeout = max(0.0, next_at - loop.time()) if len(tasks) < len(attempts) else None
            done, running = await asyncio.wait(
                running, timeout=timeout, return_when=asyncio.FIRST_COMPLETED
            )
            start_next = not done  # the delay passed
            for task in tasks:
                if task not in done:
                    continue
                try:
                    result = task.result()
                except Exception as error:
                    if final(error):
                        raise
                    failure = error
                    start_next = True
                    continue
                winner = task
                return result
    finally:
        for task in tasks:
            if task is not winner:
                task.cancel()  # a no-op on a task already done
                task.add_done_callback(settle)
