"""The OpenAPI description's schemas: Segment's messages as efd reads them, and the bodies
and answers of the admin and regulations APIs."""

from __future__ import annotations

from typing import Any

from efd.http.openapi.common import (
    COUNT_VALUE,
    ISO,
    NULLABLE_ISO,
    NULLABLE_STRING,
    TEXT,
    TIME_FILTER,
    WHEN,
    or_null,
    ref,
)
from efd.records import DeliveryStatus
from efd.segment.messages import MAX_BATCH_MESSAGES, MAX_MESSAGE_ID_CHARS

# -- messages ----------------------------------------------------------------------------------

# The forms efd reads (efd/segment/messages.py): RFC 3339 here; a space for T, an offset without its
# colon, or none (UTC) too.
_TIMESTAMP = {
    "type": ["string", "null"],
    "format": "date-time",
    "pattern": "^[12][0-9]{3}-",
    "description": "ISO 8601, as 2026-11-24T10:00:00.000Z; also read: a space for T, an offset "
    "without its colon, or none (UTC)",
}
# Identifiers and event names become columns: no U+0000 (PostgreSQL's text cannot hold it).
_NO_NUL = "^[^\\u0000]*$"
_ID = {
    "type": ["string", "number", "null"],
    "pattern": _NO_NUL,  # applies to a string only
    "description": "a string (no U+0000); a number is read as its JavaScript spelling; empty "
    "means absent",
}
_GIVEN_ID = {"anyOf": [{"type": "string", "minLength": 1, "pattern": _NO_NUL}, {"type": "number"}]}
_OBJECT = {"type": ["object", "null"]}
_COMMON = {
    "messageId": {
        "type": ["string", "null"],
        "maxLength": MAX_MESSAGE_ID_CHARS,
        "pattern": "^[^\\u0000-\\u001f\\u007f-\\u009f]*$",  # no C0, DEL or C1
        "description": "empty or absent: efd makes one; no control character (C0, DEL, C1)",
    },
    "userId": _ID,
    "anonymousId": _ID,
    "timestamp": _TIMESTAMP,
    "sentAt": _TIMESTAMP,
    "context": _OBJECT,
    "integrations": _OBJECT,
    "writeKey": {"description": "read only without an Authorization header: a string"},
}
_IDENTIFIED = {
    "anyOf": [
        {"required": ["userId"], "properties": {"userId": _GIVEN_ID}},
        {"required": ["anonymousId"], "properties": {"anonymousId": _GIVEN_ID}},
    ]
}
# Per type: its own fields, what it requires and why. A field a type does not use is
# ignored by it, whatever its value, so it is left unconstrained there.
TYPES: dict[str, tuple[dict[str, Any], list[str], str]] = {
    "identify": ({"traits": _OBJECT}, [], "needs userId or anonymousId"),
    "track": (
        {"event": {"type": "string", "minLength": 1, "pattern": _NO_NUL}, "properties": _OBJECT},
        ["event"],
        "needs userId or anonymousId, and event",
    ),
    "page": (
        {
            "properties": _OBJECT,
            "name": {"description": "a string: copied into properties"},
            "category": {"description": "a string: copied into properties"},
        },
        [],
        "needs userId or anonymousId",
    ),
    "screen": (
        {"name": {"type": ["string", "null"]}, "properties": _OBJECT},
        [],
        "needs userId or anonymousId",
    ),
    "group": (
        {"groupId": _GIVEN_ID, "traits": _OBJECT},
        ["groupId"],
        "needs userId or anonymousId, and groupId",
    ),
    "alias": (
        {"userId": _GIVEN_ID, "previousId": _GIVEN_ID},
        ["userId", "previousId"],
        "needs userId and previousId",
    ),
}


def schema_name(type_: str) -> str:
    return type_.capitalize() + "Message"


