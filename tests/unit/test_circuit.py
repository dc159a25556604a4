"""The circuit breaker's state machine: when a hook opens, when it may be probed, what
closes it, and which failures do not count."""

from __future__ import annotations

import itertools

import pytest

from efd.delivery.circuit import Change, Circuits
from efd.delivery.retry import AttemptResult, Verdict

URL = "https://hooks.example/x"


def result(
    verdict: Verdict, *, status: int | None = None, error: str | None = None
) -> AttemptResult:
    if status is None and error is None:
        status = {Verdict.SUCCESS: 200, Verdict.RETRY: 503, Verdict.FAIL: 404}[verdict]
    return AttemptResult(URL, 0.0, 0.01, verdict, status_code=status, error_class=error)


_deliveries = itertools.count(1)


def fail(
    circuits: Circuits, times: int, now: float = 100.0, delivery: int | None = None
) -> list[Change | None]:
    """`times` retryable failures: of `delivery` if given, else each of a new delivery."""
    return [
        circuits.record(
            result(Verdict.RETRY), now, next(_deliveries) if delivery is None else delivery
        )
        for _ in range(times)
    ]


def test_opens_after_threshold_consecutive_retryable_failures() -> None:
    circuits = Circuits(threshold=3, probe_seconds=30)
    assert fail(circuits, 2) == [None, None]
    assert not circuits.is_open(URL)
    assert fail(circuits, 1) == [Change.OPENED]
    assert circuits.is_open(URL)
    assert circuits.open_hooks() == [URL]


def test_a_success_or_a_final_answer_resets_the_count() -> None:
    circuits = Circuits(threshold=3, probe_seconds=30)
    fail(circuits, 2)
    assert circuits.record(result(Verdict.SUCCESS), 100, 1) is None
    assert fail(circuits, 2) == [None, None]
    assert circuits.record(result(Verdict.FAIL), 100, 1) is None  # a 404: the receiver is up
    assert fail(circuits, 2) == [None, None]
    assert not circuits.is_open(URL)


def test_one_deliverys_retries_alone_never_open_it() -> None:
    # An ordered lane's head the receiver keeps refusing, with no other traffic.
    circuits = Circuits(threshold=3, probe_seconds=30)
    assert fail(circuits, 50, delivery=7) == [None] * 50
    assert not circuits.is_open(URL)
    # Two deliveries retried in turn count as two, however often each failed.
    assert fail(circuits, 10, delivery=8) == [None] * 10
    assert fail(circuits, 1, delivery=9) == [Change.OPENED]


def test_an_answer_between_starts_the_count_of_deliveries_over() -> None:
    circuits = Circuits(threshold=2, probe_seconds=30)
    fail(circuits, 3, delivery=1)
    assert circuits.record(result(Verdict.SUCCESS), 100, 2) is None  # another user, delivered
    assert fail(circuits, 3, delivery=1) == [None] * 3  # the stuck one again: one delivery
    assert fail(circuits, 1, delivery=3) == [Change.OPENED]


@pytest.mark.parametrize("error", ["interrupted", "internal"])
def test_efds_own_failures_do_not_count(error: str) -> None:
    circuits = Circuits(threshold=2, probe_seconds=30)
    fail(circuits, 1)
    assert circuits.record(result(Verdict.RETRY, error=error), 100, 1) is None
    assert fail(circuits, 1) == [Change.OPENED]  # the two receiver failures, not three


def test_an_actions_token_failures_count_neither_way() -> None:
    """A token endpoint that gives no token (the receiver was never asked) and a 401 to a
    cached token that was then renewed say nothing of the receiver's health."""
    circuits = Circuits(threshold=2, probe_seconds=30)
    for delivery in range(100, 110):
        assert circuits.record(result(Verdict.RETRY, error="token"), 100, delivery) is None
    assert not circuits.is_open(URL)
    renewed = result(Verdict.RETRY, status=401, error="token")
    assert circuits.record(renewed, 100, 110) is None
    assert fail(circuits, 2) == [None, Change.OPENED]  # the receiver's own failures count
    circuits.take_probe(URL, 130)
    assert circuits.record(result(Verdict.RETRY, error="token"), 130, 111) is None
    assert circuits.is_open(URL)
    assert circuits.take_probe(URL, 130)  # the probe told nothing: it may go again


def test_one_probe_per_interval_and_none_while_one_is_in_flight() -> None:
    circuits = Circuits(threshold=1, probe_seconds=30)
    fail(circuits, 1, now=100)
    assert circuits.blocked([URL], 100)
    assert not circuits.take_probe(URL, 129.9)
    assert circuits.next_probe_at(URL) == 130
    assert not circuits.blocked([URL], 130)
    assert circuits.take_probe(URL, 130)
    assert not circuits.take_probe(URL, 131)  # in flight
    assert circuits.next_probe_at(URL) is None
    assert circuits.blocked([URL], 131)
    # The probe failed: still open, next probe one interval after its answer.
    assert circuits.record(result(Verdict.RETRY), 132, 1) is None
    assert circuits.is_open(URL)
    assert circuits.next_probe_at(URL) == 162
    assert circuits.take_probe(URL, 162)


@pytest.mark.parametrize(("verdict", "status"), [(Verdict.SUCCESS, 204), (Verdict.FAIL, 400)])
def test_a_probe_answered_closes_the_circuit(verdict: Verdict, status: int) -> None:
    circuits = Circuits(threshold=1, probe_seconds=5)
    fail(circuits, 1, now=0)
    assert circuits.take_probe(URL, 5)
    assert circuits.record(result(verdict, status=status), 6, 1) is Change.CLOSED
    assert not circuits.is_open(URL)
    assert not circuits.blocked([URL], 6)
    assert fail(circuits, 1) == [Change.OPENED]  # counting starts over


def test_a_probe_that_sent_nothing_is_given_back() -> None:
    circuits = Circuits(threshold=1, probe_seconds=5)
    fail(circuits, 1, now=0)
    assert circuits.take_probe(URL, 5)
    circuits.release_probe(URL)
    assert circuits.take_probe(URL, 5)


def test_blocked_needs_every_hook_open() -> None:
    other = "https://other.example/x"
    circuits = Circuits(threshold=1, probe_seconds=30)
    fail(circuits, 1, now=0)
    assert circuits.blocked([URL], 1)
    assert not circuits.blocked([URL, other], 1)
    assert not circuits.blocked([], 1)
    assert not circuits.is_open(other)
