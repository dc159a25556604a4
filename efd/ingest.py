"""The ingestion API: Segment's HTTP Tracking API, so Segment libraries work unchanged."""

from __future__ import annotations

import base64
import binascii
import json
import logging
import zlib
from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any

from aiohttp import web
from sqlalchemy.exc import SQLAlchemyError

from efd import jsonjs, routing, webhooks
from efd.batching import GroupCommit
from efd.config import Settings, SourceConfig
from efd.messages import MAX_REQUEST_BYTES, Message, Rejection, normalise_request
from efd.metrics import Metrics
from efd.store import NewMessage
from efd.store.sql import DUPLICATE, STORED, SUPPRESSED

log = logging.getLogger(__name__)

# Single-message endpoints, with the one-letter forms browsers' beacons use.
SINGLE_TYPES = {
    "identify": "identify",
    "track": "track",
    "page": "page",
    "screen": "screen",
    "group": "group",
    "alias": "alias",
    "i": "identify",
    "t": "track",
    "p": "page",
    "s": "screen",
    "g": "group",
    "a": "alias",
}

Writer = GroupCommit[NewMessage, str]  # per row: STORED, DUPLICATE or SUPPRESSED


def json_response(body: dict[str, Any], status: int = 200) -> web.Response:
    return web.Response(
        body=json.dumps(body).encode(), status=status, content_type="application/json"
    )


def _reject(rejection: Rejection) -> web.Response:
    return json_response(rejection.as_json(), status=rejection.status)


async def read_body(request: web.Request) -> bytes:
    """The request body, gunzipped if need be, refused past the 500 KiB limit."""
    too_large = Rejection(
        "request_too_large", f"a request may be at most {MAX_REQUEST_BYTES} bytes"
    )
    raw_limit = MAX_REQUEST_BYTES + 65536  # room for gzip's framing on incompressible data
    if request.content_length is not None and request.content_length > raw_limit:
        raise too_large
    chunks: list[bytes] = []
    size = 0
    while chunk := await request.content.read(65536):
        size += len(chunk)
        if size > raw_limit:
            raise too_large
        chunks.append(chunk)
    data = b"".join(chunks)
    encoding = request.headers.get("Content-Encoding", "identity").strip().lower()
    if encoding == "gzip":
        # Bounded decompression: a small gzip bomb never expands past the limit in memory.
        inflater = zlib.decompressobj(wbits=31)
        try:
            data = inflater.decompress(data, MAX_REQUEST_BYTES + 1)
        except zlib.error as error:
            raise Rejection("invalid_body", f"the body is not valid gzip: {error}") from None
        if len(data) > MAX_REQUEST_BYTES or inflater.unconsumed_tail:
            raise too_large
    elif encoding not in ("identity", ""):
        raise Rejection(
            "unsupported_encoding", f"Content-Encoding {encoding!r} is not supported (use gzip)"
        )
    if len(data) > MAX_REQUEST_BYTES:
        raise too_large
    return data


class Ingest:
    def __init__(
        self,
        settings: Settings,
        *,
        writer: Writer,
        metrics: Metrics,
        on_stored: Callable[[], None],
    ) -> None:
        self._sources = {s.write_key.get_secret_value(): s for s in settings.sources}
        self._writer = writer
        self._metrics = metrics
        self._on_stored = on_stored

    def routes(self) -> list[web.RouteDef]:
        routes = [
            web.post("/v1/batch", self._batch),
            web.post("/v1/import", self._batch),
        ]
        routes += [web.post(f"/v1/{path}", self._single) for path in SINGLE_TYPES]
        return routes

    async def _batch(self, request: web.Request) -> web.Response:
        return await self._handle(request, None)

    async def _single(self, request: web.Request) -> web.Response:
        return await self._handle(request, SINGLE_TYPES[request.path.rsplit("/", 1)[1]])

    def _source_from_header(self, request: web.Request) -> SourceConfig | None:
        header = request.headers.get("Authorization")
        if header is None:
            return None
        scheme, _, value = header.partition(" ")
        if scheme.lower() != "basic":
            raise Rejection("unauthorized", "use HTTP Basic auth with the write key", status=401)
        try:
            decoded = base64.b64decode(value.strip(), validate=True).decode("utf-8")
        except (binascii.Error, UnicodeDecodeError):
            raise Rejection("unauthorized", "malformed Basic credentials", status=401) from None
        source = self._sources.get(decoded.partition(":")[0])
        if source is None:
            raise Rejection("unauthorized", "unknown write key", status=401)
        return source

    async def _handle(self, request: web.Request, type_: str | None) -> web.Response:
        received_at = datetime.now(UTC)
        try:
            source = self._source_from_header(request)
            data = await read_body(request)
            try:
                payload, plain = jsonjs.loads_checked(data)
            except (ValueError, UnicodeDecodeError) as error:
                raise Rejection("invalid_json", f"the body is not valid JSON: {error}") from None
            if source is None:
                key = payload.get("writeKey") if isinstance(payload, dict) else None
                if not isinstance(key, str) or not key:
                    raise Rejection(
                        "unauthorized",
                        "no write key: use HTTP Basic auth or writeKey in the body",
                        status=401,
                    )
                source = self._sources.get(key)
                if source is None:
                    raise Rejection("unauthorized", "unknown write key", status=401)
            messages = normalise_request(
                payload, received_at=received_at, type_=type_, body_bytes=len(data)
            )
        except Rejection as rejection:
            self._metrics.rejected[rejection.code] += 1
            log.info("rejected %s from %s: %s", request.path, request.remote, rejection.message)
            return _reject(rejection)

        rows = [self._row(source, message, received_at, plain) for message in messages]
        try:
            status = await self._writer.submit(rows)
        except SQLAlchemyError as error:
            log.error("cannot store %d messages: %s", len(rows), error)
            return json_response(
                {
                    "success": False,
                    "code": "storage_unavailable",
                    "message": "the message store is unavailable; nothing was stored, retry",
                },
                status=503,
            )
        fresh = status.count(STORED)
        self._metrics.received[source.name] += fresh
        if fresh < len(status):
            self._metrics.duplicates[source.name] += status.count(DUPLICATE)
            self._metrics.suppressed[source.name] += status.count(SUPPRESSED)
        if any(r.destinations for r, s in zip(rows, status, strict=True) if s == STORED):
            self._on_stored()
        return json_response({"success": True})

    @staticmethod
    def _row(
        source: SourceConfig, message: Message, received_at: datetime, plain: bool = False
    ) -> NewMessage:
        body = webhooks.encode(webhooks.body_for(message), plain=plain).decode("utf-8")
        return NewMessage(
            source=source.name,
            message_id=message.message_id,
            type=message.type,
            user_id=message.user_id,
            anonymous_id=message.anonymous_id,
            event=message.fields.get("event"),
            timestamp=message.timestamp.timestamp(),
            received_at=received_at.timestamp(),
            body=body,
            destinations=tuple(routing.route(source.destinations, message.integrations)),
        )
