"""What a delivery round's results become in the store: the delivery's new state and one
attempt row per request. Pure shaping; efd/delivery/retry.py decides, the dispatcher records."""

from __future__ import annotations

from collections.abc import Iterable, Sequence, Set

from efd.delivery.retry import AttemptResult, Decision
from efd.records import AttemptRow, Claimed, DeliveryStatus, Outcome
from efd.segment.webhooks import Route, redact_url


def outcome_of(
    item: Claimed,
    decision: Decision,
    results: Sequence[AttemptResult],
    *,
    first_attempt_at: float,
    now: float,
    note: str | None,
) -> Outcome:
    """The delivery's state after the round, fenced by the lease it was claimed under. A
    round that sent nothing (`note` says why) does not count as an attempt."""
    return Outcome(
        delivery_id=item.delivery_id,
        lease_token=item.lease_token,
        status=decision.status,
        attempts=item.attempts + (1 if results else 0),
        first_attempt_at=first_attempt_at,
        next_attempt_at=decision.next_attempt_at,
        finished_at=None if decision.status is DeliveryStatus.PENDING else now,
        failed_hooks=decision.failed_hooks,
        last_error=note or decision.last_error,
    )


def attempt_rows(
    route: Route, delivery_id: int, results: Sequence[AttemptResult]
) -> list[AttemptRow]:
    """One row per request, naming its hook by label (no credentials)."""
    return [
        AttemptRow(
            delivery_id=delivery_id,
            hook_url=route.labels.get(r.hook_url) or redact_url(r.hook_url),
            attempted_at=r.started_at,
            duration_ms=milliseconds(r.duration),
            outcome=r.verdict.value,
            status_code=r.status_code,
            error_class=r.error_class,
            # A receiver's Retry-After, honoured by the next round, is logged with it.
            error=r.error
            if r.retry_after is None
            else f"Retry-After: {r.retry_after:g} s" + (f"; {r.error}" if r.error else ""),
            response_head=r.response_head,
        )
        for r in results
    ]


def milliseconds(seconds: float) -> float:
    """A duration (never negative) in milliseconds, to the microsecond. Not round(x, 3),
    which converts through decimal digits: this runs once per attempt."""
    return int(seconds * 1_000_000 + 0.5) / 1000


def moves_lane_on(outcome: Outcome, ordered: bool) -> bool:
    """Whether writing this outcome makes its lane's next message due (efd/store/lanes.py):
    a final outcome of an ordered destination's delivery. The recorder writes it at once."""
    return ordered and outcome.status is not DeliveryStatus.PENDING


def due_once_written(
    written: Iterable[tuple[str, Outcome]], ordered: Set[str], now: float
) -> set[str]:
    """The destinations with a delivery claimable now that these outcomes are in the store:
    a lane moved on, or a retry that came due while its outcome was on its way (until then
    the row still carried the lease, and a claim passed it by)."""
    return {
        destination
        for destination, outcome in written
        if moves_lane_on(outcome, destination in ordered)
        or (
            outcome.status is DeliveryStatus.PENDING
            and outcome.next_attempt_at is not None
            and outcome.next_attempt_at <= now
        )
    }
