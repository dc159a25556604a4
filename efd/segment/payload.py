"""Request parsing: an ingestion request's bytes to the rows to store (pure: no I/O).

The daemon runs it for small bodies and the parser processes (efd/processes/parsers.py) for large
ones; both give the same answer, error for error. A request is all or nothing: the first
invalid message rejects it with a `ClientError` naming the rule, the field and, in a batch,
the message's index.
"""

from __future__ import annotations

import base64
import binascii
import hmac
import re
import zlib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, fields
from datetime import UTC, datetime
from operator import attrgetter
from typing import Any, Generic, Protocol, TypeVar

from efd import jsonjs
from efd.errors import ClientError
from efd.languages.filters import FilterSet
from efd.records import NewMessage
from efd.segment import routing, webhooks
from efd.segment.messages import (
    MAX_MESSAGE_BYTES,
    MAX_REQUEST_BYTES,
    Message,
    normalise_request,
)


def too_large() -> ClientError:
    return ClientError("request_too_large", f"a request may be at most {MAX_REQUEST_BYTES} bytes")


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
        raise ClientError("invalid_body", f"the body is not valid gzip: {error}") from None
    if len(data) > MAX_REQUEST_BYTES or inflater.unconsumed_tail:
        raise too_large()
    if not inflater.eof:
        raise ClientError("invalid_body", "the gzip body is truncated: its trailer is missing")
    if inflater.unused_data:
        raise ClientError(
            "invalid_body", "the gzip body has bytes after its end (one gzip member only)"
        )
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
        raise ClientError("unauthorized", "malformed Basic credentials", status=401)
    try:
        raw = base64.b64decode(value, validate=True)
        if base64.b64encode(raw).decode("ascii") != value:
            raise ValueError("non-canonical base64")
        return raw.decode("utf-8").partition(":")[0]
    except (binascii.Error, ValueError):
        raise ClientError("unauthorized", "malformed Basic credentials", status=401) from None


_row_values = attrgetter(*(field.name for field in fields(NewMessage)))


_NO_FILTERS: Mapping[str, FilterSet] = {}
_NO_ACTIONS: Mapping[str, routing.ActionSet] = {}


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
    filters: Mapping[str, FilterSet] = _NO_FILTERS,
    actions: Mapping[str, routing.ActionSet] = _NO_ACTIONS,
) -> tuple[S, list[NewMessage]]:
    """The body of an ingestion request → the rows to store (pure; raises ClientError).

    `source` is the one named by the Basic auth header, if any; otherwise the body's
    writeKey is looked up in `keys`. `filters`: the destination filters, by destination,
    of those destinations that have some; `actions`: the actions destinations' actions
    (routing.shape).
    """
    try:
        payload, plain = jsonjs.loads_checked(data)
    except jsonjs.TooDeep as error:
        raise ClientError("too_deep", f"the body is nested too deeply: {error}") from None
    except jsonjs.OutOfRange as error:
        raise out_of_range(error, batch=type_ is None) from None
    except (ValueError, UnicodeDecodeError) as error:
        raise ClientError("invalid_json", f"the body is not valid JSON: {error}") from None
    if source is None:
        key = payload.get("writeKey") if isinstance(payload, dict) else None
        if not isinstance(key, str) or not key:
            raise ClientError(
                "unauthorized",
                "no write key: use HTTP Basic auth or writeKey in the body",
                status=401,
            )
        source = keys.find(key)
        if source is None:
            raise ClientError("unauthorized", "unknown write key", status=401)
    messages = normalise_request(
        payload, received_at=received_at, type_=type_, body_bytes=len(data)
    )
    rows = []
    for index, message in enumerate(messages):
        try:
            rows.append(message_row(source, message, received_at, plain, filters, actions))
        except ClientError as rejection:
            if type_ is None:  # a batch: say which message
                rejection.index = index
                rejection.message = f"batch[{index}]: {rejection.message}"
            raise
    return source, rows


def out_of_range(error: jsonjs.OutOfRange, *, batch: bool) -> ClientError:
    """The 400 for a number past a double's range, naming its field as the other checks of
    a message do: in a batch, the field within its message, and the message's index."""
    path, index = error.path, None
    if batch and len(path) > 1 and path[0] == "batch" and isinstance(path[1], int):
        path, index = path[2:], int(path[1])
    field = jsonjs.field_name(path) or None
    what = field or ("the message" if index is not None else "the body")
    message = f"{what} holds the number {error.number}, out of range: {jsonjs.OUT_OF_RANGE}"
    if index is not None:
        message = f"batch[{index}]: {message}"
    return ClientError("invalid_field", message, field=field, index=index)


class ChildParser:
    """parse_request in a parser process (efd/processes/parsers.py), its answers as plain tuples:
    what crosses the pipe is cheap to pickle. `from_child` reads them back. The filters
    arrive pickled as their configuration and are compiled again here (FilterSet), and
    so do the actions' mappings (routing.ActionSet)."""

    def __init__(
        self,
        sources: Sequence[tuple[str, str, tuple[str, ...]]],
        filters: Mapping[str, FilterSet] = _NO_FILTERS,
        actions: Mapping[str, routing.ActionSet] = _NO_ACTIONS,
    ) -> None:
        self._filters = dict(filters)
        self._actions = dict(actions)
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
                filters=self._filters,
                actions=self._actions,
            )
        except ClientError as r:
            return ("rejected", r.code, r.message, r.field, r.index, r.status)
        return ("ok", source.name, [_row_values(row) for row in rows])


def message_row(
    source: Source,
    message: Message,
    received_at: datetime,
    plain: bool,
    filters: Mapping[str, FilterSet] = _NO_FILTERS,
    actions: Mapping[str, routing.ActionSet] = _NO_ACTIONS,
) -> NewMessage:
    body_dict = webhooks.body_for(message)
    data = webhooks.encode(body_dict, plain=plain)
    if len(data) > MAX_MESSAGE_BYTES:
        # Checked as stored and sent: a batch's shared context and integrations are merged
        # into each message, so small messages can grow past the limit here.
        raise ClientError(
            "message_too_large",
            f"a message may be at most {MAX_MESSAGE_BYTES} bytes as delivered; this one is "
            f"{len(data)} bytes with the batch's context and integrations merged in",
        )
    body = data.decode("utf-8")
    destinations = routing.route(source.destinations, message.integrations)
    shaped: tuple[routing.Shaped, ...] = ()
    mapped: tuple[routing.Mapped, ...] = ()
    if filters or actions:
        plain_ones, shaped, mapped = routing.shape(
            body_dict, destinations, filters, plain=plain, actions=actions
        )
        destinations = list(plain_ones)
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
        destinations=tuple(destinations),
        original_timestamp=(
            None if message.original_timestamp is None else message.original_timestamp.timestamp()
        ),
        shaped=shaped,
        mapped=mapped,
    )


def from_child(result: tuple[Any, ...]) -> tuple[str, list[NewMessage]]:
    """A ChildParser answer as parse_request's: (source name, rows), or the ClientError."""
    if result[0] == "rejected":
        _, code, message, field, index, status = result
        raise ClientError(code, message, field=field, index=index, status=status)
    _, name, rows = result
    return name, [NewMessage(*row) for row in rows]
