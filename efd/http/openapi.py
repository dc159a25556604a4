"""The OpenAPI 3.1 description of efd's HTTP API, served at GET /openapi.json: the ingestion
API (/v1/*), the regulations and admin APIs, /healthz, /readyz and /metrics. Data only.

The schemas say what efd accepts, no more and no less, so that a request valid by them is
never refused with a 400 and one invalid by them is: tests/integration/test_openapi.py runs
schemathesis against a daemon with every check on, and redocly's recommended rules on the
document. What depends on the running state (a configured destination, a stored message)
is answered 404 or 409, never 400. Timestamps are described for the years 1000 to 2999
(efd reads any year, but refuses a time that leaves years 1 to 9999 once moved to UTC or
corrected for clock skew, which no schema can state)."""

from __future__ import annotations

from typing import Any

from efd.rows import DeliveryStatus
from efd.rules import selection
from efd.rules.messages import MAX_BATCH_MESSAGES, MAX_MESSAGE_ID_CHARS

_JSON = "application/json"
_ISO = {"type": "string", "format": "date-time", "description": "ISO 8601 UTC"}
_NULLABLE_ISO = {"type": ["string", "null"], "format": "date-time", "description": "ISO 8601 UTC"}
_NULLABLE_STRING = {"type": ["string", "null"]}
_COUNT_VALUE = {"type": "integer", "minimum": 0}
_WHEN = (
    "ISO 8601 (UTC when no offset is given), or relative: `2h`, `30m`, `1d`, `90s` "
    "meaning that long ago. An until not later than since matches nothing"
)
# A name, userId or messageId given to the admin API (selection.text): not empty, bounded,
# no NUL (valid Unicode too, which JSON and URLs carry anyway).
_TEXT = {
    "type": "string",
    "minLength": 1,
    "maxLength": selection.MAX_TEXT,
    "pattern": "^[^\\u0000]*$",
}
_TIME_FILTER = {
    "anyOf": [
        {"type": "string", "format": "date-time"},
        {"type": "string", "format": "date"},
        {"type": "string", "pattern": "^[0-9]{1,9}[smhd]$"},
    ],
    "description": _WHEN,
}


def _or_null(schema: dict[str, Any]) -> dict[str, Any]:
    """`schema`, or null: a body field efd reads as absent when it is null."""
    if "anyOf" in schema:
        return {**schema, "anyOf": [*schema["anyOf"], {"type": "null"}]}
    nullable = {**schema, "type": [schema["type"], "null"]}
    if "enum" in schema:
        nullable["enum"] = [*schema["enum"], None]
    return nullable


def _ref(name: str) -> dict[str, str]:
    return {"$ref": f"#/components/schemas/{name}"}


def _json(schema: dict[str, Any], description: str) -> dict[str, Any]:
    return {"description": description, "content": {_JSON: {"schema": schema}}}


def _error(description: str) -> dict[str, Any]:
    return _json(_ref("Error"), description)


_TIMED_OUT = _error("the request did not arrive in full within request_timeout_seconds")
_INGEST_ERRORS = {
    "400": _error("the body or a message breaks a rule; nothing was stored"),
    "401": _error("no write key, or an unknown one"),
    "403": _error("the request's Origin is not in the source's allowed_origins"),
    "408": _TIMED_OUT,
    "503": _error("too many connections, or the store did not take the write; retry"),
}
_ADMIN_ERRORS = {
    "401": _error("no bearer token, or a wrong one"),
    "403": _error("the admin API is off: no [server] admin_token is configured"),
    "408": _TIMED_OUT,
    "503": _error("too many connections, or the store is unavailable; retry"),
}


def _operation(operation_id: str, tag: str, **fields: Any) -> dict[str, Any]:
    return {"operationId": operation_id, "tags": [tag], **fields}


