"""The OpenAPI 3.1 description of efd's HTTP API, served at GET /openapi.json: the ingestion
API (/v1/*), the regulations and admin APIs, /healthz and /metrics. Data only; the test
runs schemathesis against a running daemon with it (tests/integration/test_openapi.py)."""

from __future__ import annotations

from typing import Any

from efd import operators
from efd.rows import DeliveryStatus

_JSON = "application/json"
_ISO = {"type": "string", "description": "ISO 8601 UTC"}
_NULLABLE_ISO = {"type": ["string", "null"], "description": "ISO 8601 UTC"}
_NULLABLE_STRING = {"type": ["string", "null"]}
_WHEN = (
    "ISO 8601 (UTC when no offset is given), or relative: `2h`, `30m`, `1d`, `90s` "
    "meaning that long ago"
)


def _ref(name: str) -> dict[str, str]:
    return {"$ref": f"#/components/schemas/{name}"}


def _json(schema: dict[str, Any], description: str) -> dict[str, Any]:
    return {"description": description, "content": {_JSON: {"schema": schema}}}


def _error(description: str) -> dict[str, Any]:
    return _json(_ref("Error"), description)


_INGEST_ERRORS = {
    "400": _error("the body or a message breaks a rule; nothing was stored"),
    "401": _error("no write key, or an unknown one"),
    "403": _error("the request's Origin is not in the source's allowed_origins"),
    "408": _error("the request did not arrive in full within request_timeout_seconds"),
    "503": _error("too many connections, or the store did not take the write; retry"),
}
_ADMIN_ERRORS = {
    "401": _error("no bearer token, or a wrong one"),
    "403": _error("the admin API is off: no [server] admin_token is configured"),
    "408": _error("the request did not arrive in full within request_timeout_seconds"),
    "503": _error("the store is unavailable; retry"),
}


def _ingest(summary: str, body: dict[str, Any]) -> dict[str, Any]:
    return {
        "post": {
            "tags": ["ingestion"],
            "summary": summary,
            "security": [{"writeKey": []}],
            "requestBody": {
                "required": True,
                "content": {_JSON: {"schema": body}, "text/plain": {"schema": {"type": "string"}}},
            },
            "responses": {
                "200": _json(_ref("Success"), "stored (or a duplicate, or suppressed)"),
                **_INGEST_ERRORS,
            },
        }
    }


def _admin(operation: dict[str, Any], *, tag: str = "admin") -> dict[str, Any]:
    responses = {**operation.pop("responses"), **_ADMIN_ERRORS}
    return {"tags": [tag], "security": [{"adminToken": []}], **operation, "responses": responses}


def _query(name: str, description: str, schema: dict[str, Any] | None = None) -> dict[str, Any]:
    return {
        "name": name,
        "in": "query",
        "required": False,
        "description": description,
        "schema": schema or {"type": "string"},
    }


_SINGLE = {
    "identify": "i",
    "track": "t",
    "page": "p",
    "screen": "s",
    "group": "g",
    "alias": "a",
}

# A field only some types use is checked only for them: any other type ignores it, whatever
# its value, so the schema leaves it unconstrained and says which types check it.
_MESSAGE = {
    "type": "object",
    "description": "A Segment message. identify, page, screen, track and group need userId or "
    "anonymousId; track needs event; group needs groupId; alias needs userId and previousId.",
    "properties": {
        "type": {"description": "in a batch: the message's type; a single route sets its own"},
        "messageId": {"type": ["string", "null"], "maxLength": 100},
        "userId": {"type": ["string", "number", "null"]},
        "anonymousId": {"type": ["string", "number", "null"]},
        "event": {"description": "track: a string; ignored by the other types"},
        "name": {"description": "page and screen: a string; ignored by the other types"},
        "groupId": {"description": "group: a string or number; ignored by the other types"},
        "previousId": {"description": "alias: a string or number; ignored by the other types"},
        "timestamp": {"type": ["string", "null"]},
        "sentAt": {"type": ["string", "null"]},
        "properties": {
            "description": "track, page and screen: an object; ignored by the other types"
        },
        "traits": {"description": "identify and group: an object; ignored by the other types"},
        "context": {"type": ["object", "null"]},
        "integrations": {"type": ["object", "null"]},
        "writeKey": {"description": "read only without an Authorization header: a string"},
    },
}

_BATCH = {
    "type": "object",
    "required": ["batch"],
    "properties": {
        "batch": {"type": "array", "items": _ref("Message"), "maxItems": 2500},
        "context": {"type": "object"},
        "integrations": {"type": "object"},
        "sentAt": {"type": "string"},
        "writeKey": {"type": "string"},
    },
}

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
    "properties": {"count": {"type": "integer", "minimum": 0}},
}

_REDRIVE = {
    "type": "object",
    "additionalProperties": False,
    "properties": {
        "destination": {"type": "string", "description": "a configured destination"},
        "status": {"type": "string", "enum": ["failed", "expired"]},
        "since": {"type": "string", "description": f"messages received since: {_WHEN}"},
        "until": {"type": "string", "description": f"messages received before: {_WHEN}"},
        "dry_run": {"type": "boolean", "default": False},
    },
}

