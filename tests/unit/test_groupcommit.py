"""Group commit (efd/groupcommit.py): coalescing, results in order, failures, the pipelined
writer that takes its group in the writer thread. A real writer thread: each test waits for
what the thread did by an event it sets, never for a time."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor

import pytest

from efd.groupcommit import GroupCommit
from efd.store.runner import _WriterThread


class InThread:
    """A flush like ingestion's: it takes its group in the writer thread, and `write`s it
    there. Keeps the groups taken and counts the flushes handed to the thread; `until`
    waits for a condition on them, woken by each change."""

    def __init__(
        self, write: Callable[[list[int]], list[int]], executor: ThreadPoolExecutor | None = None
    ) -> None:
        self.executor = executor or ThreadPoolExecutor(1)
        self.write = write
        self.groups: list[list[int]] = []
        self.handed = 0
        self._loop = asyncio.get_running_loop()
        self._changed = asyncio.Event()

    async def flush(self, take: Callable[[], list[int]]) -> list[int]:
        def run() -> list[int]:
            items = take()
            if items:
                self.groups.append(items)
            self._loop.call_soon_threadsafe(self._changed.set)
            return self.write(items)

        self.handed += 1
        self._changed.set()
        return await self._loop.run_in_executor(self.executor, run)

    async def until(self, condition: Callable[[], bool]) -> None:
        async with asyncio.timeout(5):
            while not condition():
                self._changed.clear()
                await self._changed.wait()


async def test_concurrent_submissions_share_a_flush_and_get_their_own_results() -> None:
    gate = threading.Event()

    def write(items: list[int]) -> list[int]:
        gate.wait(5)  # the first flush holds on, so the rest queue up behind it
        return [i * 10 for i in items]

    writer = InThread(write)
    commit = GroupCommit(writer.flush, max_items=100, name="t")
    commit.start()
    first = asyncio.ensure_future(commit.submit([1]))
    await writer.until(lambda: len(writer.groups) == 1)
    rest = [asyncio.ensure_future(commit.submit([n, n + 1])) for n in (2, 4, 6)]
    await asyncio.sleep(0)  # each submission is queued at its first step
    gate.set()
    assert await first == [10]
    assert [await r for r in rest] == [[20, 30], [40, 50], [60, 70]]
    assert writer.groups == [[1], [2, 3, 4, 5, 6, 7]]
    await commit.close()
    writer.executor.shutdown()


async def test_max_items_splits_groups_between_submissions() -> None:
    gate = threading.Event()

    def write(items: list[int]) -> list[int]:
        gate.wait(5)
        return items

    writer = InThread(write)
    commit = GroupCommit(writer.flush, max_items=4, name="t")
    commit.start()
    first = asyncio.ensure_future(commit.submit([0]))
    await writer.until(lambda: len(writer.groups) == 1)
    rest = [asyncio.ensure_future(commit.submit([n] * 3)) for n in (1, 2, 3)]
    await asyncio.sleep(0)
    gate.set()
    await asyncio.gather(first, *rest)
    # A submission is never split; a group holds at most 4 items unless one alone is larger.
    assert writer.groups == [[0], [1, 1, 1], [2, 2, 2], [3, 3, 3]]
    await commit.close()
    writer.executor.shutdown()


async def test_next_flush_starts_in_the_writer_thread_while_the_loop_is_busy() -> None:
    """depth=2: the next flush is queued behind the running one, and takes what arrived
    meanwhile as soon as it runs, without waiting for the event loop to hear of the commit."""
    gate = threading.Event()
    second_written = threading.Event()
    writes = 0

    def write(items: list[int]) -> list[int]:
        nonlocal writes
        writes += 1
        if writes == 1:
            gate.wait(5)
        else:
            second_written.set()
        return [-i for i in items]

    writer = InThread(write)
    commit = GroupCommit(writer.flush, max_items=100, name="t", depth=2)
    commit.start()
    first = asyncio.ensure_future(commit.submit([1]))
    await writer.until(lambda: len(writer.groups) == 1)
    second = asyncio.ensure_future(commit.submit([2]))
    third = asyncio.ensure_future(commit.submit([3, 4]))
    await writer.until(lambda: writer.handed == 2)  # queued, behind the running flush
    gate.set()
    # The event loop is busy (blocked on purpose): it cannot start a flush itself.
    assert second_written.wait(5), "the second flush waited for the event loop"
    assert await first == [-1]
    assert await second == [-2]
    assert await third == [-3, -4]
    assert writer.groups == [[1], [2, 3, 4]]
    await commit.close()
    writer.executor.shutdown()


async def test_a_failing_group_is_retried_one_by_one_so_only_the_culprit_fails() -> None:
    gate = threading.Event()

    def write(items: list[int]) -> list[int]:
        gate.wait(5)
        if 13 in items:
            raise ValueError("unlucky")
        return items

    writer = InThread(write)
    commit = GroupCommit(writer.flush, max_items=100, name="t", depth=2)
    commit.start()
    first = asyncio.ensure_future(commit.submit([1]))
    await writer.until(lambda: len(writer.groups) == 1)
    good = asyncio.ensure_future(commit.submit([2]))
    bad = asyncio.ensure_future(commit.submit([13]))
    also_good = asyncio.ensure_future(commit.submit([3]))
    await asyncio.sleep(0)
    gate.set()
    assert await first == [1]
    assert await good == [2]
    with pytest.raises(ValueError, match="unlucky"):
        await bad
    assert await also_good == [3]
    assert writer.groups == [[1], [2, 13, 3], [2], [13], [3]]
    await commit.close()
    writer.executor.shutdown()


async def test_a_flush_that_fails_before_taking_fails_its_group_instead_of_hanging() -> None:
    executor = ThreadPoolExecutor(1)
    executor.shutdown()  # run_in_executor now raises before the writer thread takes anything
    commit = GroupCommit(InThread(list, executor).flush, max_items=100, name="t", depth=2)
    commit.start()
    async with asyncio.timeout(5):
        with pytest.raises(RuntimeError, match="shutdown"):
            await commit.submit([1, 2])
        await commit.close()


async def test_close_flushes_what_was_submitted_and_refuses_more() -> None:
    writer = InThread(list)
    commit = GroupCommit(writer.flush, max_items=100, name="t", depth=2)
    commit.start()
    commit.add([1, 2])
    commit.add([3])
    await commit.close()
    assert [i for group in writer.groups for i in group] == [1, 2, 3]
    with pytest.raises(RuntimeError, match="shutting down"):
        await commit.submit([4])
    writer.executor.shutdown()


def test_the_writer_thread_runs_later_work_only_when_nothing_else_waits() -> None:
    """Ingestion's flush queued ahead (`write_later`) must not delay a delivery's claim."""
    writer = _WriterThread()
    gate = threading.Event()
    order: list[str] = []
    running = writer.submit(lambda: gate.wait(5), later=False)
    flush = writer.submit(lambda: order.append("queued flush"), later=True)
    claim = writer.submit(lambda: order.append("claim"), later=False)
    failing = writer.submit(lambda: 1 / 0, later=False)
    gate.set()
    assert running.result(5) is True
    flush.result(5)
    claim.result(5)
    with pytest.raises(ZeroDivisionError):
        failing.result(5)
    assert order == ["claim", "queued flush"]
    last = writer.submit(lambda: order.append("last"), later=True)
    writer.shutdown()  # drains what was queued
    assert last.done()
    assert order[-1] == "last"
    with pytest.raises(RuntimeError, match="shutdown"):
        writer.submit(lambda: None, later=False)