def _ingest(operation_id: str, summary: str, body: dict[str, Any]) -> dict[str, Any]:
    return {
        "post": _operation(
            operation_id,
            "ingestion",
            summary=summary,
            description="The body is JSON, sent as application/json or, as browsers' beacons "
            "do, text/plain, and may be gzip-compressed (Content-Encoding: gzip). At most "
            "500 KiB, and 32 KiB a message as delivered.",
            # The write key: HTTP Basic, or writeKey in the body.
            security=[{"writeKey": []}, {}],
            requestBody={
                "required": True,
                "content": {_JSON: {"schema": body}, "text/plain": {"schema": body}},
            },
            responses={
                "200": _json(_ref("Success"), "stored (or a duplicate, or suppressed)"),
                **_INGEST_ERRORS,
            },
        )
    }


def _admin(operation_id: str, operation: dict[str, Any], *, tag: str = "admin") -> dict[str, Any]:
    responses = {**operation.pop("responses"), **_ADMIN_ERRORS}
    return {
        **_operation(operation_id, tag, security=[{"adminToken": []}], **operation),
        "responses": responses,
    }


def _query(name: str, description: str, schema: dict[str, Any]) -> dict[str, Any]:
    return {
        "name": name,
        "in": "query",
        "required": False,
        "description": description,
        "schema": schema,
    }


def _path(name: str, schema: dict[str, Any]) -> dict[str, Any]:
    return {"name": name, "in": "path", "required": True, "schema": schema}


_SINGLE = {
    "identify": "i",
    "track": "t",
    "page": "p",
    "screen": "s",
    "group": "g",
    "alias": "a",
}

# -- messages ----------------------------------------------------------------------------------

# The forms efd reads (efd/rules/messages.py): RFC 3339 here; a space for T, an offset without its
# colon, or none (UTC) too.
_TIMESTAMP = {
    "type": ["string", "null"],
    "format": "date-time",
    "pattern": "^[12][0-9]{3}-",
    "description": "ISO 8601, as 2026-11-24T10:00:00.000Z; also read: a space for T, an offset "
    "without its colon, or none (UTC)",
}
_ID = {
    "type": ["string", "number", "null"],
    "description": "a string; a number is read as its JavaScript spelling; empty means absent",
}
_GIVEN_ID = {"anyOf": [{"type": "string", "minLength": 1}, {"type": "number"}]}
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
_TYPES: dict[str, tuple[dict[str, Any], list[str], str]] = {
    "identify": ({"traits": _OBJECT}, [], "needs userId or anonymousId"),
    "track": (
        {"event": {"type": "string", "minLength": 1}, "properties": _OBJECT},
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


def _schema_name(type_: str) -> str:
    return type_.capitalize() + "Message"


def _message(type_: str) -> dict[str, Any]:
    own, required, rule = _TYPES[type_]
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
            _ref(_schema_name(type_)),
        ]
    }


_BATCH = {
    "type": "object",
    "required": ["batch"],
    "properties": {
        "batch": {
            "type": "array",
            "minItems": 1,
            "maxItems": MAX_BATCH_MESSAGES,
            "items": {"oneOf": [_batch_item(t) for t in _TYPES]},
        },
        "context": {**_OBJECT, "description": "merged under each message's own"},
        "integrations": {**_OBJECT, "description": "merged under each message's own"},
        "sentAt": {**_TIMESTAMP, "description": "for messages without their own"},
        "writeKey": _COMMON["writeKey"],
    },
}

# -- the admin API -----------------------------------------------------------------------------