_DISCARD = {
    "type": "object",
    "additionalProperties": False,
    "required": ["destination"],
    "properties": {
        "destination": {"type": "string", "description": "a destination that is not configured"},
        "since": {"type": "string", "description": f"messages received since: {_WHEN}"},
        "until": {"type": "string", "description": f"messages received before: {_WHEN}"},
        "dry_run": {"type": "boolean", "default": False},
    },
}

_REPLAY = {
    "type": "object",
    "additionalProperties": False,
    "required": ["source", "messageId"],
    "properties": {
        "source": {"type": "string"},
        "messageId": {"type": "string"},
        "destination": {"type": "string", "description": "default: every one it was routed to"},
    },
}

_REGULATION_REQUEST = {
    "type": "object",
    "additionalProperties": False,
    "required": ["regulationType", "subjectType", "subjectIds"],
    "properties": {
        "regulationType": {
            "type": "string",
            "enum": [
                "SUPPRESS_WITH_DELETE",
                "DELETE_ONLY",
                "SUPPRESS_ONLY",
                "UNSUPPRESS",
            ],
        },
        "subjectType": {"type": "string", "enum": ["USER_ID"]},
        "subjectIds": {
            "type": "array",
            "minItems": 1,
            "maxItems": 5000,
            "items": {"type": "string", "minLength": 1, "maxLength": 1000},
        },
    },
}


