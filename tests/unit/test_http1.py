"""efd.delivery.wire, the request head efd writes, and efd.delivery.reader's reading of an
answer's head and chunk lines (the reader's whole answers: tests/unit/test_reader.py)."""

from __future__ import annotations

import pytest

from efd.delivery.reader import Framing, ProtocolError, chunk_size, parse_head
from efd.delivery.wire import BadHeader, request_head

LENGTH, CHUNKED, CLOSE, NONE = Framing.LENGTH, Framing.CHUNKED, Framing.UNTIL_CLOSE, Framing.NONE


def test_the_request_head_keeps_names_as_given_and_frames_the_body() -> None:
    head = request_head(
        "/hook?a=1", "example.com:8080", {"X-Signature": "ab", "webhook-id": "m"}, 7
    )
    assert head == (
        b"POST /hook?a=1 HTTP/1.1\r\nHost: example.com:8080\r\nX-Signature: ab\r\n"
        b"webhook-id: m\r\nContent-Length: 7\r\n\r\n"
    )


@pytest.mark.parametrize("method", ["PUT", "PATCH"])
def test_an_actions_put_and_patch_are_framed_as_a_post_is(method: str) -> None:
    head = request_head(
        "/users/u%201?ref=o-17",
        "crm.example:8443",
        {"Content-Type": "application/x-www-form-urlencoded", "Authorization": "Bearer t"},
        12,
        method,
    )
    assert head == (
        method.encode() + b" /users/u%201?ref=o-17 HTTP/1.1\r\nHost: crm.example:8443\r\n"
        b"Content-Type: application/x-www-form-urlencoded\r\nAuthorization: Bearer t\r\n"
        b"Content-Length: 12\r\n\r\n"
    )


def test_an_explicit_post_is_the_default_request() -> None:
    assert request_head("/", "h", {}, 0, "POST") == request_head("/", "h", {}, 0)
    assert (
        request_head("/", "h", {}, 0) == b"POST / HTTP/1.1\r\nHost: h\r\nContent-Length: 0\r\n\r\n"
    )


@pytest.mark.parametrize("method", ["GET", "DELETE", "put", "POST /x HTTP/1.1\r\nX: y", ""])
def test_no_other_method_is_written(method: str) -> None:
    with pytest.raises(ValueError, match="efd does not send"):
        request_head("/", "h", {}, 0, method)


def test_latin_1_values_are_encoded_as_latin_1() -> None:
    assert b"X-Name: Zo\xeb\r\n" in request_head("/", "h", {"X-Name": "Zoë"}, 0)


@pytest.mark.parametrize(
    ("headers", "why"),
    [
        ({"X-A": "a\r\nX-B: b"}, "holds CR, LF or NUL"),
        ({"X-A": "a\x00"}, "holds CR, LF or NUL"),
        ({"X-A": "☃"}, "is not Latin-1"),
        ({"X A": "a"}, "is not a token"),
        ({"X-A:": "a"}, "is not a token"),
        ({"": "a"}, "is not a token"),
        ({"Host": "evil"}, "is set by efd"),
        ({"content-LENGTH": "1"}, "is set by efd"),
        ({"Transfer-Encoding": "chunked"}, "is set by efd"),
        ({"Connection": "close"}, "is set by efd"),
    ],
)
def test_headers_that_would_change_the_request_are_refused(
    headers: dict[str, str], why: str
) -> None:
    with pytest.raises(BadHeader, match=why):
        request_head("/", "h", {"User-Agent": "efd", **headers}, 0)


