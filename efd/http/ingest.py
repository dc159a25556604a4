"""The ingestion API: Segment's HTTP Tracking API, so Segment libraries work unchanged."""

from __future__ import annotations

import json
import logging
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Protocol

from aiohttp import web

from efd.config import Settings, SourceConfig
from efd.errors import ClientError, StoreDataError, StoreError
from efd.groupcommit import GroupCommit
from efd.http import server
from efd.http.origins import AllowedOrigins
from efd.http.responses import json_response, unstorable
from efd.observe import tracing
from efd.observe.metrics import Metrics
from efd.records import InsertStatus, NewMessage
from efd.segment.messages import MAX_REQUEST_BYTES
from efd.segment.payload import (
    MAX_RAW_REQUEST_BYTES,
    WriteKeys,
    decode_basic,
    gunzip,
    parse_request,
    too_large,
)
from efd.settings import Current

if TYPE_CHECKING:
    from efd.observe.otel import Ingestion

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

Writer = GroupCommit[NewMessage, InsertStatus]


class Parsers(Protocol):
    """Parses large bodies elsewhere (the parser processes, efd/processes/parsers.py)."""

    async def parse(
        self, data: bytes, source: str | None, type_: str | None, received_at: float
    ) -> tuple[str, list[NewMessage]] | None:
        """parse_request's answer for (source name, rows), raising its ClientError; None when
        the work was lost (a process died), and the caller parses it itself."""
        ...


# Bodies larger than this are parsed in a parser process when there are any: for them the
# work outweighs the trip through the pipe.
PARSE_ELSEWHERE_BYTES = 8192


# The answer to every accepted request, serialised once.
_SUCCESS = json.dumps({"success": True}).encode()


async def read_body(request: web.Request) -> bytes:
    """The request body, gunzipped if need be, refused past the 500 KiB limit."""
    if request.content_length is not None and request.content_length > MAX_RAW_REQUEST_BYTES:
        raise too_large()
    data = await server.read_body(request, MAX_RAW_REQUEST_BYTES)
    if len(data) > MAX_RAW_REQUEST_BYTES:
        raise too_large()
    encoding = request.headers.get("Content-Encoding", "identity").strip().lower()
    if encoding == "gzip":
        data = gunzip(data)
    elif encoding not in ("identity", ""):
        raise ClientError(
            "unsupported_encoding", f"Content-Encoding {encoding!r} is not supported (use gzip)"
        )
    if len(data) > MAX_REQUEST_BYTES:
        raise too_large()
    return data


