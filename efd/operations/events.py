"""efd's own operational events (pure: no I/O, no clock; the caller passes the time).

Each event is delivered to the `[operations]` destination as a `track` message from the
source OPERATIONS_SOURCE and the user USER_ID, its `event` the event's name and its
`properties` what it is about (docs/operators.md#operational-events). What is sent is
bounded here: a state an event raises (a hook failing, a backlog high, a lane blocked) is
told once per crossing, and a Gate lets at most `per_minute` events through in each minute
of the clock, then tells how many it dropped, by name, in one DROPPED event.
"""

from __future__ import annotations

import math
import uuid
from collections import Counter
from collections.abc import Mapping
from dataclasses import dataclass, replace
from datetime import UTC, datetime
from typing import Any, Protocol

from efd import __version__
from efd.languages.filters import FilterSet
from efd.records import NewMessage
from efd.segment import routing, webhooks
from efd.segment.messages import Message, format_timestamp

OPERATIONS_SOURCE = "efd"  # the source name the events are stored under (reserved)
USER_ID = "efd"

HOOK_DISABLED = "hook.disabled"
HOOK_PAUSED = "hook.paused"
HOOK_RESUMED = "hook.resumed"
HOOK_FAILING = "hook.failing"
HOOK_RECOVERED = "hook.recovered"
DELIVERY_EXHAUSTED = "delivery.exhausted"
BACKLOG_HIGH = "backlog.high"
LANE_BLOCKED = "lane.blocked"
DROPPED = "operations.dropped"  # the summary of what a Gate's cap dropped in one minute

NAMES = (
    HOOK_DISABLED,
    HOOK_PAUSED,
    HOOK_RESUMED,
    HOOK_FAILING,
    HOOK_RECOVERED,
    DELIVERY_EXHAUSTED,
    BACKLOG_HIGH,
    LANE_BLOCKED,
    DROPPED,
)

# Who paused or resumed (hook.paused, hook.resumed: "by").
BY_ADMIN_API = "admin API"
BY_COMMAND_LINE = "command line"

MAX_TEXT = 200  # characters of a receiver's answer or an error kept in an event
_MINUTE = 60.0
_IDS = uuid.UUID("5b0c1c9e-3f53-4d0e-9a8e-6f7e0d1a2b3c")  # namespace of the events' messageIds


@dataclass(frozen=True, slots=True)
class Event:
    """One occurrence. `destination`: what it is about (None: about efd itself, DROPPED);
    `subject`: with the name and destination, what makes it this occurrence and not another
    (a hook's label, a delivery's id)."""

    name: str
    destination: str | None
    subject: tuple[str, ...]
    properties: Mapping[str, Any]
    at: float

    @property
    def message_id(self) -> str:
        """Unique and deterministic per occurrence: stored twice, it is one message."""
        key = "\x1f".join((self.name, self.destination or "", *self.subject, repr(self.at)))
        return str(uuid.uuid5(_IDS, key))


class Sink(Protocol):
    """Where the parts that notice something hand their events (efd/services/notices.py)."""

    def emit(self, event: Event) -> None:
        """Take the event; never blocks, never raises."""
        ...


def about_operations(event: Event, destination: str) -> bool:
    """Whether the event is about the operations destination itself (or one of its
    actions' routes, "ops/action"): never sent, so its failures cannot feed on themselves."""
    about = event.destination
    return about is not None and (about == destination or about.startswith(destination + "/"))


def iso(at: float) -> str:
    return format_timestamp(datetime.fromtimestamp(at, UTC))


def clip(text: str | None) -> str | None:
    if text is None or len(text) <= MAX_TEXT:
        return text
    return text[: MAX_TEXT - 1] + "…"


# -- the events --------------------------------------------------------------------------


def hook_failing(
    destination: str,
    hook: str,
    *,
    failures: int,
    probe_seconds: float,
    status_code: int | None,
    error: str | None,
    at: float,
) -> Event:
    """The circuit of a hook (its label: the redacted URL) opened."""
    return Event(
        HOOK_FAILING,
        destination,
        (hook,),
        {
            "destination": destination,
            "hook": hook,
            "failures": failures,
            "probeSeconds": probe_seconds,
            "lastAnswer": {"statusCode": status_code, "error": clip(error)},
        },
        at,
    )


