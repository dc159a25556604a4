"""Validation and normalisation of incoming Segment messages (pure: no I/O).

A request is all or nothing: the first invalid message rejects the whole request with a
`ClientError` that names the rule, the field and, in a batch, the message's index.
"""

from __future__ import annotations

import functools
import json
import math
import re
import uuid
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from efd import jsonjs
from efd.errors import ClientError

MAX_MESSAGE_BYTES = 32 * 1024
MAX_REQUEST_BYTES = 500 * 1024
MAX_BATCH_MESSAGES = 2500
MAX_MESSAGE_ID_CHARS = 100

TYPES = frozenset({"identify", "track", "page", "screen", "group", "alias"})
# Types that need a userId or an anonymousId (alias needs userId and previousId instead).
_NEEDS_IDENTITY = frozenset({"identify", "track", "page", "screen", "group"})


@dataclass(slots=True)  # not frozen: built on the hot path, where frozen __init__ costs
class Message:
    """One accepted message, normalised. `fields` holds the type-specific parts."""

    type: str
    message_id: str
    user_id: str | None
    anonymous_id: str | None
    timestamp: datetime
    context: dict[str, Any] | None
    integrations: dict[str, Any]
    fields: dict[str, Any]
    # The client's own timestamp, when `timestamp` is its clock-skew correction.
    original_timestamp: datetime | None = None


# The forms real clients send, and no others: date, T (or a space), time to the second,
# an optional fraction, and Z, an offset with or without its colon, or nothing (UTC).
# datetime.fromisoformat parses each of them; this decides which are accepted.
_TIMESTAMP = re.compile(
    r"\d{4}-\d\d-\d\d[T ]\d\d:\d\d:\d\d(?:\.\d{1,9})?(?:Z|[+-]\d\d:?\d\d)?", re.ASCII
)


def parse_timestamp(value: Any, field: str) -> datetime:
    """Parse `YYYY-MM-DDTHH:MM:SS[.fraction][Z|+HH:MM|+HHMM]` (no offset: UTC)."""
    if not isinstance(value, str):
        raise ClientError("invalid_field", f"{field} must be an ISO 8601 string", field=field)
    try:
        if _TIMESTAMP.fullmatch(value) is None:
            raise ValueError(value)
        parsed = datetime.fromisoformat(value)
    except ValueError:
        raise ClientError(
            "invalid_field",
            f"{field} is not an ISO 8601 date-time such as 2026-11-24T10:00:00.000Z: "
            f"{value[:40]!r}",
            field=field,
        ) from None
    if parsed.tzinfo is None:
        return parsed.replace(tzinfo=UTC)  # no offset given: Segment reads it as UTC
    try:
        return parsed.astimezone(UTC)
    except OverflowError:
        raise ClientError("invalid_field", f"{field} is out of range", field=field) from None


@functools.lru_cache(maxsize=256)  # a batch's messages often share one time
def format_timestamp(value: datetime) -> str:
    """ISO 8601 UTC with milliseconds and Z, as the webhook bodies carry."""
    naive = value.astimezone(UTC).replace(tzinfo=None)
    return naive.isoformat(timespec="milliseconds") + "Z"


def _no_surrogates(value: str, key: str) -> str:
    # The store writes identifiers into columns: text there must be valid Unicode.
    if jsonjs.has_lone_surrogate(value):
        raise ClientError(
            "invalid_field", f"{key} holds an unpaired surrogate (\\ud800-\\udfff)", field=key
        )
    return value


# C0, DEL and C1: an identifier holding one breaks log lines, the admin API's paths and any
# HTTP header it is ever put in.
_CONTROL = re.compile("[\x00-\x1f\x7f-\x9f]")


def _no_controls(value: str, key: str) -> str:
    found = _CONTROL.search(value)
    if found is not None:
        raise ClientError(
            "invalid_field",
            f"{key} holds a control character (U+{ord(found.group()):04X} at position "
            f"{found.start()}); C0 (U+0000-U+001F), DEL (U+007F) and C1 (U+0080-U+009F) "
            "are refused",
            field=key,
        )
    return value


def _nul(value: str, key: str) -> ClientError:
    return ClientError(
        "invalid_field",
        f"{key} holds a NUL character (U+0000 at position {value.index(chr(0))}), which "
        "identifiers and event names may not contain",
        field=key,
    )


