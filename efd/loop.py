"""The one background-loop primitive every long-running part of efd runs on.

A `Worker` calls its `step` over and over; the step returns how long to wait before the next
call (0: at once, `math.inf`: until notified). Between steps it sleeps until `notify()`, the
step's due time, or `stop()`, whichever comes first. A store error from a step is logged and
the step retried after a growing delay; any other exception is logged with its traceback and
retried the same way, so one bad step never ends a loop the daemon depends on.

Work a step starts and does not await (a deferred release, a wake-up) is a side task:
`spawn` holds it until it ends and logs it if it crashed. Side tasks are one-off units of
work, so a crashed one is not restarted. A future the caller follows by a callback of its
own (a delivery round) is held with `track` instead. `stop(grace)` waits for both up to
`grace` seconds and cancels the rest.

Time is read through a `Clock`, so tests drive a loop with a fake one.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import math
import time
from collections.abc import Awaitable, Callable, Coroutine
from dataclasses import dataclass, field
from typing import Any, Protocol

from efd.errors import StoreError

log = logging.getLogger(__name__)

Step = Callable[[], Awaitable[float]]


class Clock(Protocol):
    """Where a loop reads the time and waits: the system's, or a test's."""

    def now(self) -> float:
        """Wall-clock seconds since the epoch (what the store's timestamps hold)."""
        ...

    def monotonic(self) -> float:
        """Seconds on a clock that never goes back, for intervals."""
        ...

    async def wait(self, event: asyncio.Event, timeout: float) -> bool:
        """Until `event` is set (True) or `timeout` seconds have passed (False)."""
        ...


class SystemClock:
    """The real clock: time.time, time.monotonic and the event loop's timers."""

    def now(self) -> float:
        return time.time()

    def monotonic(self) -> float:
        return time.monotonic()

    async def wait(self, event: asyncio.Event, timeout: float) -> bool:
        if math.isinf(timeout):
            await event.wait()
            return True
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(timeout):
                await event.wait()
                return True
        return False


SYSTEM_CLOCK = SystemClock()


def _let_go_then(
    side: set[asyncio.Future[Any]],
    then: Callable[[asyncio.Future[Any]], None],
    future: asyncio.Future[Any],
) -> None:
    side.discard(future)
    then(future)


class Worker:
    """Runs `step` until stopped (see the module's description).

    `retry_on` are the errors that mean the store cannot be reached now; `coalesce` is a
    pause after each wait, so that wake-ups arriving together make one step, not several.
    """

    def __init__(
        self,
        step: Step,
        *,
        name: str,
        clock: Clock = SYSTEM_CLOCK,
        retry_on: tuple[type[Exception], ...] = (StoreError,),
        coalesce: float = 0.0,
        backoff: Backoff | None = None,
    ) -> None:
        self.name = name
        self.clock = clock
        self._step = step
        self._retry_on = retry_on
        self._coalesce = coalesce
        self._backoff = backoff or Backoff()
        self._wake = asyncio.Event()
        self._stopping = False
        self._task: asyncio.Task[None] | None = None
        self._side: set[asyncio.Future[Any]] = set()
        self._waking_at = 0.0

    # -- lifecycle -------------------------------------------------------------------------

    def start(self) -> None:
        self._task = asyncio.create_task(self._run(), name=self.name)

    def notify(self) -> None:
        """Run the next step now rather than when the current wait ends."""
        self._wake.set()

    async def stop(self, grace: float = 0.0, *, interrupt: bool = False) -> None:
        """Let the running step finish (or cancel it: `interrupt`, for a step that only
        reports), then give side tasks `grace` seconds; cancel the rest."""
        self._stopping = True
        self._wake.set()
        if self._task is not None:
            if interrupt:
                self._task.cancel()
            await asyncio.wait([self._task])
        if self._side:
            _, pending = await asyncio.wait(set(self._side), timeout=grace)
            for task in pending:
                task.cancel()
            if pending:
                await asyncio.wait(pending)

    @property
    def stopping(self) -> bool:
        return self._stopping

    @property
    def running(self) -> bool:
        """Whether the loop is alive (started, and not yet returned)."""
        return self._task is not None and not self._task.done()

    @property
    def waking_at(self) -> float:
        """While the loop waits: the clock's `now()` at which it steps again by itself
        (infinite when only a notify wakes it); 0 while a step runs."""
        return self._waking_at

    @property
    def side_tasks(self) -> int:
        return len(self._side)

    # -- inside a step ---------------------------------------------------------------------

    async def sleep(self, seconds: float) -> None:
        """Wait `seconds`, or less if notified or stopped (for waits inside a step)."""
        if self._stopping or seconds <= 0:
            return
        self._waking_at = self.clock.now() + seconds
        try:
            await self.clock.wait(self._wake, seconds)
        finally:
            self._waking_at = 0.0

    def spawn(self, work: Coroutine[Any, Any, None], *, name: str | None = None) -> None:
        """Run `work` beside the loop, held until it ends; a crash is logged."""
        task = asyncio.create_task(work, name=name)
        self._side.add(task)
        task.add_done_callback(self._side_done)

    def track(
        self,
        future: asyncio.Future[Any],
        then: Callable[[asyncio.Future[Any]], None] | None = None,
    ) -> None:
        """Hold `future` like a side task: a stop waits for it, then cancels it. `then` is
        called with it once it is done (cancelled too), in the same callback that lets it
        go: one call scheduled per future, not two."""
        self._side.add(future)
        if then is None:
            future.add_done_callback(self._side.discard)
        else:
            future.add_done_callback(functools.partial(_let_go_then, self._side, then))

    def _side_done(self, task: asyncio.Task[None]) -> None:
        self._side.discard(task)
        if task.cancelled():
            return
        error = task.exception()
        if error is not None:
            log.error("%s: a side task failed", self.name, exc_info=error)

    # -- the loop --------------------------------------------------------------------------

    async def _run(self) -> None:
        while not self._stopping:
            self._wake.clear()
            try:
                wait = await self._step()
                self._backoff.reset()
            except self._retry_on as error:
                wait = self._backoff.next()
                log.error(
                    "%s cannot reach the store: %s; retrying in %.1f s", self.name, error, wait
                )
            except Exception:
                wait = self._backoff.next()
                log.exception("%s: a step failed; retrying in %.1f s", self.name, wait)
            if wait > 0 and not self._stopping:
                await self.sleep(wait)
                if self._coalesce > 0:
                    await asyncio.sleep(self._coalesce)
            else:
                await asyncio.sleep(0)


@dataclass
class Backoff:
    """The delays of a loop that retries something failing (a database, a child process):
    `initial`, doubling up to `maximum`; `reset()` after a success."""

    initial: float = 0.5
    maximum: float = 10.0
    _next: float = field(init=False, repr=False)

    def __post_init__(self) -> None:
        self._next = self.initial

    def next(self) -> float:
        delay = self._next
        self._next = min(self._next * 2, self.maximum)
        return delay

    def reset(self) -> None:
        self._next = self.initial
