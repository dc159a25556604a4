"""An ingestion request's body and credentials as efd/segment/payload.py reads them (pure):
gzip read exactly, Basic credentials in their one canonical form, every timestamp and
identifier checked. Each table is sent to a real daemon once, on both backends, by
tests/integration/test_hardening.py; here every case of it."""

from __future__ import annotations

import base64
import gzip
import json
import struct
import zlib
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

import pytest

from efd.errors import ClientError
from efd.segment.payload import ChildParser, WriteKeys, decode_basic, gunzip, parse_request

WRITE_KEY = "wk_test"
TRACK = {"type": "track", "userId": "u-1", "event": "Signed Up"}
RECEIVED = datetime(2026, 11, 24, 12, 0, tzinfo=UTC)


@dataclass(frozen=True)
class Source:
    name: str = "web"
    destinations: tuple[str, ...] = ("hooks",)


KEYS = WriteKeys({WRITE_KEY: Source()})


def _gzip_variants() -> dict[str, bytes]:
    good = gzip.compress(json.dumps(TRACK).encode())
    crc, size = struct.unpack("<II", good[-8:])
    return {
        "trailing bytes": good + b"junk",
        "two members": good + good,
        "no trailer": good[:-8],
        "half a trailer": good[:-3],
        "wrong crc": good[:-8] + struct.pack("<II", crc ^ 1, size),
        "wrong size": good[:-8] + struct.pack("<II", crc, size + 1),
        "not gzip": b"plain text",
        "raw deflate": zlib.compress(json.dumps(TRACK).encode()),
    }


GZIP_VARIANTS = _gzip_variants()

_KEY64 = base64.b64encode(f"{WRITE_KEY}:".encode()).decode()
MALFORMED_BASIC = [
    "Basic \u00e9\u00e9",  # non-ASCII
    "Basic " + _KEY64 + "==",  # extra padding
    "Basic " + _KEY64.rstrip("="),  # missing padding
    "Basic " + base64.urlsafe_b64encode(b"\xfb\xff:").decode(),  # URL-safe alphabet
    "Basic " + base64.b64encode(b"\xff\xfe:").decode(),  # not UTF-8
    "Basic d2tfdGVzdDp=",  # "wk_test:" with padding bits set: not canonical base64
    "Basic ====",
    "Basic",
]

BAD_TIMESTAMPS: list[tuple[dict[str, Any], str]] = [
    ({**TRACK, "sentAt": "yesterday"}, "sentAt"),  # no timestamp beside it
    ({**TRACK, "sentAt": "2026-11-24"}, "sentAt"),  # a date without a time
    ({**TRACK, "timestamp": "2026-W48-2T10:00:00Z"}, "timestamp"),  # a week date
    ({**TRACK, "timestamp": "20261124T100000Z"}, "timestamp"),  # the basic format
    ({**TRACK, "timestamp": "2026-11-24T10:00Z"}, "timestamp"),  # no seconds
    ({**TRACK, "timestamp": "2026-11-24T10:00:00+24:00"}, "timestamp"),
    ({**TRACK, "timestamp": "2026-11-24T10:00:00.Z"}, "timestamp"),
    ({**TRACK, "timestamp": "2026-11-24T10:00:00Z", "sentAt": 5}, "sentAt"),
]

LONE_SURROGATES: list[tuple[dict[str, Any], str]] = [
    ({"type": "track", "userId": "\ud800", "event": "E"}, "userId"),
    ({"type": "track", "anonymousId": "a\udfff", "event": "E"}, "anonymousId"),
    ({"type": "track", "userId": "u", "event": "E\ud83d"}, "event"),
    ({"type": "track", "userId": "u", "event": "E", "messageId": "\udc00m"}, "messageId"),
    ({"type": "group", "userId": "u", "groupId": "\ud800"}, "groupId"),
    ({"type": "alias", "userId": "u", "previousId": "p\ud800"}, "previousId"),
]


def _decoded(value: str) -> tuple[str | None, ClientError | None]:
    try:
        return decode_basic(value), None
    except ClientError as error:
        return None, error


def _refused(data: bytes, type_: str | None) -> ClientError:
    with pytest.raises(ClientError) as caught:
        parse_request(data, source=Source(), keys=KEYS, type_=type_, received_at=RECEIVED)
    return caught.value


