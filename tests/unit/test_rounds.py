"""Which destinations an outcome batch makes claimable once written (efd/rules/rounds.py)."""

from __future__ import annotations

from efd.rows import DeliveryStatus, Outcome
from efd.rules.rounds import due_once_written, moves_lane_on
from tests.support.rows import outcome_row


def _outcome(status: DeliveryStatus, next_attempt_at: float | None = None) -> Outcome:
    return outcome_row(1, status, next_attempt_at=next_attempt_at)


def test_a_final_outcome_moves_an_ordered_destination_s_lane_on():
    for status in (DeliveryStatus.DELIVERED, DeliveryStatus.FAILED, DeliveryStatus.EXPIRED):
        assert moves_lane_on(_outcome(status), ordered=True)
        assert not moves_lane_on(_outcome(status), ordered=False)
    assert not moves_lane_on(_outcome(DeliveryStatus.PENDING, 5.0), ordered=True)


def test_due_once_written():
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