def _identity(raw: Mapping[str, Any], key: str) -> str | None:
    value = raw.get(key)
    if type(value) is str:  # the common case first: this runs twice per message
        # Identifiers become columns, and PostgreSQL's text cannot hold U+0000: refused on
        # every backend alike, rather than stored on one and failing on the other.
        if "\x00" in value:
            raise _nul(value, key)
        if value.isascii():
            return value or None
        return _no_surrogates(value, key)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, (str, int, float)):
        raise ClientError("invalid_field", f"{key} must be a string", field=key)
    if isinstance(value, float):
        if not math.isfinite(value):
            raise ClientError("invalid_field", f"{key} must be a string", field=key)
        return jsonjs.js_number(value)
    return value if isinstance(value, str) else str(value)


def _object(raw: Mapping[str, Any], key: str) -> dict[str, Any] | None:
    value = raw.get(key)
    if value is None:
        return None
    if not isinstance(value, dict):
        raise ClientError("invalid_field", f"{key} must be an object", field=key)
    return value


def _required_string(raw: Mapping[str, Any], key: str, type_: str) -> str:
    value = _identity(raw, key)
    if value is None:
        raise ClientError("missing_field", f"{type_} needs {key}", field=key)
    return value


def normalise(
    raw: Any,
    *,
    received_at: datetime,
    type_: str | None = None,
    batch_context: Mapping[str, Any] | None = None,
    batch_integrations: Mapping[str, Any] | None = None,
    batch_sent_at: datetime | None = None,
) -> Message:
    """Validate one message and return its normalised form, or raise `ClientError`.

    `type_` is set by the single-message endpoints (/v1/track …); in a batch each message
    carries its own. Batch-level context and integrations are merged underneath the
    message's own keys; batch sentAt applies when the message has none.
    """
    if not isinstance(raw, dict):
        raise ClientError("invalid_message", "a message must be a JSON object")
    msg_type = type_ or raw.get("type")
    if not isinstance(msg_type, str) or msg_type not in TYPES:
        if msg_type is None:
            raise ClientError("missing_field", "message needs a type", field="type")
        raise ClientError(
            "invalid_field",
            f"type must be one of {', '.join(sorted(TYPES))}",
            field="type",
        )
    assert isinstance(msg_type, str)

    user_id = _identity(raw, "userId")
    anonymous_id = _identity(raw, "anonymousId")
    if msg_type in _NEEDS_IDENTITY and user_id is None and anonymous_id is None:
        raise ClientError(
            "missing_field", f"{msg_type} needs userId or anonymousId", field="userId"
        )

    message_id = raw.get("messageId")
    if message_id is None or message_id == "":
        message_id = str(uuid.uuid4())
    elif not isinstance(message_id, str):
        raise ClientError("invalid_field", "messageId must be a string", field="messageId")
    elif len(message_id) > MAX_MESSAGE_ID_CHARS:
        raise ClientError(
            "invalid_field",
            f"messageId is longer than {MAX_MESSAGE_ID_CHARS} characters",
            field="messageId",
        )
    else:
        if not message_id.isascii():
            _no_surrogates(message_id, "messageId")
        if not message_id.isprintable():  # C speed; the exact rule only for the rare rest
            _no_controls(message_id, "messageId")

    context = _object(raw, "context")
    if batch_context:
        context = {**batch_context, **(context or {})}
    integrations = _object(raw, "integrations") or {}
    if batch_integrations:
        integrations = {**batch_integrations, **integrations}

    timestamp, original_timestamp = _corrected_timestamp(raw, received_at, batch_sent_at)
    fields = _type_fields(msg_type, raw, user_id)
    return Message(
        type=msg_type,
        message_id=message_id,
        user_id=user_id,
        anonymous_id=anonymous_id,
        timestamp=timestamp,
        context=context,
        integrations=integrations,
        fields=fields,
        original_timestamp=original_timestamp,
    )


def _corrected_timestamp(
    raw: Mapping[str, Any], received_at: datetime, batch_sent_at: datetime | None
) -> tuple[datetime, datetime | None]:
    """The message's time, and the client's own when the time is a correction of it.

    Segment's clock-skew rule: the client's timestamp moved by (receivedAt - sentAt), so a
    device whose clock is off still lands at the right server time; like Segment's
    originalTimestamp, the client's value is kept beside it. Both are checked whether or
    not the other is there."""
    sent_at = (
        parse_timestamp(raw["sentAt"], "sentAt") if raw.get("sentAt") is not None else batch_sent_at
    )
    if raw.get("timestamp") is None:
        return received_at, None
    timestamp = parse_timestamp(raw["timestamp"], "timestamp")
    if sent_at is None:
        return timestamp, None
    try:
        return received_at + (timestamp - sent_at), timestamp
    except OverflowError:
        raise ClientError(
            "invalid_field",
            "timestamp is out of range after the sentAt correction",
            field="timestamp",
        ) from None


