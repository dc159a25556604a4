"""The OpenAPI description's paths: each route efd serves, its parameters, body and
answers (tests/unit/test_openapi.py holds them to the handlers)."""

from __future__ import annotations

from typing import Any

from efd.http.openapi.common import (
    INGEST_ERRORS,
    JSON,
    TEXT,
    TIME_FILTER,
    TIMED_OUT,
    WHEN,
    admin_operation,
    answer,
    ingest_operation,
    operation,
    path_parameter,
    query_parameter,
    ref,
    refusal,
)
from efd.http.openapi.schemas import (
    COUNT,
    DESTINATION_HEALTH,
    DISCARD,
    PAUSE,
    PAUSE_REQUEST,
    REDRIVE,
    REGULATION_REQUEST,
    REPLAY,
    RESUME_REQUEST,
    RETENTION_LAG,
    STATUS,
    schema_name,
)
from efd.operations import selection

_SINGLE = {
    "identify": "i",
    "track": "t",
    "page": "p",
    "screen": "s",
    "group": "g",
    "alias": "a",
}


def _regulation_routes(paths: dict[str, Any]) -> None:
    created = answer(
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
    body = {"required": True, "content": {JSON: {"schema": REGULATION_REQUEST}}}
    summary = "A deletion request (Segment's Public API shape)"
    paths["/regulations"] = {
        "post": admin_operation(
            "createRegulation",
            {
                "summary": summary,
                "requestBody": body,
                "responses": {"200": created, "400": refusal("the body breaks a rule")},
            },
            tag="regulations",
        )
    }
    paths["/regulations/sources/{source}"] = {
        "parameters": [path_parameter("source", {"type": "string", "minLength": 1})],
        "post": admin_operation(
            "createSourceRegulation",
            {
                "summary": f"{summary}, over one source",
                "requestBody": body,
                "responses": {
                    "200": created,
                    "400": refusal("the body breaks a rule"),
                    "404": refusal("no such source is configured"),
                },
            },
            tag="regulations",
        ),
    }
    paths["/regulations/{id}"] = {
        "parameters": [path_parameter("id", {"type": "string", "minLength": 1})],
        "get": admin_operation(
            "getRegulation",
            {
                "summary": "A deletion request's status and progress",
                "responses": {
                    "200": answer(
                        {
                            "type": "object",
                            "required": ["data"],
                            "properties": {
                                "data": {
                                    "type": "object",
                                    "required": ["regulation"],
                                    "properties": {"regulation": ref("Regulation")},
                                }
                            },
                        },
                        "its status and progress",
                    ),
                    "404": refusal("no such regulation"),
                },
            },
            tag="regulations",
        ),
    }


def every_path() -> dict[str, Any]:
    paths: dict[str, Any] = {}
    batch = "A batch of messages (all or nothing)"
    paths["/v1/batch"] = ingest_operation("sendBatch", batch, ref("Batch"))
    paths["/v1/import"] = ingest_operation(
        "sendImport", f"{batch}; the same as /v1/batch", ref("Batch")
    )
    paths["/v1/b"] = ingest_operation(
        "sendBrowserBatch", f"{batch}, as analytics.js sends it in batching mode", ref("Batch")
    )
    for name, short in _SINGLE.items():
        schema = ref(schema_name(name))
        paths[f"/v1/{name}"] = ingest_operation(
            f"send{name.capitalize()}", f"One {name} message", schema
        )
        paths[f"/v1/{short}"] = ingest_operation(
            f"send{name.capitalize()}Beacon", f"One {name} message, as beacons send it", schema
        )
    paths["/v1/m"] = {
        "post": operation(
            "sendTelemetry",
            "ingestion",
            summary="analytics.js's own telemetry: answered, counted and dropped",
            description="Whatever the body: it is read and dropped. No write key is needed.",
            security=[],
            requestBody={"content": {"text/plain": {"schema": {}}}},
            responses={"200": answer(ref("Success"), "dropped"), **INGEST_ERRORS},
        )
    }
    paths["/healthz"] = {
        "get": operation(
            "getHealth",
            "status",
            summary="Whether the store answers",
            security=[],
            responses={
                "200": answer(
                    {
                        "type": "object",
                        "required": ["status"],
                        "properties": {"status": {"const": "ok"}},
                    },
                    "the store answers",
                ),
                "408": TIMED_OUT,
                "503": answer(
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
                            ref("Error"),
                        ]
                    },
                    "the store does not answer (or too many connections: an Error)",
                ),
            },
        )
    }
    paths["/readyz"] = {
        "get": operation(
            "getReadiness",
            "status",
            summary="Whether a write to the store succeeds now (readiness)",
            security=[],
            responses={
                "200": answer(
                    {
                        "type": "object",
                        "required": ["status"],
                        "properties": {"status": {"const": "ready"}},
                    },
                    "efd can take messages",
                ),
                "408": TIMED_OUT,
                "503": answer(
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
                            ref("Error"),
                        ]
                    },
                    "a write to the store fails or did within the last seconds (or too many "
                    "connections: an Error)",
                ),
            },
        )
    }
    paths["/metrics"] = {
        "get": operation(
            "getMetrics",
            "status",
            summary="Prometheus metrics (the admin token is needed when one is configured)",
            security=[{"adminToken": []}, {}],
            responses={
                "200": {
                    "description": "Prometheus text format",
                    "content": {"text/plain": {"schema": {"type": "string"}}},
                },
                "401": refusal("a token is configured and the request lacks it"),
                "408": TIMED_OUT,
            },
        )
    }
    paths["/openapi.json"] = {
        "get": operation(
            "getOpenApi",
            "status",
            summary="This description",
            security=[],
            responses={
                "200": answer({"type": "object"}, "OpenAPI 3.1"),
                "408": TIMED_OUT,
            },
        )
    }
    _regulation_routes(paths)
    paths["/admin/messages/{source}/{messageId}"] = {
        "parameters": [path_parameter("source", TEXT), path_parameter("messageId", TEXT)],
        "get": admin_operation(
            "getMessage",
            {
                "summary": "What happened to a message: its body, deliveries and every attempt",
                "description": "The newest stored message with this source and messageId.",
                "responses": {
                    "200": answer(ref("MessageView"), "the message"),
                    "400": refusal("a name is invalid; `field` names it"),
                    "404": refusal("no such message is stored"),
                },
            },
        ),
    }
    paths["/admin/deliveries"] = {
        "get": admin_operation(
            "listDeliveries",
            {
                "summary": "Deliveries matching the filters, newest first, a page at a time",
                "description": "Each filter at most once; an unknown one is refused.",
                "parameters": [
                    query_parameter("destination", "a destination's name", TEXT),
                    query_parameter("status", "a delivery status", STATUS),
                    query_parameter("since", f"messages received since: {WHEN}", TIME_FILTER),
                    query_parameter("until", f"messages received before: {WHEN}", TIME_FILTER),
                    query_parameter("user_id", "the message's userId", TEXT),
                    query_parameter("message_id", "the message's messageId", TEXT),
                    query_parameter("source", "the message's source", TEXT),
                    query_parameter(
                        "limit",
                        f"page size (default {selection.DEFAULT_LIMIT})",
                        {"type": "integer", "minimum": 1, "maximum": selection.MAX_LIMIT},
                    ),
                    query_parameter(
                        "cursor",
                        "the previous page's nextCursor",
                        {"type": "integer", "minimum": 1, "maximum": 2**63 - 1},
                    ),
                ],
                "responses": {
                    "200": answer(
                        {
                            "type": "object",
                            "required": ["deliveries", "nextCursor"],
                            "properties": {
                                "deliveries": {"type": "array", "items": ref("DeliveryRow")},
                                "nextCursor": {
                                    "type": ["string", "null"],
                                    "description": "null on the last page",
                                },
                            },
                        },
                        "a page",
                    ),
                    "400": refusal("a filter is invalid; `field` names it"),
                },
            },
        )
    }
    paths["/admin/redrive"] = {
        "post": admin_operation(
            "redrive",
            {
                "summary": "Send failed or expired deliveries again, with a fresh retry window",
                "description": "Matching deliveries become pending, due now, their window and "
                "backoff counted from now; their attempts stay. Deliveries whose payload a "
                "deletion request purged are left alone. With dry_run, only counts.",
                "requestBody": {"content": {JSON: {"schema": REDRIVE}}},
                "responses": {
                    "200": answer(COUNT, "how many moved (or would move)"),
                    "400": refusal("a field is invalid; `field` names it"),
                    "404": refusal("the destination is not configured"),
                },
            },
        )
    }
    paths["/admin/replay"] = {
        "post": admin_operation(
            "replay",
            {
                "summary": "Send a message again, even a delivered one, under its messageId",
                "requestBody": {"required": True, "content": {JSON: {"schema": REPLAY}}},
                "responses": {
                    "201": answer(
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
                    "400": refusal("a field is invalid; `field` names it"),
                    "404": refusal("no such message is stored, or no such destination configured"),
                    "409": refusal(
                        "a deletion request purged the message's payload, or it was not "
                        "routed to the destination"
                    ),
                },
            },
        )
    }
    paths["/admin/discard"] = {
        "post": admin_operation(
            "discard",
            {
                "summary": "Discard the pending deliveries of a destination no longer configured",
                "description": "They become `discarded`, finished now; their rows and attempts "
                "stay until retention purges them. A configured destination's deliveries are "
                "being sent and cannot be discarded. With dry_run, only counts.",
                "requestBody": {"required": True, "content": {JSON: {"schema": DISCARD}}},
                "responses": {
                    "200": answer(COUNT, "how many were discarded (or would be)"),
                    "400": refusal("a field is invalid; `field` names it"),
                    "409": refusal("the destination is configured"),
                },
            },
        )
    }
    paths["/admin/destinations"] = {
        "get": admin_operation(
            "listDestinations",
            {
                "summary": "Endpoint health: backlog per destination; per hook its circuit, "
                "last error, and attempts, success rate and p50/p99 over 1 h and 24 h",
                "responses": {
                    "200": answer(
                        {
                            "type": "object",
                            "required": ["destinations", "retention"],
                            "properties": {
                                "destinations": {
                                    "type": "array",
                                    "items": DESTINATION_HEALTH,
                                },
                                "retention": RETENTION_LAG,
                            },
                        },
                        "every configured destination, then each one not configured that "
                        "has pending deliveries",
                    )
                },
            },
        )
    }
    by_name = path_parameter("name", {"type": "string", "minLength": 1})
    paths["/admin/destinations/{name}/pause"] = {
        "parameters": [by_name],
        "post": admin_operation(
            "pauseDestination",
            {
                "summary": "Send a destination, or one of its hooks, nothing until resumed",
                "description": "Its deliveries wait, pending, and their retry window does not "
                "run out while it is paused. Every daemon on the store applies it within a "
                "second; this one before it answers. Pausing what is paused or disabled "
                "keeps its start and takes the new reason.",
                "requestBody": {"content": {JSON: {"schema": PAUSE_REQUEST}}},
                "responses": {
                    "200": answer(
                        {
                            "type": "object",
                            "required": ["pause"],
                            "properties": {"pause": PAUSE},
                        },
                        "paused",
                    ),
                    "400": refusal("a field is invalid; `field` names it"),
                    "404": refusal(
                        "the destination is not configured (unknown_destination), or has no "
                        "such hook (unknown_hook)"
                    ),
                },
            },
        ),
    }
    paths["/admin/destinations/{name}/resume"] = {
        "parameters": [by_name],
        "post": admin_operation(
            "resumeDestination",
            {
                "summary": "Send to a paused or disabled destination or hook again",
                "description": "Its pending deliveries become due now, their retry windows "
                "moved forward by the time it was paused.",
                "requestBody": {"content": {JSON: {"schema": RESUME_REQUEST}}},
                "responses": {
                    "200": answer(
                        {
                            "type": "object",
                            "required": ["resumed", "due"],
                            "properties": {
                                "resumed": {
                                    "oneOf": [PAUSE, {"type": "null"}],
                                    "description": "the pause lifted; null: it was not paused",
                                },
                                "due": {
                                    "type": "integer",
                                    "minimum": 0,
                                    "description": "its pending deliveries not in flight, "
                                    "all due now",
                                },
                            },
                        },
                        "resumed, or nothing to resume",
                    ),
                    "400": refusal("a field is invalid; `field` names it"),
                    "404": refusal(
                        "the destination is not configured (unknown_destination), or has no "
                        "such hook (unknown_hook)"
                    ),
                },
            },
        ),
    }
    paths["/admin/recent"] = {
        "get": admin_operation(
            "listRecentMessages",
            {
                "summary": "The newest stored messages, newest first, each with its "
                "delivery's status at each destination (the console's feed when it opens)",
                "parameters": [
                    query_parameter(
                        "limit",
                        "how many messages (default 50)",
                        {"type": "integer", "minimum": 1, "maximum": 200},
                    )
                ],
                "responses": {
                    "200": answer(
                        {
                            "type": "object",
                            "required": ["messages"],
                            "properties": {
                                "messages": {
                                    "type": "array",
                                    "items": {
                                        "type": "object",
                                        "required": [
                                            "source",
                                            "messageId",
                                            "type",
                                            "userId",
                                            "event",
                                            "receivedAt",
                                            "destinations",
                                        ],
                                        "properties": {
                                            "source": {"type": "string"},
                                            "messageId": {"type": "string"},
                                            "type": {"type": "string"},
                                            "userId": {"type": ["string", "null"]},
                                            "event": {"type": ["string", "null"]},
                                            "receivedAt": {"type": "string"},
                                            "destinations": {
                                                "type": "object",
                                                "additionalProperties": {"type": "string"},
                                            },
                                        },
                                    },
                                }
                            },
                        },
                        "the newest messages; `destinations` maps each destination to "
                        "its delivery's status",
                    ),
                    "400": refusal("`limit` is invalid, or another parameter is given"),
                },
            },
        )
    }
    paths["/admin/rates"] = {
        "get": admin_operation(
            "listRates",
            {
                "summary": "Per destination: deliveries delivered and failed in each of the "
                "last `minutes` whole minutes, the current one last (the console's chart)",
                "parameters": [
                    query_parameter(
                        "minutes",
                        "how many minutes back (default 60)",
                        {"type": "integer", "minimum": 1, "maximum": 60},
                    )
                ],
                "responses": {
                    "200": answer(
                        {
                            "type": "object",
                            "required": ["minutes", "destinations"],
                            "properties": {
                                "minutes": {"type": "array", "items": {"type": "string"}},
                                "destinations": {
                                    "type": "object",
                                    "additionalProperties": {
                                        "type": "object",
                                        "required": ["delivered", "failed"],
                                        "properties": {
                                            "delivered": {
                                                "type": "array",
                                                "items": {"type": "integer"},
                                            },
                                            "failed": {
                                                "type": "array",
                                                "items": {"type": "integer"},
                                            },
                                        },
                                    },
                                },
                            },
                        },
                        "each minute's start, and per destination one count per minute",
                    ),
                    "400": refusal("`minutes` is invalid, or another parameter is given"),
                },
            },
        )
    }
    paths["/admin/stream"] = {
        "get": admin_operation(
            "streamEvents",
            {
                "summary": "Server-sent events: messages as they are stored, attempts as "
                "they are recorded",
                "description": "`event: message` data {source, messageId, type, userId, event, "
                "receivedAt, destinations}; `event: attempt` data {destination, url, "
                "messageId, statusCode, error, durationMs, delivered}; `event: sampled` data "
                "{dropped}: that many events were left out (over 1,000 a second). A "
                "subscriber that does not read fast enough is disconnected.",
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
