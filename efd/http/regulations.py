"""The deletion-request API ("regulations") in the shape of Segment's Public API.

    POST /regulations                     every source
    POST /regulations/sources/{source}    one source
    GET  /regulations/{id}                status, with counts per source

The request is recorded (and SUPPRESS_* / UNSUPPRESS take effect) before the answer;
efd/services/regulations.py's runner then carries it out.
"""

from __future__ import annotations

import logging
import time
import uuid
from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any

from aiohttp import web

from efd import jsonjs
from efd.config import Settings
from efd.errors import ClientError, StoreDataError, StoreError
from efd.http import server
from efd.http.responses import error_response, json_response, unstorable
from efd.records import RegulationStatus
from efd.segment.messages import format_timestamp
from efd.services.regulations import sources_in_scope
from efd.settings import Current
from efd.store.regulations import (
    DELETE_TYPES,
    REGULATION_TYPES,
    Regulations,
)
from efd.store.runner import AsyncStore

log = logging.getLogger(__name__)

MAX_SUBJECTS = 5000
MAX_SUBJECT_CHARS = 1000
SUBJECT_TYPE = "USER_ID"
REQUEST_FIELDS = ("regulationType", "subjectType", "subjectIds")
MAX_BODY_BYTES = 1024**2


def parse_request(payload: Any) -> tuple[str, list[str]]:
    """(regulationType, subject ids without repeats) from a request body, or a ClientError
    naming the field."""
    if not isinstance(payload, dict):
        raise ClientError("invalid_body", "the request body must be a JSON object")
    for key in payload:
        if key not in REQUEST_FIELDS:
            raise ClientError("invalid_field", f"unknown field {key!r}", field=str(key))
    for key in REQUEST_FIELDS:
        if key not in payload:
            raise ClientError("missing_field", f"{key} is required", field=key)
    type_ = payload["regulationType"]
    if type_ not in REGULATION_TYPES:
        raise ClientError(
            "invalid_field",
            f"regulationType must be one of {', '.join(REGULATION_TYPES)}",
            field="regulationType",
        )
    if payload["subjectType"] != SUBJECT_TYPE:
        raise ClientError(
            "invalid_field", f"subjectType must be {SUBJECT_TYPE}", field="subjectType"
        )
    ids = payload["subjectIds"]
    if not isinstance(ids, list) or not ids:
        raise ClientError(
            "invalid_field", "subjectIds must be a non-empty array of userIds", field="subjectIds"
        )
    if len(ids) > MAX_SUBJECTS:
        raise ClientError(
            "invalid_field",
            f"at most {MAX_SUBJECTS} subjectIds per request, got {len(ids)}",
            field="subjectIds",
        )
    for index, value in enumerate(ids):
        if (
            not isinstance(value, str)
            or not value
            or len(value) > MAX_SUBJECT_CHARS
            or jsonjs.has_lone_surrogate(value)
            # Subjects become columns, and PostgreSQL's text cannot hold U+0000; nor can a
            # userId that ingestion accepts (efd/segment/messages.py).
            or "\x00" in value
        ):
            raise ClientError(
                "invalid_field",
                f"subjectIds[{index}] must be a userId: a non-empty string of at most "
                f"{MAX_SUBJECT_CHARS} characters of valid Unicode, without U+0000",
                field=f"subjectIds[{index}]",
            )
    return type_, list(dict.fromkeys(ids))


def _iso(value: float | None) -> str | None:
    return None if value is None else format_timestamp(datetime.fromtimestamp(value, UTC))


