"""The ingestion API: Segment's HTTP Tracking API, so Segment libraries work unchanged."""

from __future__ import annotations

import base64
import binascii
import hmac
import json
import logging
import re
import zlib
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, fields
from datetime import UTC, datetime
from operator import attrgetter
from typing import Any, Generic, Protocol, TypeVar

from aiohttp import web
from sqlalchemy.exc import SQLAlchemyError

from efd import cors, jsonjs, routing, server, webhooks
from efd.batching import GroupCommit
from efd.config import Settings, SourceConfig
from efd.messages import (
    MAX_MESSAGE_BYTES,
    MAX_REQUEST_BYTES,
    Message,
    Rejection,
    normalise_request,
)
from efd.metrics import Metrics
from efd.server import json_response
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


# The answer to every accepted request, serialised once.
_SUCCESS = json.dumps({"success": True}).encode()


def _reject(rejection: Rejection) -> web.Response:
    return json_response(rejection.as_json(), status=rejection.status)


def _too_large() -> Rejection:
    return Rejection("request_too_large", f"a request may be at most {MAX_REQUEST_BYTES} bytes")


# Bytes as sent, before decompression: the 500 KiB limit plus room for gzip's framing on
# incompressible data.
MAX_RAW_REQUEST_BYTES = MAX_REQUEST_BYTES + 65536


def gunzip(data: bytes) -> bytes:
    """Exactly one complete gzip member, inflated to at most the request limit: a gzip
    bomb never expands past it in memory; a missing or wrong trailer (CRC, size), bytes
    after the member or a second member are refused."""
    inflater = zlib.decompressobj(wbits=31)
    try:
        data = inflater.decompress(data, MAX_REQUEST_BYTES + 1)
    except zlib.error as error:
        raise Rejection("invalid_body", f"the body is not valid gzip: {error}") from None
    if len(data) > MAX_REQUEST_BYTES or inflater.unconsumed_tail:
        raise _too_large()
    if not inflater.eof:
        raise Rejection("invalid_body", "the gzip body is truncated: its trailer is missing")
    if inflater.unused_data:
        raise Rejection(
            "invalid_body", "the gzip body has bytes after its end (one gzip member only)"
        )
    return data


async def read_body(request: web.Request) -> bytes:
    """The request body, gunzipped if need be, refused past the 500 KiB limit."""
    if request.content_length is not None and request.content_length > MAX_RAW_REQUEST_BYTES:
        raise _too_large()
    data = await server.read_body(request, MAX_RAW_REQUEST_BYTES)
    if len(data) > MAX_RAW_REQUEST_BYTES:
        raise _too_large()
    encoding = request.headers.get("Content-Encoding", "identity").strip().lower()
    if encoding == "gzip":
        data = gunzip(data)
    elif encoding not in ("identity", ""):
        raise Rejection(
            "unsupported_encoding", f"Content-Encoding {encoding!r} is not supported (use gzip)"
        )
    if len(data) > MAX_REQUEST_BYTES:
        raise _too_large()
    return data


class Source(Protocol):
    """What parsing needs of a source: SourceConfig in the daemon, a stand-in in a child."""

    @property
    def name(self) -> str: ...

    @property
    def destinations(self) -> Sequence[str]: ...


S = TypeVar("S", bound=Source)
_BASE64 = re.compile(r"[A-Za-z0-9+/]*={0,2}", re.ASCII)


class WriteKeys(Generic[S]):
    """Finds a source by its write key without comparing secrets byte by byte: a dict
    lookup compares the keyed, per-process random hash of the string (Python's SipHash)
    before any bytes, so its time says nothing about how much of a guess was right; a
    found key is then confirmed with a constant-time comparison."""

    def __init__(self, sources: Mapping[str, S]) -> None:
        self._by_key = {key: (key.encode(), source) for key, source in sources.items()}
        # The header Segment's libraries send (the key, a colon, no password), looked up
        # whole before any decoding: the common case costs one lookup.
        self._by_header = {
            _basic_header(key): (_basic_header(key).encode(), source)
            for key, source in sources.items()
        }

    def find(self, key: str) -> S | None:
        """The source whose write key is `key`, or None."""
        return _confirmed(self._by_key.get(key), key)

    def find_header(self, header: str) -> S | None:
        """The source of an exact `Basic base64(key:)` header, or None (not that form)."""
        return _confirmed(self._by_header.get(header), header)


def _confirmed(found: tuple[bytes, S] | None, given: str) -> S | None:
    if found is None:
        return None
    expected, source = found
    return (
        source if hmac.compare_digest(expected, given.encode("utf-8", "surrogateescape")) else None
    )


