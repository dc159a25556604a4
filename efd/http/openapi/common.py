"""The pieces every part of the OpenAPI description is built from: references, answers,
refusals, operations and parameters."""

from __future__ import annotations

from typing import Any

from efd.operations import selection

JSON = "application/json"
ISO = {"type": "string", "format": "date-time", "description": "ISO 8601 UTC"}
NULLABLE_ISO = {"type": ["string", "null"], "format": "date-time", "description": "ISO 8601 UTC"}
NULLABLE_STRING = {"type": ["string", "null"]}
COUNT_VALUE = {"type": "integer", "minimum": 0}
WHEN = (
    "ISO 8601 (UTC when no offset is given), or relative: `2h`, `30m`, `1d`, `90s` "
    "meaning that long ago. An until not later than since matches nothing"
)
# A name, userId or messageId given to the admin API (selection.text): not empty, bounded,
# no NUL (valid Unicode too, which JSON and URLs carry anyway).
TEXT = {
    "type": "string",
    "minLength": 1,
    "maxLength": selection.MAX_TEXT,
    "pattern": "^[^\\u0000]*$",
}
TIME_FILTER = {
    "anyOf": [
        {"type": "string", "format": "date-time"},
        {"type": "string", "format": "date"},
        {"type": "string", "pattern": "^[0-9]{1,9}[smhd]$"},
    ],
    "description": WHEN,
}


def or_null(schema: dict[str, Any]) -> dict[str, Any]:
    """`schema`, or null: a body field efd reads as absent when it is null."""
    if "anyOf" in schema:
        return {**schema, "anyOf": [*schema["anyOf"], {"type": "null"}]}
    nullable = {**schema, "type": [schema["type"], "null"]}
    if "enum" in schema:
        nullable["enum"] = [*schema["enum"], None]
    return nullable


def ref(name: str) -> dict[str, str]:
    return {"$ref": f"#/components/schemas/{name}"}


def answer(schema: dict[str, Any], description: str) -> dict[str, Any]:
    return {"description": description, "content": {JSON: {"schema": schema}}}


def refusal(description: str) -> dict[str, Any]:
    return answer(ref("Error"), description)


TIMED_OUT = refusal("the request did not arrive in full within request_timeout_seconds")
INGEST_ERRORS = {
    "400": refusal("the body or a message breaks a rule; nothing was stored"),
    "401": refusal("no write key, or an unknown one"),
    "403": refusal("the request's Origin is not in the source's allowed_origins"),
    "408": TIMED_OUT,
    "503": refusal("too many connections, or the store did not take the write; retry"),
}
_ADMIN_ERRORS = {
    "401": refusal("no bearer token, or a wrong one"),
    "403": refusal("the admin API is off: no [server] admin_token is configured"),
    "408": TIMED_OUT,
    "503": refusal("too many connections, or the store is unavailable; retry"),
}


def operation(operation_id: str, tag: str, **fields: Any) -> dict[str, Any]:
    return {"operationId": operation_id, "tags": [tag], **fields}


def ingest_operation(operation_id: str, summary: str, body: dict[str, Any]) -> dict[str, Any]:
    return {
        "post": operation(
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
                "content": {JSON: {"schema": body}, "text/plain": {"schema": body}},
            },
            responses={
                "200": answer(ref("Success"), "stored (or a duplicate, or suppressed)"),
                **INGEST_ERRORS,
            },
        )
    }


def admin_operation(
    operation_id: str, fields: dict[str, Any], *, tag: str = "admin"
) -> dict[str, Any]:
    responses = {**fields.pop("responses"), **_ADMIN_ERRORS}
    return {
        **operation(operation_id, tag, security=[{"adminToken": []}], **fields),
        "responses": responses,
    }


def query_parameter(name: str, description: str, schema: dict[str, Any]) -> dict[str, Any]:
    return {
        "name": name,
        "in": "query",
        "required": False,
        "description": description,
        "schema": schema,
    }


def path_parameter(name: str, schema: dict[str, Any]) -> dict[str, Any]:
    return {"name": name, "in": "path", "required": True, "schema": schema}
