"""The OpenAPI 3.1 description of efd's HTTP API, served at GET /openapi.json: the ingestion
API (/v1/*), the regulations and admin APIs, /healthz, /readyz and /metrics. Data only:
the schemas in schemas.py, the operations in paths.py, what they share in common.py.

The schemas say what efd accepts, no more and no less, so that a request valid by them is
never refused with a 400 and one invalid by them is. Written by hand, and held to the
handlers: tests/unit/test_openapi.py checks that it describes every route and no other, the
fields and filters the handlers read, filter schemas that accept what their validators
accept and every status a handler refuses with; tests/integration/test_openapi.py runs
schemathesis against a daemon with every check on, and redocly's recommended rules on the
document. What depends on the running state (a configured destination, a stored message)
is answered 404 or 409, never 400. Timestamps are described for the years 1000 to 2999
(efd reads any year, but refuses a time that leaves years 1 to 9999 once moved to UTC or
corrected for clock skew, which no schema can state)."""

from __future__ import annotations

from typing import Any

from efd.http.openapi.paths import every_path
from efd.http.openapi.schemas import (
    ATTEMPT,
    BATCH,
    DELIVERY,
    DELIVERY_ROW,
    MESSAGE_VIEW,
    REGULATION,
    TYPES,
    message_schema,
    schema_name,
)


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
        "paths": every_path(),
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
                **{schema_name(t): message_schema(t) for t in TYPES},
                "Batch": BATCH,
                "Attempt": ATTEMPT,
                "Delivery": DELIVERY,
                "MessageView": MESSAGE_VIEW,
                "DeliveryRow": DELIVERY_ROW,
                "Regulation": REGULATION,
            },
        },
    }
