"""Virtual time for unit tests: an event loop whose clock jumps to its next timer whenever
nothing is ready to run, and an efd.loop `Clock` that reads that loop's time.

A module opts in with `pytestmark = pytest.mark.virtual_time` (tests/unit/conftest.py gives
its tests this loop). Every `asyncio.sleep`, `call_later`, `asyncio.timeout` and `Clock.wait`
then ends as soon as everything else is idle, in order, without a real wait: a test of an
hour's poll takes no longer than one of a millisecond's, and a negative check ("nothing was
sent again by then") holds exactly, not by luck of the machine's speed.

While a thread works for the loop (`run_in_executor`, `asyncio.to_thread`) time does not jump:
it runs at the real pace, so a timeout cannot fire before the thread could answer.
"""

from __future__ import annotations

import asyncio
import selectors
import time
from collections.abc import Callable
from concurrent.futures import Executor, Future
from typing import Any, TypeVar, TypeVarTuple

from efd.loop import SYSTEM_CLOCK

# Far more turns than any test's burst of work takes without a timer running out.
SPIN_LIMIT = 20_000

T = TypeVar("T")
Ts = TypeVarTuple("Ts")


class _Selector(selectors.DefaultSelector):
    """Asked to block until the next timer, it moves the loop's time there instead, unless a
    file descriptor (the loop's wake-up pipe, a socket) is ready or a thread is at work."""

    def __init__(self, loop: VirtualTimeLoop) -> None:
        super().__init__()
        self._loop = loop

    def select(self, timeout: float | None = None) -> list[tuple[selectors.SelectorKey, int]]:
        if timeout is not None and timeout <= 0:
            self._loop.turned()
            return super().select(timeout)
        self._loop.spins = 0
        if timeout is None:
            return super().select(None)  # nothing scheduled: only I/O or a thread can wake
        ready = super().select(0)
        if ready:
            return ready
        if self._loop.threads_at_work:
            started = time.monotonic()
            ready = super().select(timeout)
            self._loop.advance(time.monotonic() - started if ready else timeout)
            return ready
        self._loop.advance(timeout)
        return []


class VirtualTimeLoop(asyncio.SelectorEventLoop):
    """An event loop on virtual time, which starts at 0 (see the module's description)."""

    def __init__(self) -> None:
        self._virtual = 0.0
        self.threads_at_work = 0
        self.spins = 0  # turns in a row with work ready: time stands still meanwhile
        super().__init__(_Selector(self))

    def turned(self) -> None:
        """A turn with work ready. Work that never lets time pass (a task that polls with
        `sleep(0)` until the time changes) would hold virtual time still for ever: it is a
        busy loop, so it fails the test, which would hang else."""
        self.spins += 1
        if self.spins > SPIN_LIMIT:
            self.spins = 0
            raise RuntimeError(
                f"the event loop turned {SPIN_LIMIT} times without waiting at virtual time "
                f"{self._virtual}: some task polls without waiting"
            )

    def time(self) -> float:
        return self._virtual

    def advance(self, seconds: float) -> None:
        self._virtual += seconds

    def run_in_executor(
        self, executor: Executor | None, func: Callable[[*Ts], T], *args: *Ts
    ) -> asyncio.Future[T]:
        future = super().run_in_executor(executor, func, *args)
        self.threads_at_work += 1
        future.add_done_callback(self._thread_done)
        return future

    def _thread_done(self, _: asyncio.Future[Any] | Future[Any]) -> None:
        self.threads_at_work -= 1


def virtual_loop() -> VirtualTimeLoop:
    """The running loop, which must be on virtual time (the module lacks the marker else)."""
    loop = asyncio.get_running_loop()
    assert isinstance(loop, VirtualTimeLoop), "mark the module with pytest.mark.virtual_time"
    return loop


class VirtualClock:
    """efd.loop's `Clock` on the running loop's virtual time: `now()` and `monotonic()` are
    `start` plus the loop's time; each timed wait a worker makes is recorded in `waits`."""

    def __init__(self, start: float = 1_000.0) -> None:
        self._loop = virtual_loop()
        self._start = start
        self.waits: list[float] = []

    @property
    def time(self) -> float:
        return self.now()

    def now(self) -> float:
        return self._start + self._loop.time()

    def monotonic(self) -> float:
        return self.now()

    async def wait(self, event: asyncio.Event, timeout: float) -> bool:
        self.waits.append(timeout)
        return await SYSTEM_CLOCK.wait(event, timeout)


async def advance(seconds: float) -> None:
    """Let `seconds` of virtual time pass: every timer due by then fires, in order, and
    each task runs as far as it can. Never a real wait (the loop must be virtual)."""
    loop = virtual_loop()
    passed: asyncio.Future[None] = loop.create_future()
    loop.call_later(seconds, passed.set_result, None)
    await passed
