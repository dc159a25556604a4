"""Rows the tests build by hand."""

from __future__ import annotations

import time

from efd.records import DeliveryStatus, NewMessage, Outcome


def new_message(
    mid: str,
    source: str = "web",
    destinations: tuple[str, ...] = ("d",),
    *,
    user: str | None = "u",
    anonymous: str | None = None,
    received_at: float | None = None,
    mapped: tuple[tuple[str, str | None, str | None, str | None], ...] = (),
) -> NewMessage:
    """A track message received at `received_at` (default now), for `destinations`, and
    the actions' deliveries in `mapped` (route, body, URL, why it failed)."""
    now = time.time() if received_at is None else received_at
    return NewMessage(
        source=source,
        message_id=mid,
        type="track",
        user_id=user,
        anonymous_id=anonymous,
        event="E",
        timestamp=now,
        received_at=now,
        body='{"type":"track"}',
        destinations=destinations,
        mapped=mapped,
    )


def outcome_row(
    delivery_id: int,
    status: DeliveryStatus = DeliveryStatus.DELIVERED,
    *,
    token: int = 1,
    at: float = 1.0,
    next_attempt_at: float | None = None,
) -> Outcome:
    """A first round's outcome, at `at`: finished unless `status` is pending."""
    return Outcome(
        delivery_id=delivery_id,
        lease_token=token,
        status=status,
        attempts=1,
        first_attempt_at=at,
        next_attempt_at=next_attempt_at,
        finished_at=None if status is DeliveryStatus.PENDING else at,
        failed_hooks=frozenset(),
        last_error=None,
    )