_ATTEMPT = {
    "type": "object",
    "required": ["at", "url", "statusCode", "error", "durationMs", "response"],
    "properties": {
        "at": _ISO,
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

_STATUS = {"type": "string", "enum": [s.value for s in DeliveryStatus]}

_DELIVERY = {
    "type": "object",
    "required": [
        "id",
        "destination",
        "status",
        "attemptCount",
        "nextAttemptAt",
        "windowEndsAt",
        "replayOf",
        "waitingFor",
        "attempts",
    ],
    "properties": {
        "id": {"type": "integer"},
        "destination": {"type": "string"},
        "status": _STATUS,
        "attemptCount": {"type": "integer", "description": "rounds sent since the last redrive"},
        "nextAttemptAt": _NULLABLE_ISO,
        "windowEndsAt": _ISO,
        "replayOf": {"type": ["integer", "null"], "description": "the delivery it replays"},
        "waitingFor": {
            **_NULLABLE_STRING,
            "description": "status queued (an ordered destination): the messageId of the head "
            "of its lane, which has to have an outcome before this one is sent",
        },
        "attempts": {"type": "array", "items": _ref("Attempt")},
    },
}

_MESSAGE_VIEW = {
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
        "userId": _NULLABLE_STRING,
        "anonymousId": _NULLABLE_STRING,
        "event": _NULLABLE_STRING,
        "receivedAt": _ISO,
        "body": {
            "type": ["object", "null"],
            "description": "the webhook body; null once a deletion request purged it",
        },
        "deliveries": {"type": "array", "items": _ref("Delivery")},
    },
}

_DELIVERY_ROW = {
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
    ],
    "properties": {
        "id": {"type": "integer"},
        "source": {"type": "string"},
        "messageId": {"type": "string"},
        "destination": {"type": "string"},
        "status": _STATUS,
        "attemptCount": {"type": "integer"},
        "receivedAt": _ISO,
        "nextAttemptAt": _NULLABLE_ISO,
        "windowEndsAt": _ISO,
        "userId": _NULLABLE_STRING,
        "type": {"type": "string"},
        "event": _NULLABLE_STRING,
        "replayOf": {"type": ["integer", "null"]},
    },
}

_COUNT = {
    "type": "object",
    "required": ["count"],
    "properties": {"count": _COUNT_VALUE},
}

_REDRIVE = {
    "type": "object",
    "additionalProperties": False,
    "properties": {
        "destination": {
            **_or_null(_TEXT),
            "description": "a configured destination (another: 404); default: every one",
        },
        "status": _or_null({"type": "string", "enum": ["failed", "expired"]}),
        "since": {**_or_null(_TIME_FILTER), "description": f"messages received since: {_WHEN}"},
        "until": {**_or_null(_TIME_FILTER), "description": f"messages received before: {_WHEN}"},
        "dry_run": {"type": "boolean", "default": False},
    },
}

_DISCARD = {
    "type": "object",
    "additionalProperties": False,
    "required": ["destination"],
    "properties": {
        "destination": {
            **_TEXT,
            "description": "a destination that is not configured (a configured one: 409)",
        },
        "since": {**_or_null(_TIME_FILTER), "description": f"messages received since: {_WHEN}"},
        "until": {**_or_null(_TIME_FILTER), "description": f"messages received before: {_WHEN}"},
        "dry_run": {"type": "boolean", "default": False},
    },
}

_REPLAY = {
    "type": "object",
    "additionalProperties": False,
    "required": ["source", "messageId"],
    "properties": {
        "source": _TEXT,
        "messageId": _TEXT,
        "destination": {
            **_or_null(_TEXT),
            "description": "default: every configured one it was routed to; one not configured "
            "is 404, one it was not routed to 409",
        },
    },
}

