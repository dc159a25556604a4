"""The outcome recorder's batches: outcomes of rounds that end apart share a transaction when
they end within the linger; a full batch, an outcome that moves a lane on, and a stop do not
wait. Against a store port that keeps each `record` call (the recorder is the thing under
test; the real stores' `record` is tests/integration/test_store.py's), on virtual time
(tests/unit/clocks.py): each call's moment is exact."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence

import pytest

from efd.delivery import recorder as recorder_module
from efd.delivery.leases import Leases
from efd.delivery.recorder import GATHER, Recorded, Recorder
from efd.observe.metrics import Metrics
from efd.records import AttemptRow, Outcome
from tests.support.rows import outcome_row
from tests.unit.clocks import VirtualClock, advance, virtual_loop

pytestmark = pytest.mark.virtual_time


class Calls:
    """The store's `record`, keeping the delivery ids of each call and the loop's time at
    it."""

    def __init__(self) -> None:
        self.calls: list[list[int]] = []
        self.times: list[float] = []
        self.changed = asyncio.Event()

    async def record(self, outcomes: Sequence[Outcome], attempts: Sequence[AttemptRow]) -> int:
        self.calls.append([o.delivery_id for o in outcomes])
        self.times.append(virtual_loop().time())
        self.changed.set()
        return 0

    async def until(self, count: int) -> None:
        """Until `count` outcomes were recorded in all (at most 10 s of virtual time)."""
        while sum(map(len, self.calls)) < count:
            self.changed.clear()
            await asyncio.wait_for(self.changed.wait(), timeout=10)


def _item(delivery_id: int) -> Recorded:
    return (outcome_row(delivery_id), [], "a", f"m{delivery_id}")


async def _recorder(store: Calls) -> tuple[Recorder, list[list[Recorded]]]:
    written: list[list[Recorded]] = []

    async def renew(leases: Sequence[tuple[int, int]], until: float) -> list[int]:
        return []

    recorder = Recorder(
        store,  # type: ignore[arg-type]  # only `record` is called
        Leases(60.0, renew, VirtualClock()),
        Metrics(),
        hub=None,
        stopping=lambda: False,
        written=written.append,
    )
    recorder.start()
    return recorder, written


async def test_outcomes_ending_within_the_linger_share_one_transaction(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(recorder_module, "LINGER_SECONDS", 0.2)
    store = Calls()
    recorder, written = await _recorder(store)
    for delivery_id in range(1, 6):
        recorder.add(_item(delivery_id))
        await advance(0.01)  # rounds that end apart, each alone
    await store.until(5)
    assert store.calls == [[1, 2, 3, 4, 5]]
    assert store.times == [pytest.approx(0.2)]  # the linger counts from the first
    assert [[o.delivery_id for o, *_ in batch] for batch in written] == [[1, 2, 3, 4, 5]]
    await recorder.close()


async def test_an_outcome_alone_is_written_when_the_linger_ends(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(recorder_module, "LINGER_SECONDS", 0.05)
    store = Calls()
    recorder, _ = await _recorder(store)
    recorder.add(_item(1))
    await store.until(1)  # nothing else arrives: the timer sends it
    assert store.calls == [[1]]
    assert store.times == [pytest.approx(0.05)]
    await recorder.close()


@pytest.mark.parametrize("how", ["gather", "urgent", "close"])
async def test_what_does_not_wait_for_the_linger(monkeypatch: pytest.MonkeyPatch, how: str) -> None:
    monkeypatch.setattr(recorder_module, "LINGER_SECONDS", 3600.0)  # never, in this test
    store = Calls()
    recorder, _ = await _recorder(store)
    if how == "gather":  # a full batch goes at once
        for delivery_id in range(1, GATHER + 1):
            recorder.add(_item(delivery_id))
        await store.until(GATHER)
        assert store.calls == [list(range(1, GATHER + 1))]
    elif how == "urgent":  # an outcome that moves a lane on takes what is held with it
        recorder.add(_item(1))
        recorder.add(_item(2))
        recorder.add(_item(3), urgent=True)
        await store.until(3)
        assert store.calls == [[1, 2, 3]]
    else:  # a stop writes what is held
        recorder.add(_item(1))
        recorder.add(_item(2))
        await asyncio.wait_for(recorder.close(), timeout=10)
        assert store.calls == [[1, 2]]
        assert store.times == [0.0]
        return
    assert store.times == [0.0]  # not a moment of the linger
    await recorder.close()
