"""OTLP's ExportTraceServiceRequest written as protobuf bytes by hand (pure: spans in, bytes
out), for the spans efd makes: the SDK's own encoder builds a protobuf object for every
span, attribute and value, and at one attempt span per delivered event that cost more than
the rest of the delivery (bench/LOG.md). Tests compare what this writes, decoded, with what
the SDK's encoder writes for the same spans (tests/unit/test_otlpwire.py).

The spans are the SDK's finished spans (ReadableSpan), read by their attributes. A span
with events is not written here (`writable` says so): efd's spans have none, and the
caller then uses the SDK's encoder for the batch.
"""

from __future__ import annotations

import struct
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

# Wire types (protobuf encoding).
_VARINT, _I64, _LEN, _I32 = 0, 1, 2, 5
# Span.flags: the context's is-remote bit is known, and whether it is set.
_HAS_IS_REMOTE = 0x100
_IS_REMOTE = 0x200

_fixed64 = struct.Struct("<Q").pack
_fixed32 = struct.Struct("<I").pack
_double = struct.Struct("<d").pack


def _varint(value: int) -> bytes:
    if value < 0:
        value += 1 << 64  # int64: two's complement, ten bytes
    if value < 0x80:
        return bytes((value,))
    out = bytearray()
    while value >= 0x80:
        out.append((value & 0x7F) | 0x80)
        value >>= 7
    out.append(value)
    return bytes(out)


def _key(field: int, wire: int) -> bytes:
    return _TAGS.get((field, wire)) or _varint(field << 3 | wire)


# Every tag efd writes, made once.
_TAGS = {(field, wire): _varint(field << 3 | wire) for field in range(1, 17) for wire in range(6)}
# Lengths below 128 are one byte: most of what a span holds.
_SHORT = [bytes((n,)) for n in range(128)]


def _len(field: int, data: bytes) -> bytes:
    size = len(data)
    return _TAGS[field, _LEN] + (_SHORT[size] if size < 128 else _varint(size)) + data


def _string(field: int, text: str) -> bytes:
    return _len(field, text.encode("utf-8")) if text else b""


def any_value(value: Any) -> bytes:
    """AnyValue: string 1, bool 2, int64 3, double 4, array 5, kvlist 6, bytes 7."""
    if value is None:
        return b""
    if isinstance(value, bool):
        return _key(2, _VARINT) + (b"\x01" if value else b"\x00")
    if isinstance(value, str):
        return _len(1, value.encode("utf-8"))
    if isinstance(value, int):
        return _key(3, _VARINT) + _varint(value)
    if isinstance(value, float):
        return _key(4, _I64) + _double(value)
    if isinstance(value, bytes):
        return _len(7, value)
    if isinstance(value, Mapping):
        return _len(6, b"".join(_len(1, key_value(str(k), v)) for k, v in value.items()))
    if isinstance(value, Sequence):
        return _len(5, b"".join(_len(1, any_value(v)) for v in value))
    raise TypeError(f"an attribute value of type {type(value).__name__}")


# (field, key, string value) -> the encoded field: the strings repeat from span to span.
_KEY_VALUES: dict[tuple[int, str, str], bytes] = {}
# key -> KeyValue's key field, and the tag of its value, for integer values.
_INT_KEYS: dict[str, bytes] = {}
_INT_VALUE = _TAGS[3, _VARINT]


def key_value(key: str, value: Any) -> bytes:
    """KeyValue: key 1, value 2."""
    return _string(1, key) + _len(2, any_value(value))


