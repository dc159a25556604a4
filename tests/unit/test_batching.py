"""Group commit (efd/groupcommit.py): coalescing, results in order, failures, the pipelined
writer that takes its group in the writer thread."""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Awaitable, Callable
from concurrent.futures import ThreadPoolExecutor

import pytest

from efd.groupcommit import GroupCommit
from efd.store.runner import _WriterThread

Flush = Callable[[Callable[[], list[int]]], Awaitable[list[int]]]


def in_thread(
    executor: ThreadPoolExecutor, write: Callable[[list[int]], list[int]], groups: list[list[int]]
) -> Flush:
    """A flush like ingestion's: it takes its group in the writer thread."""

    async def flush(take: Callable[[], list[int]]) -> list[int]:
        def run() -> list[int]:
            items = take()
            if items:
                groups.append(items)
            return write(items)

        return await asyncio.get_running_loop().run_in_executor(executor, run)

    return flush


async def until(condition: Callable[[], bool], timeout: float = 5.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, "condition not reached"
        await asyncio.sleep(0.005)


async def test_concurrent_submissions_share_a_flush_and_get_their_own_results() -> None:
    executor = ThreadPoolExecutor(1)
    groups: list[list[int]] = []
    gate = threading.Event()

    def write(items: list[int]) -> list[int]:
        gate.wait(5)  # the first flush holds on, so the rest queue up behind it
        return [i * 10 for i in items]

    commit = GroupCommit(in_thread(executor, write, groups), max_items=100, name="t")
    commit.start()
    first = asyncio.ensure_future(commit.submit([1]))
    await until(lambda: len(groups) == 1)
    rest = [asyncio.ensure_future(commit.submit([n, n + 1])) for n in (2, 4, 6)]
    await asyncio.sleep(0.01)
    gate.set()
    assert await first == [10]
    assert [await r for r in rest] == [[20, 30], [40, 50], [60, 70]]
    assert groups == [[1], [2, 3, 4, 5, 6, 7]]
    await commit.close()
    executor.shutdown()


async def test_max_items_splits_groups_between_submissions() -> None:
    executor = ThreadPoolExecutor(1)
    groups: list[list[int]] = []
    gate = threading.Event()

    def write(items: list[int]) -> list[int]:
        gate.wait(5)
        return items

    commit = GroupCommit(in_thread(executor, write, groups), max_items=4, name="t")
    commit.start()
    first = asyncio.ensure_future(commit.submit([0]))
    await until(lambda: len(groups) == 1)
    rest = [asyncio.ensure_future(commit.submit([n] * 3)) for n in (1, 2, 3)]
    await asyncio.sleep(0.01)
    gate.set()
    await asyncio.gather(first, *rest)
    # A submission is never split; a group holds at most 4 items unless one alone is larger.
    assert groups == [[0], [1, 1, 1], [2, 2, 2], [3, 3, 3]]
    await commit.close()
    executor.shutdown()


async def test_next_flush_starts_in_the_writer_thread_while_the_loop_is_busy() -> None:
    """depth=2: the next flush is queued behind the running one, and takes what arrived
    meanwhile as soon as it runs, without waiting for the event loop to hear of the commit."""
    executor = ThreadPoolExecutor(1)
    groups: list[list[int]] = []
    starts: list[float] = []
    gate = threading.Event()

    def write(items: list[int]) -> list[int]:
        starts.append(time.monotonic())
        if len(starts) == 1:
            gate.wait(5)
        return [-i for i in items]

    commit = GroupCommit(in_thread(executor, write, groups), max_items=100, name="t", depth=2)
    commit.start()
    first = asyncio.ensure_future(commit.submit([1]))
    await until(lambda: len(groups) == 1)
    second = asyncio.ensure_future(commit.submit([2]))
    third = asyncio.ensure_future(commit.submit([3, 4]))
    await asyncio.sleep(0.01)  # both are queued, behind the running flush
    gate.set()
    # The event loop is busy (blocked on purpose): it cannot start a flush itself.
    time.sleep(0.3)  # noqa: ASYNC251
    loop_free = time.monotonic()
    assert await first == [-1]
    assert await second == [-2]
    assert await third == [-3, -4]
    assert groups == [[1], [2, 3, 4]]
    assert starts[1] < loop_free, "the second flush waited for the event loop"
    await commit.close()
    executor.shutdown()


async def test_a_failing_group_is_retried_one_by_one_so_only_the_culprit_fails() -> None:
    executor = ThreadPoolExecutor(1)
    groups: list[list[int]] = []
    gate = threading.Event()

    def write(items: list[int]) -> list[int]:
        gate.wait(5)
        if 13 in items:
            raise ValueError("unlucky")
        return items

    commit = GroupCommit(in_thread(executor, write, groups), max_items=100, name="t", depth=2)
    commit.start()
    first = asyncio.ensure_future(commit.submit([1]))
    await until(lambda: len(groups) == 1)
    good = asyncio.ensure_future(commit.submit([2]))
    bad = asyncio.ensure_future(commit.submit([13]))
    also_good = asyncio.ensure_future(commit.submit([3]))
    await asyncio.sleep(0.01)
    gate.set()
    assert await first == [1]
    assert await good == [2]
    with pytest.raises(ValueError, match="unlucky"):
        await bad
    assert await also_good == [3]
    assert groups == [[1], [2, 13, 3], [2], [13], [3]]
    await commit.close()
    executor.shutdown()


async def test_a_flush_that_fails_before_taking_fails_its_group_instead_of_hanging() -> None:
    executor = ThreadPoolExecutor(1)
    executor.shutdown()  # run_in_executor now raises before the writer thread takes anything
    commit = GroupCommit(in_thread(executor, list, []), max_items=100, name="t", depth=2)
    commit.start()
    async with asyncio.timeout(5):
        with pytest.raises(RuntimeError, match="shutdown"):
            await commit.submit([1, 2])
        await commit.close()


async def test_close_flushes_what_was_submitted_and_refuses_more() -> None:
    executor = ThreadPoolExecutor(1)
    groups: list[list[int]] = []
    commit = GroupCommit(in_thread(executor, list, groups), max_items=100, name="t", depth=2)
    commit.start()
    commit.add([1, 2])
    commit.add([3])
    await commit.close()
    assert [i for group in groups for i in group] == [1, 2, 3]
    with pytest.raises(RuntimeError, match="shutting down"):
        await commit.submit([4])
    executor.shutdown()


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