def hook_recovered(destination: str, hook: str, *, at: float) -> Event:
    """The circuit of a hook closed again (a Gate adds how long it was failing)."""
    return Event(
        HOOK_RECOVERED, destination, (hook,), {"destination": destination, "hook": hook}, at
    )


def delivery_exhausted(
    destination: str,
    *,
    source: str,
    message_id: str,
    delivery_id: int,
    status: str,
    attempts: int,
    first_attempt_at: float | None,
    hook: str | None,
    status_code: int | None,
    error: str | None,
    at: float,
) -> Event:
    """A delivery failed for good (`status` failed) or its retry window closed (expired):
    which message, which destination, the last answer; never the payload."""
    return Event(
        DELIVERY_EXHAUSTED,
        destination,
        (str(delivery_id),),
        {
            "destination": destination,
            "source": source,
            "messageId": message_id,
            "deliveryId": delivery_id,
            "status": status,
            "attempts": attempts,
            "firstAttemptAt": None if first_attempt_at is None else iso(first_attempt_at),
            "lastAnswer": {"hook": hook, "statusCode": status_code, "error": clip(error)},
        },
        at,
    )


def hook_paused(
    destination: str, hook: int | None, *, reason: str | None, since: float, by: str, at: float
) -> Event:
    """An operator paused a destination (`hook` None) or one of its hooks (by number)."""
    return Event(
        HOOK_PAUSED,
        destination,
        ("" if hook is None else str(hook),),
        {
            "destination": destination,
            "hook": hook,
            "reason": clip(reason),
            "since": iso(since),
            "by": by,
        },
        at,
    )


def hook_resumed(
    destination: str,
    hook: int | None,
    *,
    was: str,
    since: float,
    due: int,
    by: str,
    at: float,
) -> Event:
    """An operator resumed a paused or disabled (`was`) destination or hook."""
    return Event(
        HOOK_RESUMED,
        destination,
        ("" if hook is None else str(hook),),
        {
            "destination": destination,
            "hook": hook,
            "was": was,
            "heldSeconds": round(max(0.0, at - since), 3),
            "due": due,
            "by": by,
        },
        at,
    )


def hook_disabled(destination: str, hook: int, *, reason: str, at: float) -> Event:
    """[delivery] disable_after_hours disabled a hook that kept failing."""
    return Event(
        HOOK_DISABLED,
        destination,
        (str(hook),),
        {"destination": destination, "hook": hook, "reason": clip(reason), "since": iso(at)},
        at,
    )


def backlog_high(
    destination: str,
    *,
    pending: int,
    oldest_seconds: float | None,
    backlog_high: int,
    oldest_high_seconds: float,
    at: float,
) -> Event:
    return Event(
        BACKLOG_HIGH,
        destination,
        (),
        {
            "destination": destination,
            "pending": pending,
            "oldestPendingSeconds": None if oldest_seconds is None else round(oldest_seconds, 3),
            "backlogHigh": backlog_high,
            "oldestPendingHighSeconds": oldest_high_seconds,
        },
        at,
    )


def lane_blocked(
    destination: str,
    *,
    lanes: int,
    message_id: str | None,
    blocked_seconds: float,
    threshold_seconds: float,
    at: float,
) -> Event:
    """An ordered destination's longest-blocked lane has waited on its head past the
    threshold (`lanes`: how many of its lanes are blocked now)."""
    return Event(
        LANE_BLOCKED,
        destination,
        (),
        {
            "destination": destination,
            "lanes": lanes,
            "messageId": message_id,
            "blockedSeconds": round(blocked_seconds, 3),
            "laneBlockedSeconds": threshold_seconds,
        },
        at,
    )


def backlog_is_high(
    pending: int,
    oldest_seconds: float | None,
    *,
    backlog_high: int,
    oldest_high_seconds: float,
) -> bool:
    return pending >= backlog_high or (
        oldest_seconds is not None and oldest_seconds >= oldest_high_seconds
    )


# -- the bounds --------------------------------------------------------------------------


class Crossings:
    """Levels watched by a periodic check: `rose` is True only when a key goes from below
    its threshold to above it, so a level that stays high is told once."""

    def __init__(self) -> None:
        self._high: set[tuple[str, ...]] = set()

    def rose(self, key: tuple[str, ...], high: bool) -> bool:
        if not high:
            self._high.discard(key)
            return False
        if key in self._high:
            return False
        self._high.add(key)
        return True

    def keep(self, keys: set[tuple[str, ...]]) -> None:
        """Forget the keys not seen in a check (a destination removed, a backlog gone)."""
        self._high &= keys


