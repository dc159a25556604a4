"""The operator's rules (pure): times given as ISO 8601 or `2h`, the filters of
`efd deliveries` / `efd redrive` and of /admin/*, which destinations a replay goes to, and
the JSON an operator sees. The CLI and the admin API share them, so both accept and answer
the same: a bad filter or body raises a `ClientError` that always names the field, answered
400 for input that breaks a rule, 404 for a name that refers to nothing, 409 for a request
the current state refuses (a rule the OpenAPI schema cannot state); the CLI exits 2."""

from __future__ import annotations

import json
import re
from collections.abc import Collection, Mapping, Sequence
from datetime import UTC, datetime
from typing import Any

from efd.errors import ClientError
from efd.records import (
    AttemptRecord,
    BlockedLanes,
    DeliveryQuery,
    DeliveryRecord,
    DeliveryStatus,
    MessageRecord,
)
from efd.segment.messages import format_timestamp
from efd.segment.webhooks import redact_url, redact_urls

DEFAULT_LIMIT = 50
MAX_LIMIT = 500
MAX_TEXT = 1000  # characters of a name, userId or messageId filter
REDRIVABLE = (DeliveryStatus.FAILED, DeliveryStatus.EXPIRED)
LIST_FILTERS = (
    "destination",
    "status",
    "since",
    "until",
    "user_id",
    "message_id",
    "source",
    "limit",
    "cursor",
)
REDRIVE_FIELDS = ("destination", "status", "since", "until", "dry_run")
DISCARD_FIELDS = ("destination", "since", "until", "dry_run")
# Deliveries a discard marks per transaction: ingestion waits for one chunk at most.
DISCARD_CHUNK = 5000
REPLAY_FIELDS = ("source", "messageId", "destination")

_RELATIVE = re.compile(r"(\d{1,9})([smhd])")
_UNIT = {"s": 1, "m": 60, "h": 3600, "d": 86400}


def iso(value: float | None) -> str | None:
    return None if value is None else format_timestamp(datetime.fromtimestamp(value, UTC))


def parse_time(value: Any, field: str, now: float) -> float:
    """UNIX seconds from ISO 8601 (a time without an offset is UTC) or a relative
    `<n>s|m|h|d`, meaning that long before `now`."""
    if not isinstance(value, str) or not value.strip():
        raise ClientError(
            "invalid_field",
            f"{field} must be ISO 8601 or relative such as 2h, 30m, 1d",
            field=field,
        )
    text = value.strip()
    relative = _RELATIVE.fullmatch(text)
    if relative is not None:
        return now - int(relative.group(1)) * _UNIT[relative.group(2)]
    try:
        parsed = datetime.fromisoformat(text.replace("z", "Z"))
        if parsed.tzinfo is None:
            parsed = parsed.replace(tzinfo=UTC)
        return parsed.timestamp()
    except (ValueError, OverflowError, OSError):
        raise ClientError(
            "invalid_field",
            f"{field}: {text[:60]!r} is neither ISO 8601 nor relative (2h, 30m, 1d)",
            field=field,
        ) from None


def text(value: Any, field: str) -> str:
    """A name, userId or messageId as given: non-empty, bounded, and valid Unicode without
    NUL, which PostgreSQL's text cannot hold."""
    return _text(value, field)


def _text(value: Any, field: str) -> str:
    if not isinstance(value, str) or not value or len(value) > MAX_TEXT:
        raise ClientError(
            "invalid_field",
            f"{field} must be a non-empty string of at most {MAX_TEXT} characters",
            field=field,
        )
    if any(0xD800 <= ord(c) <= 0xDFFF for c in value) or "\x00" in value:
        raise ClientError("invalid_field", f"{field} must be valid Unicode text", field=field)
    return value


def _status(value: Any, field: str, allowed: Collection[DeliveryStatus]) -> DeliveryStatus:
    names = "|".join(s.value for s in allowed)
    if not isinstance(value, str) or value not in {s.value for s in allowed}:
        raise ClientError("invalid_field", f"{field} must be one of {names}", field=field)
    return DeliveryStatus(value)


def list_query(params: Mapping[str, str], now: float) -> tuple[DeliveryQuery, int, int | None]:
    """(query, limit, cursor) from `efd deliveries`' options or /admin/deliveries' query."""
    for key in params:
        if key not in LIST_FILTERS:
            raise ClientError(
                "invalid_field",
                f"unknown filter {key!r}; known: {', '.join(LIST_FILTERS)}",
                field=key,
            )
    get = params.get
    since = parse_time(get("since"), "since", now) if get("since") is not None else None
    until = parse_time(get("until"), "until", now) if get("until") is not None else None
    query = DeliveryQuery(
        destinations=(_text(get("destination"), "destination"),)
        if get("destination") is not None
        else (),
        statuses=(_status(get("status"), "status", list(DeliveryStatus)),)
        if get("status") is not None
        else (),
        since=since,
        until=until,
        source=_text(get("source"), "source") if get("source") is not None else None,
        user_id=_text(get("user_id"), "user_id") if get("user_id") is not None else None,
        message_id=_text(get("message_id"), "message_id")
        if get("message_id") is not None
        else None,
    )
    limit = DEFAULT_LIMIT
    if get("limit") is not None:
        limit = _integer(get("limit"), "limit", 1, MAX_LIMIT)
    cursor = _integer(get("cursor"), "cursor", 1, 2**63 - 1) if get("cursor") is not None else None
    return query, limit, cursor