def _attributes(field: int, attributes: Mapping[str, Any] | None) -> bytes:
    """Each attribute as a repeated KeyValue field; those with a string value written once."""
    if not attributes:
        return b""
    out = []
    cache = _KEY_VALUES
    for key, value in attributes.items():
        kind = type(value)
        if kind is str:
            entry = (field, key, value)
            encoded = cache.get(entry)
            if encoded is None:
                encoded = _len(field, key_value(key, value))
                if len(cache) < 4096:
                    cache[entry] = encoded
        elif kind is int and value >= 0:
            head = _INT_KEYS.get(key)
            if head is None:
                head = _INT_KEYS[key] = _string(1, key) + _TAGS[2, _LEN]
            number = _varint(value)
            encoded = _len(field, head + _SHORT[len(number) + 1] + _INT_VALUE + number)
        else:
            encoded = _len(field, key_value(key, value))
        out.append(encoded)
    return b"".join(out)


def _flags(context: Any) -> int:
    return _HAS_IS_REMOTE | (_IS_REMOTE if context is not None and context.is_remote else 0)


def _trace_state(state: Any) -> str:
    return ",".join(f"{key}={value}" for key, value in state.items()) if state else ""


def writable(spans: Iterable[Any]) -> bool:
    return not any(span.events for span in spans)


class _Sampled:
    sampled = True


class _Context:
    trace_flags = _Sampled()


class Encoded:
    """A span written already (`attempt_span`), as the SDK's batching processor queues it:
    it reads `context.trace_flags.sampled`, and `request` the resource and scope."""

    __slots__ = ("encoded", "instrumentation_scope", "resource")
    context = _Context()
    events = ()

    def __init__(self, encoded: bytes, resource: Any, scope: Any) -> None:
        self.encoded = encoded
        self.resource = resource
        self.instrumentation_scope = scope


def prefix(name: str, kind: int, attributes: Mapping[str, Any]) -> bytes:
    """What every span of one kind of attempt has alike: name 5, kind 6 (the SDK's SpanKind
    value) and its fixed attributes 9, written once for `attempt_span`."""
    return _string(5, name) + _key(6, _VARINT) + _varint(kind + 1) + _attributes(9, attributes)


def link(trace_id: int, span_id: int, remote: bool) -> bytes:
    """A Link field (13) to a span with no attributes of its own."""
    return _len(
        13,
        _len(1, trace_id.to_bytes(16, "big"))
        + _len(2, span_id.to_bytes(8, "big"))
        + _key(6, _I32)
        + _fixed32(_HAS_IS_REMOTE | (_IS_REMOTE if remote else 0)),
    )


def attempt_span(
    fixed: bytes,
    trace_id: int,
    span_id: int,
    parent: tuple[int, bool] | None,
    trace_state: str,
    start: int,
    end: int,
    attributes: Mapping[str, Any],
    links: bytes,
    status_code: int,
    status_message: str,
) -> bytes:
    """A Span from its parts: `fixed` from `prefix`, `parent` (span id, remote) or None,
    `links` from `link`, the attributes that change from span to span after the fixed ones.
    The fields' order differs from `span`'s; a reader takes them in any order."""
    parts = [
        _len(1, trace_id.to_bytes(16, "big")),
        _len(2, span_id.to_bytes(8, "big")),
        _string(3, trace_state),
    ]
    if parent is not None:
        parts.append(_len(4, parent[0].to_bytes(8, "big")))
    parts += [
        fixed,
        _key(7, _I64) + _fixed64(start),
        _key(8, _I64) + _fixed64(end),
        _attributes(9, attributes),
        links,
        _len(
            15,
            _string(2, status_message)
            + (_key(3, _VARINT) + _varint(status_code) if status_code else b""),
        ),
        _key(16, _I32) + _fixed32(_HAS_IS_REMOTE | (_IS_REMOTE if parent and parent[1] else 0)),
    ]
    return b"".join(parts)


