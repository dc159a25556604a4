"""The worker loop (efd.loop), on virtual time (tests/unit/clocks.py): what it waits for,
how it backs off on store errors, what a notify and a stop do, and how it holds its side
tasks."""

from __future__ import annotations

import asyncio
import logging
import math

import pytest

from efd.errors import StoreUnavailable
from efd.loop import SystemClock, Worker
from tests.unit.clocks import VirtualClock, virtual_loop

pytestmark = pytest.mark.virtual_time


class Steps:
    """A step that returns the waits it is given in turn (raising the exceptions among
    them) and records the clock's time at each call; `done` is set at the last one."""

    def __init__(self, clock: VirtualClock, script: list[float | Exception]) -> None:
        self.clock = clock
        self.script = list(script)
        self.times: list[float] = []
        self.done = asyncio.Event()

    async def __call__(self) -> float:
        self.times.append(self.clock.now())
        item = self.script.pop(0) if self.script else math.inf
        if not self.script:
            self.done.set()
        if isinstance(item, Exception):
            raise item
        return item


async def test_each_step_says_how_long_to_wait_before_the_next() -> None:
    clock = VirtualClock()
    steps = Steps(clock, [5.0, 0.0, 2.5, math.inf])
    worker = Worker(steps, name="test", clock=clock)
    worker.start()
    await steps.done.wait()
    await worker.stop()
    assert clock.waits == [5.0, 2.5, math.inf]  # no wait after a step that returned 0
    assert steps.times == [1_000.0, 1_005.0, 1_005.0, 1_007.5]


async def test_a_notify_ends_the_wait_at_once() -> None:
    clock = VirtualClock()
    steps = Steps(clock, [math.inf, math.inf])
    worker = Worker(steps, name="test", clock=clock)
    worker.start()
    while not clock.waits:
        await asyncio.sleep(0)
    assert worker.waking_at == math.inf  # waiting for a notify only
    worker.notify()
    await steps.done.wait()
    await worker.stop()
    assert steps.times == [1_000.0, 1_000.0]  # woken, not timed out


async def test_store_errors_back_off_doubling_and_a_success_resets_it(
    caplog: pytest.LogCaptureFixture,
) -> None:
    clock = VirtualClock()
    down = StoreUnavailable("connection refused")
    steps = Steps(clock, [down, down, down, 0.0, down, math.inf])
    worker = Worker(steps, name="test-loop", clock=clock)
    with caplog.at_level(logging.ERROR, logger="efd.loop"):
        worker.start()
        await steps.done.wait()
        await worker.stop()
    assert clock.waits == [0.5, 1.0, 2.0, 0.5, math.inf]
    assert worker.running is False
    messages = [r.getMessage() for r in caplog.records]
    assert messages[0] == "test-loop cannot reach the store: connection refused; retrying in 0.5 s"
    assert len(messages) == 4


async def test_only_the_errors_named_retry_on_count_as_the_store(
    caplog: pytest.LogCaptureFixture,
) -> None:
    clock = VirtualClock()
    steps = Steps(clock, [KeyError("x"), OSError("disk"), math.inf])
    worker = Worker(steps, name="test-loop", clock=clock, retry_on=(OSError,))
    with caplog.at_level(logging.ERROR, logger="efd.loop"):
        worker.start()
        await steps.done.wait()
        await worker.stop()
    # A bug in a step is logged with its traceback and retried; the loop lives on.
    first, second = caplog.records
    assert first.getMessage() == "test-loop: a step failed; retrying in 0.5 s"
    assert first.exc_info is not None
    assert isinstance(first.exc_info[1], KeyError)
    assert second.getMessage().startswith("test-loop cannot reach the store: disk")
    assert clock.waits == [0.5, 1.0, math.inf]


async def test_stop_lets_the_running_step_finish_and_runs_no_other() -> None:
    gate = asyncio.Event()
    entered = asyncio.Event()
    finished: list[str] = []

    async def step() -> float:
        entered.set()
        await gate.wait()
        finished.append("step")
        return 0.0

    worker = Worker(step, name="test", clock=VirtualClock())
    worker.start()
    await entered.wait()
    stopping = asyncio.create_task(worker.stop())
    await asyncio.sleep(0)
    assert not stopping.done()  # waits for the step
    gate.set()
    await stopping
    assert finished == ["step"]
    assert not worker.running


