"""The records that pass between efd's parts, with no dependencies of their own.

The parser processes build `NewMessage`s without loading SQLAlchemy; the dispatcher, the
store and the tests' in-memory fake of it exchange `ClaimRequest`, `Claimed`, `Outcome` and
`AttemptRow`.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import KW_ONLY, dataclass, field
from enum import StrEnum
from typing import Any


class DeliveryStatus(StrEnum):
    """A delivery's state, as stored in `deliveries.status`."""

    PENDING = "pending"
    # Waits behind the head of its lane (an ordered destination): never claimed until the
    # head has an outcome and it becomes the head, pending and due (efd/delivery/lanes.py).
    QUEUED = "queued"
    DELIVERED = "delivered"
    FAILED = "failed"  # every hook failed for good
    EXPIRED = "expired"  # the retry window closed
    DISCARDED = "discarded"  # its destination left the configuration; an operator dropped it
    FILTERED = "filtered"  # a destination filter stopped it at routing: never sent


class RegulationStatus(StrEnum):
    """A deletion request's state, as stored in `regulations.status`."""

    INITIALIZED = "INITIALIZED"
    RUNNING = "RUNNING"
    FINISHED = "FINISHED"
    FAILED = "FAILED"


class ProfileKind(StrEnum):
    USER = "user"  # keyed by a userId
    ANONYMOUS = "anonymous"  # keyed by an anonymousId not linked to a user yet


class InsertStatus(StrEnum):
    """What became of one message offered to the store."""

    STORED = "stored"
    DUPLICATE = "duplicate"  # a messageId the source already sent: acknowledged, not stored
    SUPPRESSED = "suppressed"  # from a suppressed user: acknowledged and dropped


# How the last_error of an action's delivery that failed at routing begins: its mapping, or
# its request (URL, form body), could not be made for the message (efd.segment.routing).
ROUTING_FAILURES = ("mapping: ", "request: ")


def failed_at_routing(status: str, attempts: int, last_error: str | None) -> bool:
    """Whether a delivery is an action's that failed at routing, never sent: redrive leaves
    it, and a replay repeats it as it is."""
    return (
        status == DeliveryStatus.FAILED
        and attempts == 0
        and last_error is not None
        and last_error.startswith(ROUTING_FAILURES)
    )


@dataclass(slots=True)  # not frozen: built on the hot path, where frozen __init__ costs
class NewMessage:
    source: str
    message_id: str
    type: str
    user_id: str | None
    anonymous_id: str | None
    event: str | None
    timestamp: float
    received_at: float
    body: str
    destinations: tuple[str, ...]
    original_timestamp: float | None = None  # the client's, when `timestamp` corrects it
    # Deliveries a destination's filters shaped (efd.segment.routing.shape), beside the plain
    # ones in `destinations`: (destination, its own body, None) when a field filter changed
    # the body, (destination, None, why) when a drop or sample filter stopped the message.
    shaped: tuple[tuple[str, str | None, str | None], ...] = ()
    # An actions destination's deliveries, one per action whose trigger matched
    # (efd.segment.routing.Action.mapped): (route, body, URL, None) to send, or
    # (route, None, None, why) when its mapping or request failed for this message.
    mapped: tuple[tuple[str, str | None, str | None, str | None], ...] = ()
    # The W3C trace context of the ingestion span that accepted it (efd/observe/tracing.py,
    # stored form: efd/observe/tracecontext.py); None when telemetry is off.
    trace_context: str | None = None


@dataclass(frozen=True, slots=True)
class ClaimRequest:
    """One claim, as the dispatcher asks it and the store (or its in-memory twin) answers it:
    lease to `owner` until `lease_until` up to `limit` deliveries of `destination` due by
    `due_by` (default `now`), oldest first; never one under another claimer's live lease, nor
    one whose lease ended at or after `lapsed_before` (default: just after `now`)."""

    destination: str
    limit: int
    _: KW_ONLY
    owner: str
    now: float
    lease_until: float
    due_by: float | None = None
    lapsed_before: float | None = None

    @property
    def due(self) -> float:
        """The latest next_attempt_at claimed."""
        return self.now if self.due_by is None else self.due_by

    @property
    def lapsed(self) -> float:
        """A lease that ended before this has lapsed: its delivery may be claimed again."""
        return (
            math.nextafter(self.now, math.inf) if self.lapsed_before is None else self.lapsed_before
        )