_RAISES = {HOOK_FAILING: HOOK_RECOVERED}
_LOWERS = {v: k for k, v in _RAISES.items()}


class Gate:
    """What of the events a process noticed is sent.

    A hook's failing state is told once per crossing: hook.failing only when it was not
    failing, hook.recovered only when it was (with how long). Then at most `per_minute`
    events pass in each minute of the clock; the rest are counted, and the first event or
    `flush` after that minute brings one DROPPED event with the counts, by name (not
    itself counted against the cap)."""

    def __init__(self, per_minute: int) -> None:
        self.per_minute = per_minute
        self._raised: dict[tuple[str, ...], float] = {}  # (name, destination, *subject) -> at
        self._minute = -math.inf
        self._sent = 0
        self._dropped: Counter[str] = Counter()
        self._dropped_since = 0.0
        self.dropped_total = 0  # every event the cap dropped, for the metrics

    def admit(self, event: Event, now: float) -> list[Event]:
        """The events to send now for `event`: none, it, or a summary and it."""
        dest = event.destination or ""
        if event.name in _RAISES:
            key = (event.name, dest, *event.subject)
            if key in self._raised:
                return []
            self._raised[key] = event.at
        elif event.name in _LOWERS:
            began = self._raised.pop((_LOWERS[event.name], dest, *event.subject), None)
            if began is None:
                return []
            properties = {**event.properties, "failingSeconds": round(event.at - began, 3)}
            event = replace(event, properties=properties)
        out = self.flush(now)
        if self._sent >= self.per_minute:
            if not self._dropped:
                self._dropped_since = now
            self._dropped[event.name] += 1
            self.dropped_total += 1
            return out
        self._sent += 1
        return [*out, event]

    def flush(self, now: float) -> list[Event]:
        """At a new minute: the summary of what the last one dropped, if anything."""
        minute = math.floor(now / _MINUTE) * _MINUTE
        if minute == self._minute:
            return []
        self._minute, self._sent = minute, 0
        if not self._dropped:
            return []
        dropped, self._dropped = self._dropped, Counter()
        summary = Event(
            DROPPED,
            None,
            (),
            {
                "dropped": sum(dropped.values()),
                "events": dict(sorted(dropped.items())),
                "from": iso(self._dropped_since),
                "to": iso(now),
                "maxEventsPerMinute": self.per_minute,
            },
            now,
        )
        return [summary]

    def flush_due(self) -> float | None:
        """When flush has a summary to give (the next minute), or None."""
        return self._minute + _MINUTE if self._dropped else None


# -- the message -------------------------------------------------------------------------


def body(event: Event) -> dict[str, Any]:
    """The webhook body of the event's track message."""
    message = Message(
        type="track",
        message_id=event.message_id,
        user_id=USER_ID,
        anonymous_id=None,
        timestamp=datetime.fromtimestamp(event.at, UTC),
        context={"library": {"name": "efd", "version": __version__}},
        integrations={},
        fields={"event": event.name, "properties": dict(event.properties)},
    )
    return webhooks.body_for(message)


def message(
    event: Event,
    destination: str,
    now: float,
    *,
    filters: Mapping[str, FilterSet] | None = None,
    actions: Mapping[str, routing.ActionSet] | None = None,
) -> NewMessage:
    """The stored message of `event`, routed to the operations `destination` only, through
    its filters or actions (`filters`, `actions`: that destination's, if it has some)."""
    data = body(event)
    plain, shaped, mapped = routing.shape(data, (destination,), filters or {}, actions=actions)
    return NewMessage(
        source=OPERATIONS_SOURCE,
        message_id=event.message_id,
        type="track",
        user_id=USER_ID,
        anonymous_id=None,
        event=event.name,
        timestamp=event.at,
        received_at=now,
        body=webhooks.encode(data).decode("utf-8"),
        destinations=plain,
        shaped=shaped,
        mapped=mapped,
    )


def log_line(event: Event) -> str:
    """The event as its one log line."""
    about = "" if event.destination is None else f" about {event.destination}"
    return (
        f"operational event {event.name}{about}: {webhooks.encode(dict(event.properties)).decode()}"
    )