async def test_a_sleep_inside_a_step_ends_on_stop() -> None:
    clock = VirtualClock()
    slept = asyncio.Event()
    woke: list[bool] = []

    async def step() -> float:
        slept.set()
        await worker.sleep(math.inf)
        woke.append(worker.stopping)
        return 0.0

    worker = Worker(step, name="test", clock=clock)
    worker.start()
    await slept.wait()
    await worker.stop()
    assert woke == [True]
    assert worker.waking_at == 0.0  # not waiting any more


async def test_side_tasks_are_held_waited_for_and_logged_when_they_fail(
    caplog: pytest.LogCaptureFixture,
) -> None:
    release = asyncio.Event()
    outcomes: list[str] = []

    async def finishes() -> None:
        await release.wait()
        outcomes.append("finished")

    async def hangs() -> None:
        try:
            await asyncio.Event().wait()
        except asyncio.CancelledError:
            outcomes.append("cancelled")
            raise

    async def fails() -> None:
        raise RuntimeError("boom")

    async def step() -> float:
        worker.spawn(finishes())
        worker.spawn(fails())
        return math.inf

    worker = Worker(step, name="test-loop", clock=VirtualClock())
    with caplog.at_level(logging.ERROR, logger="efd.loop"):
        worker.start()
        while not caplog.records:  # the failed one is let go, the other held
            await asyncio.sleep(0)
        assert worker.side_tasks == 1
        release.set()
        while worker.side_tasks:
            await asyncio.sleep(0)
        worker.spawn(hangs())
        await asyncio.sleep(0)
        await worker.stop(grace=0)
    assert outcomes == ["finished", "cancelled"]
    assert worker.side_tasks == 0
    [record] = caplog.records
    assert record.getMessage() == "test-loop: a side task failed"
    assert record.exc_info is not None
    assert isinstance(record.exc_info[1], RuntimeError)


async def test_a_stop_waits_its_grace_for_tracked_futures_then_cancels_them() -> None:
    worker = Worker(Steps(VirtualClock(), []), name="test")
    loop = virtual_loop()
    answered: asyncio.Future[str] = loop.create_future()
    unanswered: asyncio.Future[str] = loop.create_future()
    seen: list[asyncio.Future[str]] = []
    worker.track(answered)
    worker.track(unanswered, seen.append)
    assert worker.side_tasks == 2
    loop.call_later(0.05, answered.set_result, "ok")
    await worker.stop(grace=0.5)
    assert loop.time() == pytest.approx(0.5)  # the whole grace, no more
    assert answered.result() == "ok"  # answered within the grace: waited for
    assert unanswered.cancelled()  # never answered: cancelled once the grace ran out
    await asyncio.sleep(0)  # done callbacks run at the loop's next turn
    assert worker.side_tasks == 0
    assert seen == [unanswered]  # its follow-up ran once, with the cancelled future


async def test_a_tracked_future_s_follow_up_runs_once_it_is_done() -> None:
    worker = Worker(Steps(VirtualClock(), []), name="test")
    future: asyncio.Future[str] = asyncio.get_running_loop().create_future()
    seen: list[tuple[str, int]] = []
    worker.track(future, lambda f: seen.append((f.result(), worker.side_tasks)))
    assert seen == []
    assert worker.side_tasks == 1
    future.set_result("answer")
    await asyncio.sleep(0)
    assert seen == [("answer", 0)]  # no longer held when its follow-up runs


async def test_the_system_clock_waits_for_the_event_or_the_timeout() -> None:
    clock = SystemClock()
    event = asyncio.Event()
    assert await clock.wait(event, 0.001) is False
    event.set()
    assert await clock.wait(event, 60) is True
    assert await clock.wait(event, math.inf) is True


@pytest.mark.parametrize("coalesce", [0.0, 0.001])
async def test_stop_before_start_and_twice_is_harmless(coalesce: float) -> None:
    worker = Worker(Steps(VirtualClock(), []), name="test", coalesce=coalesce)
    await worker.stop()
    assert not worker.running
    await worker.stop()