def message_schema(type_: str) -> dict[str, Any]:
    own, required, rule = TYPES[type_]
    schema: dict[str, Any] = {
        "type": "object",
        "description": f"A Segment {type_} message: {rule}. On /v1/{type_} the path gives "
        "its type, and a `type` field is ignored.",
        "properties": {
            "type": {"description": "in a batch: the message's type"},
            **_COMMON,
            **own,
        },
    }
    if required:
        schema["required"] = required
    if type_ != "alias":
        schema.update(_IDENTIFIED)
    return schema


def _batch_item(type_: str) -> dict[str, Any]:
    return {
        "allOf": [
            {"required": ["type"], "properties": {"type": {"const": type_}}},
            ref(schema_name(type_)),
        ]
    }


BATCH = {
    "type": "object",
    "required": ["batch"],
    "properties": {
        "batch": {
            "type": "array",
            "minItems": 1,
            "maxItems": MAX_BATCH_MESSAGES,
            "items": {"oneOf": [_batch_item(t) for t in TYPES]},
        },
        "context": {**_OBJECT, "description": "merged under each message's own"},
        "integrations": {**_OBJECT, "description": "merged under each message's own"},
        "sentAt": {**_TIMESTAMP, "description": "for messages without their own"},
        "writeKey": _COMMON["writeKey"],
    },
}

# -- the admin API -----------------------------------------------------------------------------

ATTEMPT = {
    "type": "object",
    "required": ["at", "url", "statusCode", "error", "durationMs", "response"],
    "properties": {
        "at": ISO,
        "url": {"type": "string", "description": "the hook URL, credentials redacted"},
        "statusCode": {"type": ["integer", "null"]},
        "error": {
            "type": ["string", "null"],
            "description": "the error class (timeout, connect, …) and its text",
        },
        "durationMs": {"type": ["number", "null"]},
        "response": {"type": ["string", "null"], "description": "the response body's first bytes"},
    },
}

STATUS = {"type": "string", "enum": [s.value for s in DeliveryStatus]}

DELIVERY = {
    "type": "object",
    "required": [
        "id",
        "destination",
        "status",
        "attemptCount",
        "nextAttemptAt",
        "windowEndsAt",
        "replayOf",
        "filteredBy",
        "lastError",
        "url",
        "waitingFor",
        "attempts",
    ],
    "properties": {
        "id": {"type": "integer"},
        "destination": {"type": "string"},
        "status": STATUS,
        "attemptCount": {"type": "integer", "description": "rounds sent since the last redrive"},
        "nextAttemptAt": NULLABLE_ISO,
        "windowEndsAt": ISO,
        "replayOf": {"type": ["integer", "null"], "description": "the delivery it replays"},
        "filteredBy": {
            **NULLABLE_STRING,
            "description": "status filtered: the destination filter that stopped the message, "
            "and why (never sent); null otherwise",
        },
        "lastError": {
            **NULLABLE_STRING,
            "description": "why its last round failed; for an action's delivery that failed "
            "at routing (no rounds), why its mapping or request could not be made",
        },
        "url": {
            **NULLABLE_STRING,
            "description": "an action's delivery: the URL rendered for its message (query "
            "values hidden); null for a webhooks destination",
        },
        "waitingFor": {
            **NULLABLE_STRING,
            "description": "status queued (an ordered destination): the messageId of the head "
            "of its lane, which has to have an outcome before this one is sent",
        },
        "attempts": {"type": "array", "items": ref("Attempt")},
    },
}

MESSAGE_VIEW = {
    "type": "object",
    "required": [
        "source",
        "messageId",
        "type",
        "userId",
        "anonymousId",
        "event",
        "receivedAt",
        "body",
        "deliveries",
    ],
    "properties": {
        "source": {"type": "string"},
        "messageId": {"type": "string"},
        "type": {"type": "string"},
        "userId": NULLABLE_STRING,
        "anonymousId": NULLABLE_STRING,
        "event": NULLABLE_STRING,
        "receivedAt": ISO,
        "body": {
            "type": ["object", "null"],
            "description": "the webhook body; null once a deletion request purged it",
        },
        "deliveries": {"type": "array", "items": ref("Delivery")},
    },
}