class Ingest:
    """The handlers of /v1/* (Segment's Tracking API): authenticate a write key, parse and
    validate (in a parser process for large bodies), route to destinations, and store each
    message with its pending deliveries through the group-commit writer, answering only
    once it is committed.

    Owns the write-key, source and allowed-origin maps derived from the configuration
    (rebuilt on each reload). May not deliver, read the store, or open a transaction of
    its own: it only submits rows to the writer (whose flush wakes the dispatcher).
    """

    def __init__(
        self,
        settings: Current[Settings],
        *,
        writer: Writer,
        metrics: Metrics,
        parsers: Parsers | None = None,
    ) -> None:
        self._configure(settings.value)
        settings.subscribe(self._configure)
        self._parsers = parsers
        self._writer = writer
        self._metrics = metrics

    def _configure(self, settings: Settings) -> None:
        """Take the configuration's sources (write keys, names, allowed origins): requests
        that arrive after this see them."""
        self._keys: WriteKeys[SourceConfig] = WriteKeys(
            {s.write_key.get_secret_value(): s for s in settings.sources}
        )
        self._by_name = {s.name: s for s in settings.sources}
        self._filters = settings.filter_sets()
        self._actions = settings.action_sets()
        self._origins = {
            s.name: AllowedOrigins(s.allowed_origins)
            for s in settings.sources
            if s.allowed_origins is not None
        }

    def routes(self) -> list[web.RouteDef]:
        routes = [
            web.post("/v1/batch", self._batch),
            web.post("/v1/import", self._batch),
            web.post("/v1/b", self._batch),  # analytics.js in batching mode
            web.post("/v1/m", self._telemetry),
        ]
        routes += [web.post(f"/v1/{path}", self._single) for path in SINGLE_TYPES]
        return routes

    async def _batch(self, request: web.Request) -> web.Response:
        return await self._handle(request, None)

    async def _single(self, request: web.Request) -> web.Response:
        return await self._handle(request, SINGLE_TYPES[request.path.rsplit("/", 1)[1]])

    async def _telemetry(self, request: web.Request) -> web.Response:
        """analytics.js's own telemetry, meant for Segment: read, counted and dropped, so
        that pages that send it see no error."""
        await read_body(request)
        self._metrics.telemetry_discarded += 1
        return web.Response(body=_SUCCESS, content_type="application/json")

    def _check_origin(self, source: SourceConfig, request: web.Request) -> None:
        allowed = self._origins.get(source.name)
        origin = request.headers.get("Origin")
        if allowed is not None and origin is not None and not allowed.allows(origin):
            raise ClientError(
                "origin_not_allowed",
                f"origin {origin[:200]!r} is not in this source's allowed_origins",
                status=403,
            )

    def _source_from_header(self, request: web.Request) -> SourceConfig | None:
        header = request.headers.get("Authorization")
        if header is None:
            return None
        known = self._keys.find_header(header)
        if known is not None:
            return known
        scheme, _, value = header.partition(" ")
        if scheme.lower() != "basic":
            raise ClientError("unauthorized", "use HTTP Basic auth with the write key", status=401)
        source = self._keys.find(decode_basic(value))
        if source is None:
            raise ClientError("unauthorized", "unknown write key", status=401)
        return source

    async def _handle(self, request: web.Request, type_: str | None) -> web.Response:
        tracer = tracing.current()
        if tracer is None:
            return await self._accept(request, type_, None)
        headers = request.headers
        span = tracer.ingestion(
            request.method,
            request.path,
            headers.getall("traceparent", ()),
            headers.getall("tracestate", ()),
        )
        try:
            response = await self._accept(request, type_, span)
        except ClientError as rejection:
            span.answered(rejection.status)
            raise
        except web.HTTPException as answer:
            span.answered(answer.status)
            raise
        else:
            span.answered(response.status)
            return response
        finally:
            span.end()

    async def _accept(
        self, request: web.Request, type_: str | None, trace: Ingestion | None
    ) -> web.Response:
        received_at = datetime.now(UTC)
        try:
            source = self._source_from_header(request)
            data = await read_body(request)
            if trace is None:
                source, rows = await self._parse(data, source, type_, received_at)
            else:
                with trace.routing() as routing:
                    source, rows = await self._parse(data, source, type_, received_at)
                    routing.set_attribute("efd.messages", len(rows))
                trace.span.set_attribute("efd.source", source.name)
                for row in rows:
                    row.trace_context = trace.stored
            if self._origins:
                self._check_origin(source, request)
        except ClientError as rejection:
            self._metrics.rejected[rejection.code] += 1
            log.info("rejected %s from %s: %s", request.path, request.remote, rejection.message)
            raise

        try:
            status = await self._writer.submit(rows)
        except StoreDataError as error:
            # A value validation let through and the database refused: this request's
            # fault, alone (the group commit retried the others without it). The error is
            # the driver's first line, never the values (efd/store/database.py).
            refusal = unstorable()
            self._metrics.rejected[refusal.code] += 1
            log.warning("refused %s from %s: %s", request.path, request.remote, error)
            raise refusal from None
        except StoreError as error:
            log.error("cannot store %d messages: %s", len(rows), error)
            return json_response(
                {
                    "success": False,
                    "code": "storage_unavailable",
                    "message": "the message store is unavailable; nothing was stored, retry",
                },
                status=503,
            )
        fresh = status.count(InsertStatus.STORED)
        self._metrics.received[source.name] += fresh
        if fresh < len(status):
            self._metrics.duplicates[source.name] += status.count(InsertStatus.DUPLICATE)
            self._metrics.suppressed[source.name] += status.count(InsertStatus.SUPPRESSED)
        if self._filters or self._actions:
            for row, row_status in zip(rows, status, strict=True):
                if row_status == InsertStatus.STORED:
                    for destination, _, filtered in row.shaped:
                        if filtered is not None:
                            self._metrics.filtered[destination] += 1
        return web.Response(body=_SUCCESS, content_type="application/json")

    async def _parse(
        self, data: bytes, source: SourceConfig | None, type_: str | None, received_at: datetime
    ) -> tuple[SourceConfig, list[NewMessage]]:
        """parse_request, in a parser process for a large body (if there are any)."""
        if self._parsers is not None and len(data) > PARSE_ELSEWHERE_BYTES:
            parsed = await self._parsers.parse(
                data, source.name if source else None, type_, received_at.timestamp()
            )
            if parsed is not None:
                name, rows = parsed
                return self._by_name[name], rows
        return parse_request(
            data,
            source=source,
            keys=self._keys,
            type_=type_,
            received_at=received_at,
            filters=self._filters,
            actions=self._actions,
        )