class RegulationsApi:
    """POST /regulations and GET /regulations/{id}: records deletion and suppression
    requests, and reports their progress.

    Owns the set of source names it validates scopes against (rebuilt on each reload). May
    not carry a regulation out: it records it and wakes the runner
    (efd/services/regulations.py), which does.
    """

    def __init__(
        self,
        settings: Current[Settings],
        *,
        db: AsyncStore,
        regulations: Regulations,
        on_created: Callable[[], None],
    ) -> None:
        self._current = settings
        self._db = db
        self._regulations = regulations
        self._on_created = on_created
        self._configure(settings.value)
        settings.subscribe(self._configure)

    @property
    def _settings(self) -> Settings:
        return self._current.value

    def _configure(self, settings: Settings) -> None:
        self._sources = {s.name for s in settings.sources}

    def routes(self) -> list[web.RouteDef]:
        return [
            web.post("/regulations", self._create_all),
            web.post("/regulations/sources/{source}", self._create_for_source),
            web.get("/regulations/{id}", self._get),
        ]

    async def _create_all(self, request: web.Request) -> web.Response:
        return await self._create(request, None)

    async def _create_for_source(self, request: web.Request) -> web.Response:
        return await self._create(request, request.match_info["source"])

    async def _create(self, request: web.Request, scope: str | None) -> web.Response:
        server.require_admin(self._settings, request)
        if scope is not None and scope not in self._sources:
            raise ClientError(
                "unknown_source", f"no source named {scope!r}", field="source", status=404
            )
        try:
            payload = jsonjs.loads(await server.read_body(request, MAX_BODY_BYTES))
        except jsonjs.TooDeep as error:
            raise ClientError("too_deep", f"the body is nested too deeply: {error}") from None
        except jsonjs.OutOfRange as error:
            field = jsonjs.field_name(error.path) or None
            raise ClientError("invalid_field", str(error), field=field) from None
        except (ValueError, UnicodeDecodeError) as error:
            raise ClientError("invalid_json", f"the body is not valid JSON: {error}") from None
        type_, ids = parse_request(payload)
        reg_id = uuid.uuid4().hex
        try:
            await self._db.write(
                self._regulations.create_regulation, reg_id, type_, scope, ids, time.time()
            )
        except StoreDataError as error:
            log.warning("cannot record a regulation: %s", error)
            raise unstorable() from None
        except StoreError as error:
            log.error("cannot record a regulation: %s", error)
            return error_response(
                "storage_unavailable", "the store is unavailable; nothing was recorded, retry", 503
            )
        log.info(
            "regulation %s: %s of %d users (%s)",
            reg_id,
            type_,
            len(ids),
            f"source {scope}" if scope else "every source",
        )
        self._on_created()
        return json_response({"data": {"regulateId": reg_id}})

    async def _get(self, request: web.Request) -> web.Response:
        server.require_admin(self._settings, request)
        reg_id = request.match_info["id"]
        if "\x00" in reg_id:  # no id holds one; PostgreSQL's text could not even compare it
            raise ClientError("not_found", f"no regulation {reg_id!r}", field="id", status=404)
        try:
            row = await self._db.read(self._regulations.regulation, reg_id)
        except StoreError as error:
            return error_response("storage_unavailable", str(error)[:200], 503)
        if row is None:
            raise ClientError("not_found", f"no regulation {reg_id!r}", field="id", status=404)
        return json_response({"data": {"regulation": self.describe(row)}})

    def describe(self, row: dict[str, Any]) -> dict[str, Any]:
        progress = row["progress"]
        done: dict[str, dict[str, Any]] = progress.get("sources", {})
        streams = []
        if row["type"] in DELETE_TYPES:
            names = [s.name for s in sources_in_scope(self._settings, row["scope"])]
            names += [name for name in done if name not in names]
            configured = {s.name: s for s in self._settings.sources}
            for name in names:
                entry = done.get(name)
                if entry is not None:
                    streams.append(
                        {
                            "source": name,
                            "status": RegulationStatus.FINISHED,
                            "notifications": entry["notifications"],
                            "finishedAt": _iso(entry.get("finished_at")),
                            "destinations": [
                                {
                                    "name": destination,
                                    **{
                                        status: entry["deliveries"]
                                        .get(destination, {})
                                        .get(status, 0)
                                        for status in (
                                            "delivered",
                                            "pending",
                                            "queued",
                                            "failed",
                                            "expired",
                                            "discarded",
                                            "filtered",
                                        )
                                    },
                                }
                                for destination in entry["destinations"]
                            ],
                        }
                    )
                    continue
                source = configured.get(name)
                if source is None or not source.destinations:
                    reason = "not configured" if source is None else "no webhook destination"
                    streams.append({"source": name, "status": "SKIPPED", "reason": reason})
                elif row["status"] == RegulationStatus.FAILED:
                    streams.append({"source": name, "status": RegulationStatus.FAILED})
                else:
                    streams.append({"source": name, "status": "PENDING"})
        purge = progress.get("purge", {})
        return {
            "id": row["id"],
            "regulationType": row["type"],
            "subjectType": SUBJECT_TYPE,
            "subjectCount": row["subject_count"],
            "source": row["scope"],
            "overallStatus": row["status"],
            "createdAt": _iso(row["created_at"]),
            "startedAt": _iso(row["started_at"]),
            "finishedAt": _iso(row["finished_at"]),
            "error": row["error"],
            "streamStatus": streams,
            "purged": {
                "messages": purge.get("messages", 0),
                "profiles": purge.get("profiles", 0),
                "identities": purge.get("identities", 0),
                "events": purge.get("events", 0),
                "computedValues": purge.get("computed_values", 0),
            },
        }