_WINDOW = {
    "type": "object",
    "required": ["attempts", "successRate", "p50Ms", "p99Ms"],
    "properties": {
        "attempts": {"type": "integer"},
        "successRate": {"type": ["number", "null"], "description": "null without attempts"},
        "p50Ms": {"type": ["number", "null"]},
        "p99Ms": {"type": ["number", "null"]},
    },
}
_DESTINATION_HEALTH = {
    "type": "object",
    "required": ["name", "configured", "backlog", "oldestPendingAt", "hooks"],
    "properties": {
        "name": {"type": "string"},
        "configured": {
            "type": "boolean",
            "description": "false: removed from the configuration with deliveries still "
            "pending, which are never sent (no hooks then)",
        },
        "backlog": {"type": "integer", "description": "pending deliveries"},
        "oldestPendingAt": {**_NULLABLE_ISO, "description": "the oldest pending one's creation"},
        "hooks": {
            "type": "array",
            "items": {
                "type": "object",
                "required": ["url", "circuit", "lastError", "lastErrorAt", "window"],
                "properties": {
                    "url": {"type": "string", "description": "credentials and query values hidden"},
                    "circuit": {"enum": ["closed", "open"]},
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


def _paths() -> dict[str, Any]:
    paths: dict[str, Any] = {}
    batch = "A batch of messages (all or nothing)"
    paths["/v1/batch"] = _ingest(batch, _ref("Batch"))
    paths["/v1/import"] = _ingest(f"{batch}; the same as /v1/batch", _ref("Batch"))
    paths["/v1/b"] = _ingest(f"{batch}, as analytics.js sends it in batching mode", _ref("Batch"))
    for name, short in _SINGLE.items():
        paths[f"/v1/{name}"] = _ingest(f"One {name} message", _ref("Message"))
        paths[f"/v1/{short}"] = _ingest(f"One {name} message, as beacons send it", _ref("Message"))
    paths["/v1/m"] = {
        "post": {
            "tags": ["ingestion"],
            "summary": "analytics.js's own telemetry: answered, counted and dropped",
            "requestBody": {"content": {_JSON: {"schema": {}}}},
            "responses": {"200": _json(_ref("Success"), "dropped"), **_INGEST_ERRORS},
        }
    }
    paths["/healthz"] = {
        "get": {
            "tags": ["status"],
            "summary": "Whether the store answers",
            "responses": {
                "200": _json({"type": "object"}, "the store answers"),
                "503": _json({"type": "object"}, "the store does not answer"),
            },
        }
    }
    paths["/metrics"] = {
        "get": {
            "tags": ["status"],
            "summary": "Prometheus metrics (the admin token is needed when one is configured)",
            "security": [{"adminToken": []}, {}],
            "responses": {
                "200": {
                    "description": "Prometheus text format",
                    "content": {"text/plain": {"schema": {"type": "string"}}},
                },
                "401": _error("a token is configured and the request lacks it"),
            },
        }
    }
    paths["/openapi.json"] = {
        "get": {
            "tags": ["status"],
            "summary": "This description",
            "responses": {"200": _json({"type": "object"}, "OpenAPI 3.1")},
        }
    }
    regulate = {
        "summary": "A deletion request (Segment's Public API shape)",
        "requestBody": {"required": True, "content": {_JSON: {"schema": _REGULATION_REQUEST}}},
        "responses": {
            "200": _json(
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
            ),
            "400": _error("the body breaks a rule"),
        },
    }
    paths["/regulations"] = {"post": _admin(dict(regulate), tag="regulations")}
    paths["/regulations/sources/{source}"] = {
        "parameters": [
            {"name": "source", "in": "path", "required": True, "schema": {"type": "string"}}
        ],
        "post": _admin(
            {
                **regulate,
                "summary": "A deletion request over one source",
                "responses": {
                    **regulate["responses"],  # type: ignore[dict-item]
                    "404": _error("no such source"),
                },
            },
            tag="regulations",
        ),
    }
    paths["/regulations/{id}"] = {
        "parameters": [
            {"name": "id", "in": "path", "required": True, "schema": {"type": "string"}}
        ],
        "get": _admin(
            {
                "summary": "A deletion request's status",
                "responses": {
                    "200": _json(
                        {"type": "object", "required": ["data"]}, "its status and progress"
                    ),
                    "404": _error("no such regulation"),
                },
            },
            tag="regulations",
        ),
    }
    paths["/admin/messages/{source}/{messageId}"] = {
        "parameters": [
            {"name": "source", "in": "path", "required": True, "schema": {"type": "string"}},
            {"name": "messageId", "in": "path", "required": True, "schema": {"type": "string"}},
        ],
        "get": _admin(
            {
                "summary": "What happened to a message: its body, deliveries and every attempt",
                "description": "The newest stored message with this source and messageId.",
                "responses": {
                    "200": _json(_ref("MessageView"), "the message"),
                    "404": _error("no such message is stored"),
                },
            }
        ),
    }
    paths["/admin/deliveries"] = {
        "get": _admin(
            {
                "summary": "Deliveries matching the filters, newest first, a page at a time",
                "parameters": [
                    _query("destination", "a destination's name"),
                    _query("status", "a delivery status", _STATUS),
                    _query("since", f"messages received since: {_WHEN}"),
                    _query("until", f"messages received before: {_WHEN}"),
                    _query("user_id", "the message's userId"),
                    _query("message_id", "the message's messageId"),
                    _query("source", "the message's source"),
                    _query(
                        "limit",
                        f"page size (default {operators.DEFAULT_LIMIT})",
                        {"type": "integer", "minimum": 1, "maximum": operators.MAX_LIMIT},
                    ),
                    _query("cursor", "the previous page's nextCursor"),
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
            }
        )
    }
    paths["/admin/redrive"] = {
        "post": _admin(
            {
                "summary": "Send failed or expired deliveries again, with a fresh retry window",
                "description": "Matching deliveries become pending, due now, their window and "
                "backoff counted from now; their attempts stay. Deliveries whose payload a "
                "deletion request purged are left alone. With dry_run, only counts.",
                "requestBody": {"content": {_JSON: {"schema": _REDRIVE}}},
                "responses": {
                    "200": _json(_COUNT, "how many moved (or would move)"),
                    "400": _error("a field is invalid; `field` names it"),
                },
            }
        )
    }
    paths["/admin/replay"] = {
        "post": _admin(
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
                                        "required": ["id", "destination"],
                                        "properties": {
                                            "id": {"type": "integer"},
                                            "destination": {"type": "string"},
                                        },
                                    },
                                }
                            },
                        },
                        "the new deliveries, pending and due now",
                    ),
                    "400": _error("a field is invalid, or the message was not routed there"),
                    "404": _error("no such message is stored"),
                    "409": _error("a deletion request purged the message's payload"),
                },
            }
        )
    }
    paths["/admin/discard"] = {
        "post": _admin(
            {
                "summary": "Discard the pending deliveries of a destination no longer configured",
                "description": "They become `discarded`, finished now; their rows and attempts "
                "stay until retention purges them. A configured destination's deliveries are "
                "being sent and cannot be discarded. With dry_run, only counts.",
                "requestBody": {"required": True, "content": {_JSON: {"schema": _DISCARD}}},
                "responses": {
                    "200": _json(_COUNT, "how many were discarded (or would be)"),
                    "400": _error("a field is invalid, or the destination is configured"),
                },
            }
        )
    }
    paths["/admin/destinations"] = {
        "get": _admin(
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
            }
        )
    }
    paths["/admin/stream"] = {
        "get": _admin(
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
            }
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
        },
        "paths": _paths(),
        "components": {
            "securitySchemes": {
                "writeKey": {
                    "type": "http",
                    "scheme": "basic",
                    "description": "the source's write key as the username, no password",
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
                        "field": {"type": "string"},
                        "index": {"type": "integer"},
                    },
                },
                "Success": {
                    "type": "object",
                    "required": ["success"],
                    "properties": {"success": {"const": True}},
                },
                "Message": _MESSAGE,
                "Batch": _BATCH,
                "Attempt": _ATTEMPT,
                "Delivery": _DELIVERY,
                "MessageView": _MESSAGE_VIEW,
                "DeliveryRow": _DELIVERY_ROW,
            },
        },
    }