DELIVERY_ROW = {
    "type": "object",
    "required": [
        "id",
        "source",
        "messageId",
        "destination",
        "status",
        "attemptCount",
        "receivedAt",
        "nextAttemptAt",
        "windowEndsAt",
        "userId",
        "type",
        "event",
        "replayOf",
        "url",
    ],
    "properties": {
        "id": {"type": "integer"},
        "source": {"type": "string"},
        "messageId": {"type": "string"},
        "destination": {"type": "string"},
        "status": STATUS,
        "attemptCount": {"type": "integer"},
        "receivedAt": ISO,
        "nextAttemptAt": NULLABLE_ISO,
        "windowEndsAt": ISO,
        "userId": NULLABLE_STRING,
        "type": {"type": "string"},
        "event": NULLABLE_STRING,
        "replayOf": {"type": ["integer", "null"]},
        "url": {**NULLABLE_STRING, "description": "an action's delivery: its rendered URL"},
    },
}

COUNT = {
    "type": "object",
    "required": ["count"],
    "properties": {"count": COUNT_VALUE},
}

REDRIVE = {
    "type": "object",
    "additionalProperties": False,
    "properties": {
        "destination": {
            **or_null(TEXT),
            "description": "a configured destination (another: 404); default: every one",
        },
        "status": or_null({"type": "string", "enum": ["failed", "expired"]}),
        "since": {**or_null(TIME_FILTER), "description": f"messages received since: {WHEN}"},
        "until": {**or_null(TIME_FILTER), "description": f"messages received before: {WHEN}"},
        "dry_run": {"type": "boolean", "default": False},
    },
}

DISCARD = {
    "type": "object",
    "additionalProperties": False,
    "required": ["destination"],
    "properties": {
        "destination": {
            **TEXT,
            "description": "a destination that is not configured (a configured one: 409)",
        },
        "since": {**or_null(TIME_FILTER), "description": f"messages received since: {WHEN}"},
        "until": {**or_null(TIME_FILTER), "description": f"messages received before: {WHEN}"},
        "dry_run": {"type": "boolean", "default": False},
    },
}

REPLAY = {
    "type": "object",
    "additionalProperties": False,
    "required": ["source", "messageId"],
    "properties": {
        "source": TEXT,
        "messageId": TEXT,
        "destination": {
            **or_null(TEXT),
            "description": "default: every configured one it was routed to; one not configured "
            "is 404, one it was not routed to 409",
        },
    },
}

