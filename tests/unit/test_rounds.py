"""What a round becomes in the store (efd/delivery/rounds.py): which destinations an outcome
batch makes claimable once written, and the attempts' durations."""

from __future__ import annotations

import random

from efd.delivery.rounds import due_once_written, milliseconds, moves_lane_on
from efd.records import DeliveryStatus, Outcome
from tests.support.rows import outcome_row


def _outcome(status: DeliveryStatus, next_attempt_at: float | None = None) -> Outcome:
    return outcome_row(1, status, next_attempt_at=next_attempt_at)


def test_a_final_outcome_moves_an_ordered_destination_s_lane_on() -> None:
    for status in (DeliveryStatus.DELIVERED, DeliveryStatus.FAILED, DeliveryStatus.EXPIRED):
        assert moves_lane_on(_outcome(status), ordered=True)
        assert not moves_lane_on(_outcome(status), ordered=False)
    assert not moves_lane_on(_outcome(DeliveryStatus.PENDING, 5.0), ordered=True)


def test_due_once_written() -> None:
    written = [
        ("lanes", _outcome(DeliveryStatus.DELIVERED)),  # its lane's next is due now
        ("done", _outcome(DeliveryStatus.DELIVERED)),  # unordered: nothing follows it
        ("retry-due", _outcome(DeliveryStatus.PENDING, 9.0)),  # came due on its way
        ("retry-on-time", _outcome(DeliveryStatus.PENDING, 10.0)),  # due exactly now
        ("retry-later", _outcome(DeliveryStatus.PENDING, 10.5)),  # its own timer finds it
        ("held-head", _outcome(DeliveryStatus.PENDING, 11.0)),  # a head retrying later
    ]
    ordered = {"lanes", "held-head"}
    assert due_once_written(written, ordered, now=10.0) == {"lanes", "retry-due", "retry-on-time"}


def test_durations_are_kept_in_milliseconds_to_the_microsecond() -> None:
    assert milliseconds(0.0) == 0.0
    assert milliseconds(0.0012345678) == 1.235
    assert milliseconds(5.0) == 5000.0
    assert milliseconds(0.0000004) == 0.0
    rng = random.Random(7)
    for _ in range(10_000):
        seconds = rng.uniform(0, 10) * 10 ** -rng.randint(0, 6)
        assert abs(milliseconds(seconds) - seconds * 1000) <= 0.0005 + 1e-12
        assert milliseconds(seconds) == round(milliseconds(seconds), 3)