@pytest.mark.parametrize(
    ("head", "parsed"),
    [
        (b"HTTP/1.1 200 OK\r\nContent-Length: 2", (200, None, LENGTH, 2, True)),
        (b"HTTP/1.1 204 No Content", (204, None, NONE, 0, True)),
        (b"HTTP/1.1 200", (200, None, CLOSE, 0, False)),  # no reason phrase, no length
        (b"HTTP/1.1 200 OK\r\ncontent-length:  5 ", (200, None, LENGTH, 5, True)),
        (b"HTTP/1.1 200 OK\r\nContent-Length: 5, 5", (200, None, LENGTH, 5, True)),
        (
            b"HTTP/1.1 503 Busy\r\nRetry-After: 30\r\nContent-Length: 0",
            (503, "30", LENGTH, 0, True),
        ),
        (
            b"HTTP/1.1 200 OK\r\nConnection: Keep-Alive, Close\r\nContent-Length: 0",
            (200, None, LENGTH, 0, False),
        ),
        (b"HTTP/1.0 200 OK\r\nContent-Length: 0", (200, None, LENGTH, 0, False)),
        (
            b"HTTP/1.0 200 OK\r\nConnection: keep-alive\r\nContent-Length: 0",
            (200, None, LENGTH, 0, True),
        ),
        (b"HTTP/1.1 200 OK\r\nTransfer-Encoding: Chunked", (200, None, CHUNKED, 0, True)),
        (
            b"HTTP/1.1 200 OK\r\nTransfer-Encoding: gzip\r\nTransfer-Encoding: chunked",
            (200, None, CHUNKED, 0, True),
        ),
        (b"HTTP/1.1 200 OK\r\nTransfer-Encoding: gzip", (200, None, CLOSE, 0, False)),
        (b"HTTP/1.1 100 Continue", (100, None, NONE, 0, True)),
        (b"HTTP/1.1 304 Not Modified\r\nContent-Length: 99", (304, None, NONE, 0, True)),
        # Outside 100-599: read as sent, and retried as a 5xx (docs/delivery.md).
        (b"HTTP/1.1 999 Odd\r\nContent-Length: 0", (999, None, LENGTH, 0, True)),
    ],
)
def test_what_an_answer_head_says(head: bytes, parsed: tuple[object, ...]) -> None:
    read = parse_head(head)
    assert (read.status, read.retry_after, read.framing, read.length, read.keep_alive) == parsed


def test_a_head_keeps_its_reason_and_headers_in_order() -> None:
    head = parse_head(b"HTTP/1.0 200 Fine by me\r\nX-B: 2\r\ncontent-length: 0\r\nX-A:1 ")
    assert (head.minor, head.reason) == (0, b"Fine by me")
    assert head.headers == ((b"x-b", b"2"), (b"content-length", b"0"), (b"x-a", b"1"))


@pytest.mark.parametrize(
    "head",
    [
        b"HTTP/1.1 20 OK",
        b"HTTP/1.1 099 Low",
        b"HTTP/1.1 2000 OK",
        b"HTTP/2 200 OK",
        b"HTTP/1.1  200 OK",
        b"http/1.1 200 OK",
        b"HTTP/1.1 200 OK\r\nContent-Length: 1\r\nContent-Length: 2",
        b"HTTP/1.1 200 OK\r\nContent-Length: 1, 2",
        b"HTTP/1.1 200 OK\r\nContent-Length: +1",
        b"HTTP/1.1 200 OK\r\nContent-Length: 0x10",
        b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\nTransfer-Encoding: chunked",
        b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked, chunked",
        b"HTTP/1.1 200 OK\r\nNo colon",
        b"HTTP/1.1 200 OK\r\nName : value",
        b"HTTP/1.1 200 OK\r\n continued",
        b"HTTP/1.1 200 OK\r\n: empty name",
    ],
)
def test_malformed_or_ambiguous_heads_are_refused(head: bytes) -> None:
    with pytest.raises(ProtocolError):
        parse_head(head)


@pytest.mark.parametrize(
    ("line", "size"), [(b"0", 0), (b"1a", 26), (b"FF;name=value", 255), (b"10 ", 16)]
)
def test_chunk_sizes(line: bytes, size: int) -> None:
    assert chunk_size(line) == size


@pytest.mark.parametrize("line", [b"", b"-1", b"zz", b"1" * 17, b" 1", b"0x10"])
def test_malformed_chunk_sizes_are_refused(line: bytes) -> None:
    with pytest.raises(ProtocolError):
        chunk_size(line)