_WINDOW = {
    "type": "object",
    "required": ["attempts", "successRate", "p50Ms", "p99Ms"],
    "properties": {
        "attempts": COUNT_VALUE,
        "successRate": {"type": ["number", "null"], "description": "null without attempts"},
        "p50Ms": {"type": ["number", "null"]},
        "p99Ms": {"type": ["number", "null"]},
    },
}
RETENTION_LAG = {
    "type": "object",
    "description": "How far behind retention's purge of finished messages is",
    "required": ["horizon", "oldestUnpurgedAt", "behindSeconds", "kept"],
    "properties": {
        "horizon": {**ISO, "description": "now less [storage] retention_days"},
        "oldestUnpurgedAt": {
            **NULLABLE_ISO,
            "description": "receipt of the oldest message before the horizon that retention "
            "has not reached yet; null when it has caught up",
        },
        "behindSeconds": {"type": "number", "description": "horizon - oldestUnpurgedAt, or 0"},
        "kept": {
            **COUNT_VALUE,
            "description": "messages before the horizon kept because a delivery of theirs is "
            "pending, queued or finished after it; looked at again every run",
        },
    },
}
PAUSE = {
    "type": "object",
    "description": "A pause or disable of a destination (hook null) or of one of its hooks",
    "required": ["destination", "hook", "kind", "reason", "since"],
    "properties": {
        "destination": {"type": "string"},
        "hook": {
            "type": ["integer", "null"],
            "description": "the hook's position in the configuration, from 1 (an actions "
            "destination's action); null: the whole destination",
        },
        "kind": {
            "type": "string",
            "enum": ["paused", "disabled"],
            "description": "paused by an operator, or disabled by efd after failing for "
            "[delivery] disable_after_hours",
        },
        "reason": NULLABLE_STRING,
        "since": {**ISO, "description": "since when its deliveries are held"},
    },
}
PAUSE_REQUEST = {
    "type": "object",
    "additionalProperties": False,
    "properties": {
        "hook": {
            "type": "integer",
            "minimum": 1,
            "description": "only this hook: its position in the configuration, from 1 "
            "(default: the whole destination)",
        },
        "reason": {"type": "string", "maxLength": 500, "description": "shown with the pause"},
    },
}
RESUME_REQUEST = {
    "type": "object",
    "additionalProperties": False,
    "properties": {
        "hook": {"type": "integer", "minimum": 1, "description": "the hook, as it was paused"},
    },
}
DESTINATION_HEALTH = {
    "type": "object",
    "required": [
        "name",
        "configured",
        "backlog",
        "oldestPendingAt",
        "destination",
        "pause",
        "state",
        "ordering",
        "lanes",
        "hooks",
    ],
    "properties": {
        "name": {"type": "string"},
        "configured": {
            "type": "boolean",
            "description": "false: removed from the configuration with deliveries still "
            "pending, which are never sent (no hooks then)",
        },
        "backlog": {**COUNT_VALUE, "description": "pending deliveries"},
        "oldestPendingAt": {**NULLABLE_ISO, "description": "the oldest pending one's creation"},
        "destination": {
            "type": "string",
            "description": "the configured destination's name, which pauses name (an action "
            "is listed as destination/action)",
        },
        "pause": {
            "oneOf": [PAUSE, {"type": "null"}],
            "description": "the whole destination's pause or disable; null: none",
        },
        "state": {
            "type": "string",
            "enum": ["active", "paused", "disabled", "partly"],
            "description": "paused or disabled: the whole destination, or every hook; "
            "partly: some hooks",
        },
        "ordering": {
            "type": ["string", "null"],
            "enum": ["none", "per_user", None],
            "description": "null for a destination no longer configured",
        },
        "lanes": {
            "type": ["object", "null"],
            "description": "ordering per_user: lanes whose head failed at least once and has no "
            "outcome yet, holding that user's later messages back; else null",
            "required": ["blocked", "oldestBlockedMessageId", "oldestBlockedSince"],
            "properties": {
                "blocked": COUNT_VALUE,
                "oldestBlockedMessageId": NULLABLE_STRING,
                "oldestBlockedSince": {
                    **NULLABLE_ISO,
                    "description": "the first attempt of the head blocked longest",
                },
            },
        },
        "hooks": {
            "type": "array",
            "items": {
                "type": "object",
                "required": [
                    "url",
                    "hook",
                    "pause",
                    "circuit",
                    "lastError",
                    "lastErrorAt",
                    "window",
                    "maxPerSecond",
                    "burst",
                    "heldBack",
                ],
                "properties": {
                    "url": {"type": "string", "description": "credentials and query values hidden"},
                    "hook": {
                        "type": "integer",
                        "description": "its number in pauses: its position, from 1",
                    },
                    "pause": {
                        "oneOf": [PAUSE, {"type": "null"}],
                        "description": "this hook's own pause or disable; null: none",
                    },
                    "circuit": {"type": "string", "enum": ["closed", "open"]},
                    "lastError": {**NULLABLE_STRING, "description": "within the last 24 h"},
                    "lastErrorAt": NULLABLE_ISO,
                    "window": {
                        "type": "object",
                        "required": ["1h", "24h"],
                        "properties": {"1h": _WINDOW, "24h": _WINDOW},
                    },
                    "maxPerSecond": {
                        "type": ["number", "null"],
                        "description": "the hook's rate limit (max_per_second); null: none",
                    },
                    "burst": {
                        "type": ["number", "null"],
                        "description": "requests it may take at once after a quiet spell",
                    },
                    "heldBack": {
                        **COUNT_VALUE,
                        "description": "requests this daemon sent later than due because of "
                        "the limit, since it started",
                    },
                },
            },
        },
    },
}

