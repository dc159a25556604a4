"""The virtual time unit tests run on (tests/unit/clocks.py): timers fire in order at their
exact time without a real wait, a thread's work is waited for at the real pace, and a task
that spins without waiting fails instead of hanging."""

from __future__ import annotations

import asyncio
import threading
import time

import pytest

from tests.unit.clocks import VirtualClock, VirtualTimeLoop, advance, virtual_loop

pytestmark = pytest.mark.virtual_time


async def test_timers_fire_in_order_at_their_time_without_a_real_wait() -> None:
    loop = virtual_loop()
    fired: list[tuple[str, float]] = []
    started = time.monotonic()
    loop.call_later(3600, lambda: fired.append(("hour", loop.time())))
    loop.call_later(60, lambda: fired.append(("minute", loop.time())))
    await advance(7200)
    assert fired == [("minute", 60.0), ("hour", 3600.0)]
    assert loop.time() == 7200.0
    assert time.monotonic() - started < 5  # an hour and more, in no real time to speak of


async def test_the_clock_reads_the_loop_s_time_and_keeps_its_waits() -> None:
    clock = VirtualClock(start=1_000.0)
    assert await clock.wait(asyncio.Event(), 2.5) is False
    assert (clock.now(), clock.monotonic(), clock.waits) == (1_002.5, 1_002.5, [2.5])


async def test_a_timeout_does_not_run_out_while_a_thread_works_for_the_loop() -> None:
    # The thread answers when another thread lets it, some real time later: time must pass at
    # the real pace meanwhile, or the virtual minute below would run out at once.
    loop = virtual_loop()
    go = threading.Event()
    helper = threading.Timer(0.05, go.set)
    async with asyncio.timeout(60):
        answer = loop.run_in_executor(None, go.wait, 5)
        assert loop.threads_at_work == 1
        helper.start()
        assert await answer is True
    helper.join()
    assert 0 < loop.time() < 60  # the real time the thread took
    assert loop.threads_at_work == 0


def test_a_task_that_spins_without_waiting_fails_the_run() -> None:
    loop = VirtualTimeLoop()

    async def spin() -> None:
        while True:
            await asyncio.sleep(0)

    try:
        with pytest.raises(RuntimeError, match="some task polls without waiting"):
            loop.run_until_complete(spin())
    finally:
        for task in asyncio.all_tasks(loop):
            task.cancel()
        loop.run_until_complete(asyncio.sleep(0))
        loop.close()