def span(sdk_span: Any) -> bytes:
    """Span: trace_id 1, span_id 2, trace_state 3, parent_span_id 4, name 5, kind 6,
    start 7, end 8, attributes 9, dropped attributes 10, dropped events 12, links 13,
    dropped links 14, status 15, flags 16."""
    if type(sdk_span) is Encoded:
        return sdk_span.encoded
    context = sdk_span.context
    parent = sdk_span.parent
    parts = [
        _len(1, context.trace_id.to_bytes(16, "big")),
        _len(2, context.span_id.to_bytes(8, "big")),
        _string(3, _trace_state(context.trace_state)),
    ]
    if parent is not None:
        parts.append(_len(4, parent.span_id.to_bytes(8, "big")))
    parts += [
        _string(5, sdk_span.name),
        _key(6, _VARINT) + _varint(sdk_span.kind.value + 1),  # OTLP counts from UNSPECIFIED
        _key(7, _I64) + _fixed64(sdk_span.start_time or 0),
        _key(8, _I64) + _fixed64(sdk_span.end_time or 0),
        _attributes(9, sdk_span.attributes),
    ]
    if sdk_span.dropped_attributes:
        parts.append(_key(10, _VARINT) + _varint(sdk_span.dropped_attributes))
    if sdk_span.dropped_events:
        parts.append(_key(12, _VARINT) + _varint(sdk_span.dropped_events))
    for link in sdk_span.links:
        linked = link.context
        body = (
            _len(1, linked.trace_id.to_bytes(16, "big"))
            + _len(2, linked.span_id.to_bytes(8, "big"))
            + _attributes(4, link.attributes)
            + (
                _key(5, _VARINT) + _varint(link.dropped_attributes)
                if link.dropped_attributes
                else b""
            )
            + _key(6, _I32)
            + _fixed32(_flags(linked))
        )
        parts.append(_len(13, body))
    if sdk_span.dropped_links:
        parts.append(_key(14, _VARINT) + _varint(sdk_span.dropped_links))
    status = sdk_span.status
    if status is not None:
        code = status.status_code.value
        parts.append(
            _len(
                15,
                _string(2, status.description or "")
                + (_key(3, _VARINT) + _varint(code) if code else b""),
            )
        )
    parts.append(_key(16, _I32) + _fixed32(_flags(parent)))
    return b"".join(parts)


def request(spans: Sequence[Any]) -> bytes:
    """ExportTraceServiceRequest: the spans grouped by resource (ResourceSpans 1: resource 1,
    scope_spans 2, schema_url 3) and by instrumentation scope (ScopeSpans: scope 1, spans 2,
    schema_url 3; scope: name 1, version 2)."""
    # By identity first: a Resource's hash writes it as JSON, at every span.
    resources: dict[int, Any] = {}
    by_identity: dict[int, dict[Any, list[bytes]]] = {}
    for sdk_span in spans:
        resource = sdk_span.resource
        scopes = by_identity.get(id(resource))
        if scopes is None:
            scopes = by_identity[id(resource)] = {}
            resources[id(resource)] = resource
        scopes.setdefault(sdk_span.instrumentation_scope or None, []).append(span(sdk_span))
    grouped: dict[Any, dict[Any, list[bytes]]] = {}
    for identity, scopes in by_identity.items():
        merged = grouped.setdefault(resources[identity], {})  # equal resources: one group
        for scope, encoded in scopes.items():
            merged.setdefault(scope, []).extend(encoded)
    out = []
    for resource, scopes in grouped.items():
        body = [_len(1, _attributes(1, resource.attributes))]
        for scope, encoded in scopes.items():
            scope_body = []
            if scope is not None:
                scope_body.append(
                    _len(
                        1,
                        _string(1, scope.name)
                        + _string(2, scope.version or "")
                        + _attributes(3, scope.attributes),
                    )
                )
            scope_body += [_len(2, one) for one in encoded]
            if scope is not None and scope.schema_url:
                scope_body.append(_string(3, scope.schema_url))
            body.append(_len(2, b"".join(scope_body)))
        if resource.schema_url:
            body.append(_string(3, resource.schema_url))
        out.append(_len(1, b"".join(body)))
    return b"".join(out)