_WINDOW = {
    "type": "object",
    "required": ["attempts", "successRate", "p50Ms", "p99Ms"],
    "properties": {
        "attempts": _COUNT_VALUE,
        "successRate": {"type": ["number", "null"], "description": "null without attempts"},
        "p50Ms": {"type": ["number", "null"]},
        "p99Ms": {"type": ["number", "null"]},
    },
}
_DESTINATION_HEALTH = {
    "type": "object",
    "required": [
        "name",
        "configured",
        "backlog",
        "oldestPendingAt",
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
        "backlog": {**_COUNT_VALUE, "description": "pending deliveries"},
        "oldestPendingAt": {**_NULLABLE_ISO, "description": "the oldest pending one's creation"},
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
                "blocked": _COUNT_VALUE,
                "oldestBlockedMessageId": _NULLABLE_STRING,
                "oldestBlockedSince": {
                    **_NULLABLE_ISO,
                    "description": "the first attempt of the head blocked longest",
                },
            },
        },
        "hooks": {
            "type": "array",
            "items": {
                "type": "object",
                "required": ["url", "circuit", "lastError", "lastErrorAt", "window"],
                "properties": {
                    "url": {"type": "string", "description": "credentials and query values hidden"},
                    "circuit": {"type": "string", "enum": ["closed", "open"]},
                    "lastError": {**_NULLABLE_STRING, "description": "within the last 24 h"},
                    "lastErrorAt": _NULLABLE_ISO,
                    "window": {
                        "type": "object",
                        "required": ["1h", "24h"],
                        "properties": {"1h": _WINDOW, "24h": _WINDOW},
                    },
                },
            },
        },
    },
}

# -- regulations -------------------------------------------------------------------------------