def _integer(value: Any, field: str, low: int, high: int) -> int:
    if isinstance(value, str) and value.isascii() and value.isdigit() and len(value) <= 19:
        number = int(value)
        if low <= number <= high:
            return number
    raise ClientError(
        "invalid_field", f"{field} must be an integer from {low} to {high}", field=field
    )


def known_fields(payload: Any, fields: tuple[str, ...]) -> None:
    """A request body is a JSON object of these fields only, or the ClientError that says
    which is wrong."""
    if not isinstance(payload, dict):
        raise ClientError("invalid_body", "the request body must be a JSON object", field="body")
    for key in payload:
        if key not in fields:
            raise ClientError(
                "invalid_field",
                f"unknown field {key!r}; known: {', '.join(fields)}",
                field=str(key),
            )


def redrive_query(
    payload: Any, now: float, configured: Collection[str]
) -> tuple[DeliveryQuery, bool]:
    """(query, dry_run) of a redrive, from POST /admin/redrive's body or `efd redrive`'s
    options. Only configured destinations are redriven: a delivery to one no longer
    configured would stay pending."""
    known_fields(payload, REDRIVE_FIELDS)
    destinations = tuple(sorted(configured))
    if payload.get("destination") is not None:
        name = _text(payload["destination"], "destination")
        if name not in configured:
            raise ClientError(
                "unknown_destination",
                f"no destination named {name!r} is configured",
                field="destination",
                status=404,
            )
        destinations = (name,)
    statuses: tuple[DeliveryStatus, ...] = REDRIVABLE
    if payload.get("status") is not None:
        statuses = (_status(payload["status"], "status", REDRIVABLE),)
    since = parse_time(payload["since"], "since", now) if payload.get("since") is not None else None
    until = parse_time(payload["until"], "until", now) if payload.get("until") is not None else None
    dry_run = payload.get("dry_run", False)
    if not isinstance(dry_run, bool):
        raise ClientError("invalid_field", "dry_run must be true or false", field="dry_run")
    return DeliveryQuery(destinations, statuses, since, until), dry_run


def discard_query(
    payload: Any, now: float, configured: Collection[str]
) -> tuple[DeliveryQuery, bool]:
    """(query, dry_run) of a discard, from POST /admin/discard's body or `efd discard`'s
    options: the pending deliveries to one destination that is not configured. A configured
    destination's deliveries are being sent, so they cannot be discarded."""
    known_fields(payload, DISCARD_FIELDS)
    if payload.get("destination") is None:
        raise ClientError(
            "missing_field",
            "destination is required: the destination, no longer configured, whose pending "
            "deliveries to discard",
            field="destination",
        )
    name = _text(payload["destination"], "destination")
    if name in configured:
        raise ClientError(
            "destination_configured",
            f"{name!r} is configured, so its deliveries are being sent: only the pending "
            "deliveries of a destination removed from the configuration can be discarded",
            field="destination",
            status=409,
        )
    since = parse_time(payload["since"], "since", now) if payload.get("since") is not None else None
    until = parse_time(payload["until"], "until", now) if payload.get("until") is not None else None
    dry_run = payload.get("dry_run", False)
    if not isinstance(dry_run, bool):
        raise ClientError("invalid_field", "dry_run must be true or false", field="dry_run")
    return DeliveryQuery((name,), (DeliveryStatus.PENDING,), since, until), dry_run


def unconfigured(backlog: Mapping[str, int], configured: Collection[str]) -> dict[str, int]:
    """The destinations with pending deliveries that are not configured (never sent), and
    how many each has, by name."""
    return {
        name: count for name, count in sorted(backlog.items()) if count and name not in configured
    }


def replay_request(payload: Any) -> tuple[str, str, str | None]:
    """(source, messageId, destination or None) from POST /admin/replay's body."""
    known_fields(payload, REPLAY_FIELDS)
    for key in ("source", "messageId"):
        if key not in payload:
            raise ClientError("missing_field", f"{key} is required", field=key)
    destination = payload.get("destination")
    return (
        _text(payload["source"], "source"),
        _text(payload["messageId"], "messageId"),
        None if destination is None else _text(destination, "destination"),
    )


def replay_targets(
    originals: Mapping[str, int], destination: str | None, configured: Collection[str]
) -> list[tuple[int, str]]:
    """(original delivery id, destination) of each replay to create: to `destination`, or
    to every configured destination the message was routed to."""
    if destination is not None:
        if destination not in configured:
            raise ClientError(
                "unknown_destination",
                f"no destination named {destination!r} is configured",
                field="destination",
                status=404,
            )
        if destination not in originals:
            raise ClientError(
                "not_routed",
                f"the message was not routed to {destination!r}, so it cannot be sent there again",
                field="destination",
                status=409,
            )
        return [(originals[destination], destination)]
    targets = [(delivery_id, name) for name, delivery_id in originals.items() if name in configured]
    if not targets:
        raise ClientError(
            "not_routed",
            "the message has no delivery to a destination configured now",
            field="destination",
            status=409,
        )
    return targets