@pytest.mark.parametrize("case", list(GZIP_VARIANTS))
def test_gzip_bodies_are_read_exactly(case: str) -> None:
    with pytest.raises(ClientError) as caught:
        gunzip(GZIP_VARIANTS[case])
    assert (caught.value.status, caught.value.code) == (400, "invalid_body")
    assert "gzip" in caught.value.message
    assert json.loads(gunzip(gzip.compress(json.dumps(TRACK).encode()))) == TRACK


@pytest.mark.parametrize("header", MALFORMED_BASIC)
def test_malformed_basic_credentials_never_name_a_source(header: str) -> None:
    assert KEYS.find_header(header) is None
    scheme, _, value = header.partition(" ")
    assert scheme == "Basic"
    key, refusal = _decoded(value)
    if refusal is not None:
        assert (refusal.status, refusal.code) == (401, "unauthorized")
    else:
        assert key is not None
        assert KEYS.find(key) is None  # read, but no source's key: 401 all the same
    assert decode_basic(_KEY64) == WRITE_KEY  # the one canonical form is read


@pytest.mark.parametrize(("message", "field"), BAD_TIMESTAMPS)
def test_every_timestamp_is_validated(message: dict[str, Any], field: str) -> None:
    error = _refused(json.dumps(message).encode(), "track")
    assert (error.status, error.code, error.field) == (400, "invalid_field", field)


@pytest.mark.parametrize(("message", "field"), LONE_SURROGATES)
def test_unpaired_surrogates_in_identifiers_are_refused(
    message: dict[str, Any], field: str
) -> None:
    body = json.dumps({"batch": [message]}).encode()  # ASCII: "\ud800" travels as an escape
    assert b"\\ud" in body
    error = _refused(body, None)
    assert (error.status, error.code, error.field, error.index) == (400, "invalid_field", field, 0)


def test_a_valid_request_is_read() -> None:
    """The tables above fail for their one fault: the same request without it is read."""
    source, rows = parse_request(
        json.dumps({"batch": [TRACK]}).encode(),
        source=Source(),
        keys=KEYS,
        type_=None,
        received_at=RECEIVED,
    )
    assert source == Source()
    assert [(r.type, r.user_id, r.event) for r in rows] == [("track", "u-1", "Signed Up")]


_RANGE = "out of range: numbers are limited to a double's range, about ±1.8e308"
# (body, type_ or None for a batch, the answer: message, field, index). The same request
# goes to a real daemon, small and through a parser process: tests/integration/test_hardening.py.
OUT_OF_RANGE: list[tuple[bytes, str | None, tuple[str, str | None, int | None]]] = [
    (
        b'{"type":"track","userId":"u","event":"E","properties":{"n":1e999}}',
        "track",
        (f"properties.n holds the number 1e999, {_RANGE}", "properties.n", None),
    ),
    (
        b'{"type":"track","userId":"u","event":"E","properties":{"n":' + b"1" * 10_000 + b"}}",
        "track",
        (
            f"properties.n holds the number 111111111111… (10000 digits), {_RANGE}",
            "properties.n",
            None,
        ),
    ),
    (
        b'{"batch":[{"type":"track","userId":"u","event":"E"},'
        b'{"type":"track","userId":"u","event":"E","properties":{"l":[0,-1e400]}}]}',
        None,
        (f"batch[1]: properties.l[1] holds the number -1e400, {_RANGE}", "properties.l[1]", 1),
    ),
    (
        b'{"batch":[{"type":"track","userId":"u","event":"E"}],"context":{"n":'
        + b"9" * 5000
        + b"}}",
        None,
        (f"context.n holds the number 999999999999… (5000 digits), {_RANGE}", "context.n", None),
    ),
    (
        b'{"batch":[1e999]}',
        None,
        (f"batch[0]: the message holds the number 1e999, {_RANGE}", None, 0),
    ),
]


@pytest.mark.parametrize(("body", "type_", "answer"), OUT_OF_RANGE)
def test_numbers_past_a_double_are_refused_naming_the_field(
    body: bytes, type_: str | None, answer: tuple[str, str | None, int | None]
) -> None:
    """JavaScript reads such a number as Infinity and a receiver would get null: the client's
    data would be lost without a word. The parser processes answer the same."""
    error = _refused(body, type_)
    assert (error.status, error.code) == (400, "invalid_field")
    assert (error.message, error.field, error.index) == answer
    child = ChildParser([(WRITE_KEY, "web", ("hooks",))])
    assert child(body, "web", type_, RECEIVED.timestamp()) == (
        "rejected",
        "invalid_field",
        *answer,
        400,
    )