def _basic_header(key: str) -> str:
    return "Basic " + base64.b64encode(f"{key}:".encode()).decode()


def decode_basic(value: str) -> str:
    """The user name (the write key) of Basic credentials: standard base64 of UTF-8 text,
    nothing else (no URL-safe alphabet, no missing or extra padding)."""
    value = value.strip()
    if not value.isascii() or len(value) % 4 or not _BASE64.fullmatch(value):
        raise Rejection("unauthorized", "malformed Basic credentials", status=401)
    try:
        raw = base64.b64decode(value, validate=True)
        if base64.b64encode(raw).decode("ascii") != value:
            raise ValueError("non-canonical base64")
        return raw.decode("utf-8").partition(":")[0]
    except (binascii.Error, ValueError):
        raise Rejection("unauthorized", "malformed Basic credentials", status=401) from None


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
        self._keys: WriteKeys[SourceConfig] = WriteKeys(
            {s.write_key.get_secret_value(): s for s in settings.sources}
        )
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
        known = self._keys.find_header(header)
        if known is not None:
            return known
        scheme, _, value = header.partition(" ")
        if scheme.lower() != "basic":
            raise Rejection("unauthorized", "use HTTP Basic auth with the write key", status=401)
        source = self._keys.find(decode_basic(value))
        if source is None:
            raise Rejection("unauthorized", "unknown write key", status=401)
        return source

    async def _handle(self, request: web.Request, type_: str | None) -> web.Response:
        received_at = datetime.now(UTC)
        try:
            source = self._source_from_header(request)
            data = await read_body(request)
            source, rows = await self._parse(data, source, type_, received_at)
            if self._origins:
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
            data, source=source, keys=self._keys, type_=type_, received_at=received_at
        )


_row_values = attrgetter(*(field.name for field in fields(NewMessage)))


@dataclass(frozen=True, slots=True)
class _ChildSource:
    name: str
    destinations: tuple[str, ...]


def parse_request(
    data: bytes,
    *,
    source: S | None,
    keys: WriteKeys[S],
    type_: str | None,
    received_at: datetime,
) -> tuple[S, list[NewMessage]]:
    """The body of an ingestion request → the rows to store (pure; raises Rejection).

    `source` is the one named by the Basic auth header, if any; otherwise the body's
    writeKey is looked up in `keys`.
    """
    try:
        payload, plain = jsonjs.loads_checked(data)
    except jsonjs.TooDeep as error:
        raise Rejection("too_deep", f"the body is nested too deeply: {error}") from None
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
        source = keys.find(key)
        if source is None:
            raise Rejection("unauthorized", "unknown write key", status=401)
    messages = normalise_request(
        payload, received_at=received_at, type_=type_, body_bytes=len(data)
    )
    rows = []
    for index, message in enumerate(messages):
        try:
            rows.append(message_row(source, message, received_at, plain))
        except Rejection as rejection:
            if type_ is None:  # a batch: say which message
                rejection.index = index
                rejection.message = f"batch[{index}]: {rejection.message}"
            raise
    return source, rows


class ChildParser:
    """parse_request in a parser process (efd.workers), its answers as plain tuples."""

    def __init__(self, sources: Sequence[tuple[str, str, tuple[str, ...]]]) -> None:
        by_key = {key: _ChildSource(name, dests) for key, name, dests in sources}
        self._keys = WriteKeys(by_key)
        self._by_name = {source.name: source for source in by_key.values()}

    def __call__(
        self, data: bytes, source_name: str | None, type_: str | None, received_at: float
    ) -> tuple[Any, ...]:
        try:
            source, rows = parse_request(
                data,
                source=self._by_name[source_name] if source_name is not None else None,
                keys=self._keys,
                type_=type_,
                received_at=datetime.fromtimestamp(received_at, UTC),
            )
        except Rejection as r:
            return ("rejected", r.code, r.message, r.field, r.index, r.status)
        return ("ok", source.name, [_row_values(row) for row in rows])


def message_row(source: Source, message: Message, received_at: datetime, plain: bool) -> NewMessage:
    data = webhooks.encode(webhooks.body_for(message), plain=plain)
    if len(data) > MAX_MESSAGE_BYTES:
        # Checked as stored and sent: a batch's shared context and integrations are merged
        # into each message, so small messages can grow past the limit here.
        raise Rejection(
            "message_too_large",
            f"a message may be at most {MAX_MESSAGE_BYTES} bytes as delivered; this one is "
            f"{len(data)} bytes with the batch's context and integrations merged in",
        )
    body = data.decode("utf-8")
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