# -- what operators see ---------------------------------------------------------------------


def window_ends_at(delivery: DeliveryRecord, window: float) -> float:
    """When the delivery's retry window closes: `window` after its first attempt, or after
    its creation while it has none (its first attempt is then due)."""
    start = delivery.first_attempt_at
    return (start if start is not None else delivery.created_at) + window


def attempt_json(attempt: AttemptRecord) -> dict[str, Any]:
    # Any URL in it redacted: attempts written before errors were scrubbed may name one.
    error = None if attempt.error is None else redact_urls(attempt.error)
    if attempt.error_class is not None:
        error = f"{attempt.error_class}: {error}" if error else attempt.error_class
    return {
        "at": iso(attempt.attempted_at),
        "url": attempt.hook_url,
        "statusCode": attempt.status_code,
        "error": error,
        "durationMs": attempt.duration_ms,
        "response": attempt.response_head,
    }


def message_json(record: MessageRecord, window: float) -> dict[str, Any]:
    """GET /admin/messages/{source}/{messageId} and `efd inspect --json`."""
    return {
        "source": record.source,
        "messageId": record.message_id,
        "type": record.type,
        "userId": record.user_id,
        "anonymousId": record.anonymous_id,
        "event": record.event,
        "receivedAt": iso(record.received_at),
        "body": None if record.body is None else json.loads(record.body),
        "deliveries": [
            {
                "id": d.id,
                "destination": d.destination,
                "status": d.status,
                "attemptCount": d.attempts,
                "nextAttemptAt": iso(d.next_attempt_at) if d.status == "pending" else None,
                "windowEndsAt": iso(window_ends_at(d, window)),
                "replayOf": d.replay_of,
                # Which filter stopped it, and why (docs/filters.md).
                "filteredBy": d.last_error if d.status == DeliveryStatus.FILTERED else None,
                # Why its last round failed, or why routing failed it (an action whose
                # mapping or request could not be made for the message: docs/actions.md).
                "lastError": None if d.last_error is None else redact_urls(d.last_error),
                # An action's: the URL rendered for the message, credentials and query
                # values hidden as in the attempts.
                "url": None if d.url is None else redact_url(d.url),
                # Queued in its lane (an ordered destination): the messageId of the lane's
                # head, which has to have an outcome first.
                "waitingFor": record.waiting_for.get(d.id),
                "attempts": [attempt_json(a) for a in record.attempts.get(d.id, ())],
            }
            for d in record.deliveries
        ],
    }


def lanes_json(blocked: BlockedLanes | None) -> dict[str, Any]:
    """An ordered destination's lanes in GET /admin/destinations and `efd lanes --json`:
    how many are blocked (their head failed at least once and has no outcome yet), and the
    head blocked longest."""
    if blocked is None or blocked.count == 0:
        return {"blocked": 0, "oldestBlockedMessageId": None, "oldestBlockedSince": None}
    return {
        "blocked": blocked.count,
        "oldestBlockedMessageId": blocked.oldest_message_id,
        "oldestBlockedSince": iso(blocked.oldest_since),
    }


def replay_json(created: Sequence[tuple[int, str]], ordered: Collection[str]) -> dict[str, Any]:
    """POST /admin/replay's answer and `efd replay --json`. A replay is sent at once, outside
    its lane: to an ordered destination it arrives out of order, and the answer says so."""
    return {
        "deliveries": [
            {"id": i, "destination": name, "outOfOrder": name in ordered} for i, name in created
        ]
    }


def delivery_json(delivery: DeliveryRecord, window: float) -> dict[str, Any]:
    """One row of GET /admin/deliveries and `efd deliveries --json`."""
    return {
        "id": delivery.id,
        "source": delivery.source,
        "messageId": delivery.message_id,
        "destination": delivery.destination,
        "status": delivery.status,
        "attemptCount": delivery.attempts,
        "receivedAt": iso(delivery.received_at),
        "nextAttemptAt": iso(delivery.next_attempt_at) if delivery.status == "pending" else None,
        "windowEndsAt": iso(window_ends_at(delivery, window)),
        "userId": delivery.user_id,
        "type": delivery.type,
        "event": delivery.event,
        "replayOf": delivery.replay_of,
        "url": None if delivery.url is None else redact_url(delivery.url),
    }


def page_json(found: list[DeliveryRecord], limit: int, window: float) -> dict[str, Any]:
    """A page of deliveries; `found` holds up to limit + 1, the extra one only telling that
    another page follows."""
    page = found[:limit]
    more = len(found) > limit
    return {
        "deliveries": [delivery_json(d, window) for d in page],
        "nextCursor": str(page[-1].id) if more and page else None,
    }