_REGULATION_TYPES = ["DELETE_ONLY", "SUPPRESS_WITH_DELETE", "SUPPRESS_ONLY", "UNSUPPRESS"]
_REGULATION_REQUEST = {
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
            "items": {"type": "string", "minLength": 1, "maxLength": 1000},
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
                "notifications": _COUNT_VALUE,
                "finishedAt": _NULLABLE_ISO,
                "destinations": {
                    "type": "array",
                    "items": {
                        "type": "object",
                        "description": "how many of the notifications are in each status now",
                        "required": ["name", *[s.value for s in DeliveryStatus]],
                        "properties": {
                            "name": {"type": "string"},
                            **{s.value: _COUNT_VALUE for s in DeliveryStatus},
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
_REGULATION = {
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
        "subjectCount": _COUNT_VALUE,
        "source": {**_NULLABLE_STRING, "description": "the one source, or null: every source"},
        "overallStatus": {
            "type": "string",
            "enum": ["INITIALIZED", "RUNNING", "FINISHED", "FAILED"],
        },
        "createdAt": _ISO,
        "startedAt": _NULLABLE_ISO,
        "finishedAt": _NULLABLE_ISO,
        "error": _NULLABLE_STRING,
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
                key: _COUNT_VALUE
                for key in ("messages", "profiles", "identities", "events", "computedValues")
            },
        },
    },
}


def _regulation_routes(paths: dict[str, Any]) -> None:
    created = _json(
        {
            "type": "object",
            "required": ["data"],
            "properties": {
                "data": {
                    "type": "object",
                    "required": ["regulateId"],
                    "properties": {"regulateId": {"type": "string"}},
                }
            },
        },
        "recorded; the runner works through it",
    )
    body = {"required": True, "content": {_JSON: {"schema": _REGULATION_REQUEST}}}
    summary = "A deletion request (Segment's Public API shape)"
    paths["/regulations"] = {
        "post": _admin(
            "createRegulation",
            {
                "summary": summary,
                "requestBody": body,
                "responses": {"200": created, "400": _error("the body breaks a rule")},
            },
            tag="regulations",
        )
    }
    paths["/regulations/sources/{source}"] = {
        "parameters": [_path("source", {"type": "string", "minLength": 1})],
        "post": _admin(
            "createSourceRegulation",
            {
                "summary": f"{summary}, over one source",
                "requestBody": body,
                "responses": {
                    "200": created,
                    "400": _error("the body breaks a rule"),
                    "404": _error("no such source is configured"),
                },
            },
            tag="regulations",
        ),
    }
    paths["/regulations/{id}"] = {
        "parameters": [_path("id", {"type": "string", "minLength": 1})],
        "get": _admin(
            "getRegulation",
            {
                "summary": "A deletion request's status and progress",
                "responses": {
                    "200": _json(
                        {
                            "type": "object",
                            "required": ["data"],
                            "properties": {
                                "data": {
                                    "type": "object",
                                    "required": ["regulation"],
                                    "properties": {"regulation": _ref("Regulation")},
                                }
                            },
                        },
                        "its status and progress",
                    ),
                    "404": _error("no such regulation"),
                },
            },
            tag="regulations",
        ),
    }


def _paths() -> dict[str, Any]:
    paths: dict[str, Any] = {}
    batch = "A batch of messages (all or nothing)"
    paths["/v1/batch"] = _ingest("sendBatch", batch, _ref("Batch"))
    paths["/v1/import"] = _ingest("sendImport", f"{batch}; the same as /v1/batch", _ref("Batch"))
    paths["/v1/b"] = _ingest(
        "sendBrowserBatch", f"{batch}, as analytics.js sends it in batching mode", _ref("Batch")
    )
    for name, short in _SINGLE.items():
        schema = _ref(_schema_name(name))
        paths[f"/v1/{name}"] = _ingest(f"send{name.capitalize()}", f"One {name} message", schema)
        paths[f"/v1/{short}"] = _ingest(
            f"send{name.capitalize()}Beacon", f"One {name} message, as beacons send it", schema
        )
    paths["/v1/m"] = {
        "post": _operation(
            "sendTelemetry",
            "ingestion",
            summary="analytics.js's own telemetry: answered, counted and dropped",
            description="Whatever the body: it is read and dropped. No write key is needed.",
            security=[],
            requestBody={"content": {"text/plain": {"schema": {}}}},
            responses={"200": _json(_ref("Success"), "dropped"), **_INGEST_ERRORS},
        )
    }
    paths["/healthz"] = {
        "get": _operation(
            "getHealth",
            "status",
            summary="Whether the store answers",
            security=[],
            responses={
                "200": _json(
                    {
                        "type": "object",
                        "required": ["status"],
                        "properties": {"status": {"const": "ok"}},
                    },
                    "the store answers",
                ),
                "408": _TIMED_OUT,
                "503": _json(
                    {
                        "anyOf": [
                            {
                                "type": "object",
                                "required": ["status"],
                                "properties": {
                                    "status": {"const": "unavailable"},
                                    "store": {"type": "string", "description": "why"},
                                },
                            },
                            _ref("Error"),
                        ]
                    },
                    "the store does not answer (or too many connections: an Error)",
                ),
            },
        )
    }
    paths["/readyz"] = {
        "get": _operation(
            "getReadiness",
            "status",
            summary="Whether a write to the store succeeds now (readiness)",
            security=[],
            responses={
                "200": _json(
                    {
                        "type": "object",
                        "required": ["status"],
                        "properties": {"status": {"const": "ready"}},
                    },
                    "efd can take messages",
                ),
                "408": _TIMED_OUT,
                "503": _json(
                    {
                        "anyOf": [
                            {
                                "type": "object",
                                "required": ["status", "reason"],
                                "properties": {
                                    "status": {"const": "unavailable"},
                                    "reason": {"type": "string", "description": "why"},
                                },
                            },
                            _ref("Error"),
                        ]
                    },
                    "a write to the store fails or did within the last seconds (or too many "
                    "connections: an Error)",
                ),
            },
        )
    }
    paths["/metrics"] = {
        "get": _operation(
            "getMetrics",
            "status",
            summary="Prometheus metrics (the admin token is needed when one is configured)",
            security=[{"adminToken": []}, {}],
            responses={
                "200": {
                    "description": "Prometheus text format",
                    "content": {"text/plain": {"schema": {"type": "string"}}},
                },
                "401": _error("a token is configured and the request lacks it"),
                "408": _TIMED_OUT,
            },
        )
    }
    paths["/openapi.json"] = {
        "get": _operation(
            "getOpenApi",
            "status",
            summary="This description",
            security=[],
            responses={
                "200": _json({"type": "object"}, "OpenAPI 3.1"),
                "408": _TIMED_OUT,
            },
        )
    }
    _regulation_routes(paths)
    paths["/admin/messages/{source}/{messageId}"] = {
        "parameters": [_path("source", _TEXT), _path("messageId", _TEXT)],
        "get": _admin(
            "getMessage",
            {
                "summary": "What happened to a message: its body, deliveries and every attempt",
                "description": "The newest stored message with this source and messageId.",
                "responses": {
                    "200": _json(_ref("MessageView"), "the message"),
                    "400": _error("a name is invalid; `field` names it"),
                    "404": _error("no such message is stored"),
                },
            },
        ),
    }
    paths["/admin/deliveries"] = {
        "get": _admin(
            "listDeliveries",
            {
                "summary": "Deliveries matching the filters, newest first, a page at a time",
                "description": "Each filter at most once; an unknown one is refused.",
                "parameters": [
                    _query("destination", "a destination's name", _TEXT),
                    _query("status", "a delivery status", _STATUS),
                    _query("since", f"messages received since: {_WHEN}", _TIME_FILTER),
                    _query("until", f"messages received before: {_WHEN}", _TIME_FILTER),
                    _query("user_id", "the message's userId", _TEXT),
                    _query("message_id", "the message's messageId", _TEXT),
                    _query("source", "the message's source", _TEXT),
                    _query(
                        "limit",
                        f"page size (default {selection.DEFAULT_LIMIT})",
                        {"type": "integer", "minimum": 1, "maximum": selection.MAX_LIMIT},
                    ),
                    _query(
                        "cursor",
                        "the previous page's nextCursor",
                        {"type": "integer", "minimum": 1, "maximum": 2**63 - 1},
                    ),
                ],
                "responses": {
                    "200": _json(
                        {
                            "type": "object",
                            "required": ["deliveries", "nextCursor"],
                            "properties": {
                                "deliveries": {"type": "array", "items": _ref("DeliveryRow")},
                                "nextCursor": {
                                    "type": ["string", "null"],
                                    "description": "null on the last page",
                                },
                            },
                        },
                        "a page",
                    ),
                    "400": _error("a filter is invalid; `field` names it"),
                },
            },
        )
    }
    paths["/admin/redrive"] = {
        "post": _admin(
            "redrive",
            {
                "summary": "Send failed or expired deliveries again, with a fresh retry window",
                "description": "Matching deliveries become pending, due now, their window and "
                "backoff counted from now; their attempts stay. Deliveries whose payload a "
                "deletion request purged are left alone. With dry_run, only counts.",
                "requestBody": {"content": {_JSON: {"schema": _REDRIVE}}},
                "responses": {
                    "200": _json(_COUNT, "how many moved (or would move)"),
                    "400": _error("a field is invalid; `field` names it"),
                    "404": _error("the destination is not configured"),
                },
            },
        )
    }
    paths["/admin/replay"] = {
        "post": _admin(
            "replay",
            {
                "summary": "Send a message again, even a delivered one, under its messageId",
                "requestBody": {"required": True, "content": {_JSON: {"schema": _REPLAY}}},
                "responses": {
                    "201": _json(
                        {
                            "type": "object",
                            "required": ["deliveries"],
                            "properties": {
                                "deliveries": {
                                    "type": "array",
                                    "items": {
                                        "type": "object",
                                        "required": ["id", "destination", "outOfOrder"],
                                        "properties": {
                                            "id": {"type": "integer"},
                                            "destination": {"type": "string"},
                                            "outOfOrder": {
                                                "type": "boolean",
                                                "description": "true on an ordered destination: "
                                                "a replay is sent at once, outside its lane, "
                                                "so it may arrive after later messages",
                                            },
                                        },
                                    },
                                }
                            },
                        },
                        "the new deliveries, pending and due now",
                    ),
                    "400": _error("a field is invalid; `field` names it"),
                    "404": _error("no such message is stored, or no such destination configured"),
                    "409": _error(
                        "a deletion request purged the message's payload, or it was not "
                        "routed to the destination"
                    ),
                },
            },
        )
    }
    paths["/admin/discard"] = {
        "post": _admin(
            "discard",
            {
                "summary": "Discard the pending deliveries of a destination no longer configured",
                "description": "They become `discarded`, finished now; their rows and attempts "
                "stay until retention purges them. A configured destination's deliveries are "
                "being sent and cannot be discarded. With dry_run, only counts.",
                "requestBody": {"required": True, "content": {_JSON: {"schema": _DISCARD}}},
                "responses": {
                    "200": _json(_COUNT, "how many were discarded (or would be)"),
                    "400": _error("a field is invalid; `field` names it"),
                    "409": _error("the destination is configured"),
                },
            },
        )
    }
    paths["/admin/destinations"] = {
        "get": _admin(
            "listDestinations",
            {
                "summary": "Endpoint health: backlog per destination; per hook its circuit, "
                "last error, and attempts, success rate and p50/p99 over 1 h and 24 h",
                "responses": {
                    "200": _json(
                        {
                            "type": "object",
                            "required": ["destinations"],
                            "properties": {
                                "destinations": {
                                    "type": "array",
                                    "items": _DESTINATION_HEALTH,
                                }
                            },
                        },
                        "every configured destination, then each one not configured that "
                        "has pending deliveries",
                    )
                },
            },
        )
    }
    paths["/admin/stream"] = {
        "get": _admin(
            "streamEvents",
            {
                "summary": "Server-sent events: messages as they are stored, attempts as "
                "they are recorded",
                "description": "`event: message` data {source, messageId, type, userId, event, "
                "receivedAt}; `event: attempt` data {destination, url, messageId, statusCode, "
                "error, durationMs, delivered}; `event: sampled` data {dropped}: that many "
                "events were left out (over 1,000 a second). A subscriber that does not read "
                "fast enough is disconnected.",
                "responses": {
                    "200": {
                        "description": "the stream, until the client leaves",
                        "content": {"text/event-stream": {"schema": {"type": "string"}}},
                    }
                },
            },
        )
    }
    return paths


def document(version: str) -> dict[str, Any]:
    return {
        "openapi": "3.1.0",
        "info": {
            "title": "efd",
            "version": version,
            "description": "Event-forwarding daemon: Segment's tracking API in, signed webhooks "
            "out; deletion requests; the operator's admin API.",
            "license": {"name": "MIT", "identifier": "MIT"},
        },
        "servers": [{"url": "/", "description": "the daemon that serves this document"}],
        "tags": [
            {"name": "ingestion", "description": "Segment's tracking API"},
            {"name": "regulations", "description": "deletion requests"},
            {"name": "admin", "description": "what happened, what is failing, send it again"},
            {"name": "status", "description": "health, metrics and this description"},
        ],
        "paths": _paths(),
        "components": {
            "securitySchemes": {
                "writeKey": {
                    "type": "http",
                    "scheme": "basic",
                    "description": "the source's write key as the username, no password; or "
                    "writeKey in the body",
                },
                "adminToken": {
                    "type": "http",
                    "scheme": "bearer",
                    "description": "[server] admin_token",
                },
            },
            "schemas": {
                "Error": {
                    "type": "object",
                    "required": ["success", "code", "message"],
                    "properties": {
                        "success": {"const": False},
                        "code": {"type": "string"},
                        "message": {"type": "string"},
                        "field": {"type": ["string", "null"]},
                        "index": {"type": "integer"},
                    },
                },
                "Success": {
                    "type": "object",
                    "required": ["success"],
                    "properties": {"success": {"const": True}},
                },
                **{_schema_name(t): _message(t) for t in _TYPES},
                "Batch": _BATCH,
                "Attempt": _ATTEMPT,
                "Delivery": _DELIVERY,
                "MessageView": _MESSAGE_VIEW,
                "DeliveryRow": _DELIVERY_ROW,
                "Regulation": _REGULATION,
            },
        },
    }