def _type_fields(msg_type: str, raw: Mapping[str, Any], user_id: str | None) -> dict[str, Any]:
    if msg_type == "track":
        event = raw.get("event")
        if event is None or event == "":
            raise ClientError("missing_field", "track needs event", field="event")
        if not isinstance(event, str):
            raise ClientError("invalid_field", "event must be a string", field="event")
        if "\x00" in event:  # a column too, as the identifiers are
            raise _nul(event, "event")
        return {
            "event": event if event.isascii() else _no_surrogates(event, "event"),
            "properties": _object(raw, "properties") or {},
        }
    if msg_type == "identify":
        return {"traits": _object(raw, "traits") or {}}
    if msg_type == "group":
        group_id = _required_string(raw, "groupId", "group")
        return {"groupId": group_id, "traits": _object(raw, "traits") or {}}
    if msg_type == "alias":
        if user_id is None:
            raise ClientError("missing_field", "alias needs userId", field="userId")
        return {"previousId": _required_string(raw, "previousId", "alias")}
    if msg_type == "page":
        properties = dict(_object(raw, "properties") or {})
        # analytics.js sends the page's name and category beside its properties; the webhook
        # body only has properties, so they travel there unless properties already set them.
        for key in ("name", "category"):
            value = raw.get(key)
            if isinstance(value, str) and value and key not in properties:
                properties[key] = value
        return {"properties": properties}
    # screen
    name = raw.get("name")
    if name is not None and not isinstance(name, str):
        raise ClientError("invalid_field", "name must be a string", field="name")
    fields: dict[str, Any] = {"name": name or ""}
    screen_properties = _object(raw, "properties")
    if screen_properties:
        fields["properties"] = screen_properties
    return fields


def message_size(raw: Any) -> int:
    """Bytes of a message as compact JSON, the measure of the 32 KiB limit."""
    return len(
        json.dumps(raw, separators=(",", ":"), ensure_ascii=False).encode("utf-8", "surrogatepass")
    )


def normalise_request(
    payload: Any,
    *,
    received_at: datetime,
    type_: str | None,
    body_bytes: int,
) -> list[Message]:
    """Validate a whole request: a batch (type_ is None) or one message of type `type_`."""
    if not isinstance(payload, dict):
        raise ClientError("invalid_body", "the request body must be a JSON object")
    if type_ is not None:
        if body_bytes > MAX_MESSAGE_BYTES and message_size(payload) > MAX_MESSAGE_BYTES:
            raise ClientError(
                "message_too_large", f"a message may be at most {MAX_MESSAGE_BYTES} bytes"
            )
        return [normalise(payload, received_at=received_at, type_=type_)]

    batch = payload.get("batch")
    if batch is None:
        raise ClientError("missing_field", "a batch request needs a batch array", field="batch")
    if not isinstance(batch, list):
        raise ClientError("invalid_field", "batch must be an array", field="batch")
    if not batch:
        raise ClientError("invalid_field", "batch is empty", field="batch")
    if len(batch) > MAX_BATCH_MESSAGES:
        raise ClientError(
            "batch_too_large",
            f"a batch may hold at most {MAX_BATCH_MESSAGES} messages, got {len(batch)}",
            field="batch",
        )
    context = _object(payload, "context")
    integrations = _object(payload, "integrations")
    sent_at = (
        parse_timestamp(payload["sentAt"], "sentAt") if payload.get("sentAt") is not None else None
    )
    # Only a request over the per-message limit can hold a message over it.
    check_size = body_bytes > MAX_MESSAGE_BYTES
    messages = []
    for index, raw in enumerate(batch):
        try:
            if check_size and message_size(raw) > MAX_MESSAGE_BYTES:
                raise ClientError(
                    "message_too_large", f"a message may be at most {MAX_MESSAGE_BYTES} bytes"
                )
            messages.append(
                normalise(
                    raw,
                    received_at=received_at,
                    batch_context=context,
                    batch_integrations=integrations,
                    batch_sent_at=sent_at,
                )
            )
        except ClientError as rejection:
            rejection.index = index
            rejection.message = f"batch[{index}]: {rejection.message}"
            raise
    return messages