# -- regulations -------------------------------------------------------------------------------

_REGULATION_TYPES = ["DELETE_ONLY", "SUPPRESS_WITH_DELETE", "SUPPRESS_ONLY", "UNSUPPRESS"]
REGULATION_REQUEST = {
    "type": "object",
    "additionalProperties": False,
    "required": ["regulationType", "subjectType", "subjectIds"],
    "properties": {
        "regulationType": {"type": "string", "enum": _REGULATION_TYPES},
        "subjectType": {"type": "string", "enum": ["USER_ID"]},
        "subjectIds": {
            "type": "array",
            "minItems": 1,
            "maxItems": 5000,
            "items": {"type": "string", "minLength": 1, "maxLength": 1000, "pattern": _NO_NUL},
            "description": "userIds; repeats count once",
        },
    },
}
_STREAM_STATUS = {
    "oneOf": [
        {
            "type": "object",
            "description": "its delete notifications are stored, one per user",
            "required": ["source", "status", "notifications", "finishedAt", "destinations"],
            "properties": {
                "source": {"type": "string"},
                "status": {"const": "FINISHED"},
                "notifications": COUNT_VALUE,
                "finishedAt": NULLABLE_ISO,
                "destinations": {
                    "type": "array",
                    "items": {
                        "type": "object",
                        "description": "how many of the notifications are in each status now",
                        "required": ["name", *[s.value for s in DeliveryStatus]],
                        "properties": {
                            "name": {"type": "string"},
                            **{s.value: COUNT_VALUE for s in DeliveryStatus},
                        },
                    },
                },
            },
        },
        {
            "type": "object",
            "required": ["source", "status", "reason"],
            "properties": {
                "source": {"type": "string"},
                "status": {"const": "SKIPPED"},
                "reason": {"type": "string", "enum": ["not configured", "no webhook destination"]},
            },
        },
        {
            "type": "object",
            "description": "not done yet, or the regulation failed before it",
            "required": ["source", "status"],
            "properties": {
                "source": {"type": "string"},
                "status": {"type": "string", "enum": ["PENDING", "FAILED"]},
            },
        },
    ]
}
REGULATION = {
    "type": "object",
    "required": [
        "id",
        "regulationType",
        "subjectType",
        "subjectCount",
        "source",
        "overallStatus",
        "createdAt",
        "startedAt",
        "finishedAt",
        "error",
        "streamStatus",
        "purged",
    ],
    "properties": {
        "id": {"type": "string"},
        "regulationType": {"type": "string", "enum": _REGULATION_TYPES},
        "subjectType": {"type": "string", "enum": ["USER_ID"]},
        "subjectCount": COUNT_VALUE,
        "source": {**NULLABLE_STRING, "description": "the one source, or null: every source"},
        "overallStatus": {
            "type": "string",
            "enum": ["INITIALIZED", "RUNNING", "FINISHED", "FAILED"],
        },
        "createdAt": ISO,
        "startedAt": NULLABLE_ISO,
        "finishedAt": NULLABLE_ISO,
        "error": NULLABLE_STRING,
        "streamStatus": {
            "type": "array",
            "description": "per source in scope (delete types; empty for the others)",
            "items": _STREAM_STATUS,
        },
        "purged": {
            "type": "object",
            "description": "what the purge deleted so far",
            "required": ["messages", "profiles", "identities", "events", "computedValues"],
            "properties": {
                key: COUNT_VALUE
                for key in ("messages", "profiles", "identities", "events", "computedValues")
            },
        },
    },
}