@dataclass(slots=True)
class Claimed:
    """A leased delivery, with what its next round needs."""

    delivery_id: int
    lease_token: int
    destination: str
    attempts: int
    first_attempt_at: float | None
    failed_hooks: frozenset[str]
    message_id: str
    body: str | None  # None once a deletion request purged it
    # The message's row: what its webhook-id is derived from (efd.segment.webhooks.webhook_id).
    message_pk: int
    source: str
    received_at: float
    # An action's delivery: the URL rendered for its message at routing (stored with the
    # delivery, as its mapped body is); None: the route's hook URLs.
    url: str | None = None
    # The trace context its message was accepted under (NewMessage.trace_context).
    trace_context: str | None = None


@dataclass(slots=True)
class Outcome:
    """The state a delivery moves to after a round, fenced by the claim's token."""

    delivery_id: int
    lease_token: int
    status: DeliveryStatus
    attempts: int
    first_attempt_at: float
    next_attempt_at: float | None
    finished_at: float | None
    failed_hooks: frozenset[str]
    last_error: str | None


@dataclass(slots=True)
class AttemptRow:
    delivery_id: int
    hook_url: str
    attempted_at: float
    duration_ms: float
    outcome: str
    status_code: int | None
    error_class: str | None
    error: str | None
    response_head: str | None


@dataclass(frozen=True, slots=True)
class Event:
    """A kept track/page/screen event of a profile, as audiences evaluate it."""

    name: str
    timestamp: float  # unix seconds
    properties: Mapping[str, Any] = field(default_factory=dict)


# -- what operators look at (efd inspect / deliveries / redrive / replay, /admin/*) ------------


@dataclass(frozen=True, slots=True)
class DeliveryQuery:
    """Which deliveries an operator means; None or empty: any. Times are UNIX seconds and
    bound the message's received time (since inclusive, until exclusive)."""

    destinations: tuple[str, ...] = ()
    statuses: tuple[DeliveryStatus, ...] = ()
    since: float | None = None
    until: float | None = None
    source: str | None = None
    user_id: str | None = None
    message_id: str | None = None


@dataclass(frozen=True, slots=True)
class BlockedLanes:
    """An ordered destination's lanes whose head failed at least once and has no outcome
    yet: each holds its later messages back."""

    count: int
    oldest_message_id: str | None  # the head blocked longest: its messageId
    oldest_since: float | None  # and its first attempt (UNIX seconds)


@dataclass(frozen=True, slots=True)
class AttemptRecord:
    attempted_at: float
    hook_url: str
    outcome: str
    status_code: int | None
    error_class: str | None
    error: str | None
    duration_ms: float | None
    response_head: str | None


@dataclass(frozen=True, slots=True)
class DeliveryRecord:
    id: int
    destination: str
    status: str
    attempts: int
    created_at: float
    first_attempt_at: float | None
    next_attempt_at: float | None
    finished_at: float | None
    last_error: str | None
    replay_of: int | None
    # the message's
    source: str
    message_id: str
    type: str
    user_id: str | None
    event: str | None
    received_at: float
    # An action's delivery: the URL rendered for its message at routing.
    url: str | None = None


@dataclass(frozen=True, slots=True)
class MessageRecord:
    """A stored message, its deliveries (oldest first) and each one's attempts."""

    pk: int
    source: str
    message_id: str
    type: str
    user_id: str | None
    anonymous_id: str | None
    event: str | None
    received_at: float
    body: str | None  # None once purged by a deletion request
    deliveries: tuple[DeliveryRecord, ...]
    attempts: Mapping[int, tuple[AttemptRecord, ...]]  # delivery id -> attempts, oldest first
    # delivery id -> the messageId of its lane's head, for each delivery waiting in a lane
    waiting_for: Mapping[int, str | None] = field(default_factory=dict)
