"""The ingestion API: Segment's HTTP Tracking API, so Segment libraries work unchanged."""

from __future__ import annotations

import base64
import binascii
import json
import logging
import zlib
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, fields
from datetime import UTC, datetime
from operator import attrgetter
from typing import Any, Protocol, TypeVar

from aiohttp import web
from sqlalchemy.exc import SQLAlchemyError

from efd import cors, jsonjs, routing, webhooks
from efd.batching import GroupCommit
from efd.config import Settings, SourceConfig
from efd.messages import MAX_REQUEST_BYTES, Message, Rejection, normalise_request
from efd.metrics import Metrics
from efd.store import NewMessage
from efd.store.sql import DUPLICATE, STORED, SUPPRESSED
from efd.workers import LOST, ParserPool

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

# Bodies larger than this are parsed in a parser process when there are any: for them the
# work outweighs the trip through the pipe.
PARSE_ELSEWHERE_BYTES = 8192


def json_response(body: dict[str, Any], status: int = 200) -> web.Response:
    return web.Response(
        body=json.dumps(body).encode(), status=status, content_type="application/json"
    )


# The answer to every accepted request, serialised once.
_SUCCESS = json.dumps({"success": True}).encode()


def _reject(rejection: Rejection) -> web.Response:
    return json_response(rejection.as_json(), status=rejection.status)


def _too_large() -> Rejection:
    return Rejection("request_too_large", f"a request may be at most {MAX_REQUEST_BYTES} bytes")


async def read_body(request: web.Request) -> bytes:
    """The request body, gunzipped if need be, refused past the 500 KiB limit."""
    raw_limit = MAX_REQUEST_BYTES + 65536  # room for gzip's framing on incompressible data
    if request.content_length is not None and request.content_length > raw_limit:
        raise _too_large()
    chunks: list[bytes] = []
    size = 0
    while chunk := await request.content.read(65536):
        size += len(chunk)
        if size > raw_limit:
            raise _too_large()
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
            raise _too_large()
    elif encoding not in ("identity", ""):
        raise Rejection(
            "unsupported_encoding", f"Content-Encoding {encoding!r} is not supported (use gzip)"
        )
    if len(data) > MAX_REQUEST_BYTES:
        raise _too_large()
    return data


class Ingest:
    def __init__(
        self,
        settings: Settings,
        *,
        writer: Writer,
        metrics: Metrics,
        on_stored: Callable[[], None],
        parsers: ParserPool | None = None,
    ) -> None:
        self._sources = {s.write_key.get_secret_value(): s for s in settings.sources}
        # The header Segment's libraries send (the key, a colon, no password), looked up
        # whole before any decoding: the common case costs one dict lookup.
        self._by_header = {
            "Basic " + base64.b64encode(f"{key}:".encode()).decode(): source
            for key, source in self._sources.items()
        }
        self._by_name = {s.name: s for s in settings.sources}
        self._origins = {
            s.name: cors.AllowedOrigins(s.allowed_origins)
            for s in settings.sources
            if s.allowed_origins is not None
        }
        self._parsers = parsers
        self._writer = writer
        self._metrics = metrics
        self._on_stored = on_stored

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
        try:
            await read_body(request)
        except Rejection as rejection:
            return _reject(rejection)
        self._metrics.telemetry_discarded += 1
        return web.Response(body=_SUCCESS, content_type="application/json")

    def _check_origin(self, source: SourceConfig, request: web.Request) -> None:
        allowed = self._origins.get(source.name)
        origin = request.headers.get("Origin")
        if allowed is not None and origin is not None and not allowed.allows(origin):
            raise Rejection(
                "origin_not_allowed",
                f"origin {origin[:200]!r} is not in this source's allowed_origins",
                status=403,
            )

    def _source_from_header(self, request: web.Request) -> SourceConfig | None:
        header = request.headers.get("Authorization")
        if header is None:
            return None
        known = self._by_header.get(header)
        if known is not None:
            return known
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
            source, rows = await self._parse(data, source, type_, received_at)
            self._check_origin(source, request)
        except Rejection as rejection:
            self._metrics.rejected[rejection.code] += 1
            log.info("rejected %s from %s: %s", request.path, request.remote, rejection.message)
            return _reject(rejection)

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
        return web.Response(body=_SUCCESS, content_type="application/json")

    async def _parse(
        self, data: bytes, source: SourceConfig | None, type_: str | None, received_at: datetime
    ) -> tuple[SourceConfig, list[NewMessage]]:
        """parse_request, in a parser process for a large body (if there are any)."""
        if self._parsers is not None and len(data) > PARSE_ELSEWHERE_BYTES:
            result = await self._parsers.parse(
                data, source.name if source else None, type_, received_at.timestamp()
            )
            if result is not LOST:  # else its process died: parse it here instead
                if result[0] == "rejected":
                    _, code, message, field, index, status = result
                    raise Rejection(code, message, field=field, index=index, status=status)
                _, name, rows = result
                return self._by_name[name], [NewMessage(*row) for row in rows]
        return parse_request(
            data, source=source, sources=self._sources, type_=type_, received_at=received_at
        )


class Source(Protocol):
    """What parsing needs of a source: SourceConfig in the daemon, a stand-in in a child."""

    @property
    def name(self) -> str: ...

    @property
    def destinations(self) -> Sequence[str]: ...


S = TypeVar("S", bound=Source)
_row_values = attrgetter(*(field.name for field in fields(NewMessage)))


@dataclass(frozen=True, slots=True)
class _ChildSource:
    name: str
    destinations: tuple[str, ...]


def parse_request(
    data: bytes,
    *,
    source: S | None,
    sources: Mapping[str, S],
    type_: str | None,
    received_at: datetime,
) -> tuple[S, list[NewMessage]]:
    """The body of an ingestion request → the rows to store (pure; raises Rejection).

    `source` is the one named by the Basic auth header, if any; otherwise the body's
    writeKey is looked up in `sources` (write key → source).
    """
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
        source = sources.get(key)
        if source is None:
            raise Rejection("unauthorized", "unknown write key", status=401)
    messages = normalise_request(
        payload, received_at=received_at, type_=type_, body_bytes=len(data)
    )
    return source, [message_row(source, message, received_at, plain) for message in messages]


class ChildParser:
    """parse_request in a parser process (efd.workers), its answers as plain tuples."""

    def __init__(self, sources: Sequence[tuple[str, str, tuple[str, ...]]]) -> None:
        self._by_key = {key: _ChildSource(name, dests) for key, name, dests in sources}
        self._by_name = {source.name: source for source in self._by_key.values()}

    def __call__(
        self, data: bytes, source_name: str | None, type_: str | None, received_at: float
    ) -> tuple[Any, ...]:
        try:
            source, rows = parse_request(
                data,
                source=self._by_name[source_name] if source_name is not None else None,
                sources=self._by_key,
                type_=type_,
                received_at=datetime.fromtimestamp(received_at, UTC),
            )
        except Rejection as r:
            return ("rejected", r.code, r.message, r.field, r.index, r.status)
        return ("ok", source.name, [_row_values(row) for row in rows])


def message_row(source: Source, message: Message, received_at: datetime, plain: bool) -> NewMessage:
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
