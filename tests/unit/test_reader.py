"""efd.delivery.reader: a whole answer read from bytes, for every framing and every refusal.

Each case is read twice, fed all at once and fed one byte at a time, and both readings must
give the same events: where a read ends must not decide what the answer says."""

from __future__ import annotations

import pytest

from efd.delivery.reader import (
    MAX_HEAD,
    Data,
    End,
    Event,
    Framing,
    Head,
    Refused,
    ResponseReader,
)
from efd.delivery.wire import request_head

LIMIT = 1 << 20


def _feed(reader: ResponseReader, pieces: list[bytes], eof: bool) -> list[Event]:
    """As the client reads: up to a refusal, or an answer that ends the connection."""
    events: list[Event] = []
    for piece in pieces:
        events += reader.feed(piece)
        last = events[-1] if events else None
        if isinstance(last, Refused) or (isinstance(last, End) and not last.reusable):
            return events
    if eof:
        events += reader.feed_eof()
    return events


def _merged(events: list[Event]) -> list[Event]:
    """Adjacent pieces of the body as one: how the body was cut is the reads', not the
    answer's."""
    merged: list[Event] = []
    for event in events:
        if isinstance(event, Data):
            assert event.data, "an empty piece of body"
            last = merged[-1] if merged else None
            if isinstance(last, Data):
                merged[-1] = Data(last.data + event.data)
                continue
        merged.append(event)
    return merged


def read(
    wire: bytes, *, eof: bool = False, limit: int = LIMIT, max_head: int = MAX_HEAD
) -> list[Event]:
    """The events of `wire` fed whole and fed byte by byte (then the close, if `eof`),
    which must agree; adjacent body pieces merged."""
    whole = _feed(ResponseReader(limit, max_head=max_head), [wire], eof)
    one_by_one = [wire[i : i + 1] for i in range(len(wire))]
    bytewise = _feed(ResponseReader(limit, max_head=max_head), one_by_one, eof)
    assert _merged(whole) == _merged(bytewise)
    return _merged(whole)


def kinds(events: list[Event]) -> list[str]:
    return [type(event).__name__ for event in events]


def body(events: list[Event]) -> bytes:
    return b"".join(event.data for event in events if isinstance(event, Data))


def heads(events: list[Event]) -> list[Head]:
    return [event for event in events if isinstance(event, Head)]


def the_end(events: list[Event]) -> End:
    last = events[-1]
    assert isinstance(last, End), events
    return last


def refusal(events: list[Event]) -> str:
    last = events[-1]
    assert isinstance(last, Refused), events
    return last.reason


WEBHOOK_200 = (
    b"HTTP/1.1 200 OK\r\nDate: Wed, 02 Dec 2026 20:00:00 GMT\r\n"
    b"Content-Type: application/json\r\nContent-Length: 15\r\n\r\n"
    b'{"ok":\r\n"true"}'
)


# -- framings ------------------------------------------------------------------------------


def test_a_content_length_body_is_read_to_its_last_byte() -> None:
    events = read(WEBHOOK_200)
    assert kinds(events) == ["Head", "Data", "End"]
    [head] = heads(events)
    assert (head.status, head.reason, head.framing, head.length) == (
        200,
        b"OK",
        Framing.LENGTH,
        15,
    )
    assert head.keep_alive
    assert (b"content-type", b"application/json") in head.headers
    assert body(events) == b'{"ok":\r\n"true"}'  # a CRLF inside a body is body
    assert the_end(events) == End(reusable=True)


def test_a_zero_length_body_ends_with_its_head() -> None:
    events = read(b"HTTP/1.1 202 Accepted\r\nContent-Length: 0\r\n\r\n")
    assert kinds(events) == ["Head", "End"]
    assert the_end(events).reusable


def test_one_reader_reads_the_answers_of_a_kept_alive_connection_in_turn() -> None:
    reader = ResponseReader(LIMIT)
    first = reader.feed(WEBHOOK_200[:30])
    assert first == []
    first += reader.feed(WEBHOOK_200[30:])
    assert kinds(first) == ["Head", "Data", "End"]
    assert reader.idle
    second = reader.feed(b"HTTP/1.1 503 Busy\r\nRetry-After: 7\r\nContent-Length: 2\r\n\r\nno")
    assert kinds(second) == ["Head", "Data", "End"]
    assert heads(second)[0].retry_after == "7"
    assert body(second) == b"no"


def test_the_answer_to_a_post_has_the_body_its_length_announces() -> None:
    # A POST, unlike a HEAD, gets the body its answer's Content-Length announces.
    request = request_head("/hook", "example.com", {"Content-Type": "application/json"}, 2)
    assert request.startswith(b"POST /hook HTTP/1.1\r\n")
    events = read(b"HTTP/1.1 201 Created\r\nLocation: /hook/1\r\nContent-Length: 7\r\n\r\ncreated")
    assert kinds(events) == ["Head", "Data", "End"]
    assert heads(events)[0].status == 201
    assert body(events) == b"created"


def test_a_chunked_body_with_extensions_and_trailers() -> None:
    events = read(
        b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n"
        b"5;name=value\r\nhello\r\n"
        b'7 ; quoted="a;b"\r\n wo\r\nld\r\n'
        b"A\r\n0123456789\r\n"
        b"0;last\r\nX-Checksum: abc\r\nX-Other:  d \r\n\r\n"
    )
    assert kinds(events) == ["Head", "Data", "End"]
    assert heads(events)[0].framing is Framing.CHUNKED
    assert body(events) == b"hello wo\r\nld0123456789"
    assert the_end(events) == End(reusable=True, trailers=(b"X-Checksum: abc", b"X-Other:  d "))


def test_a_chunked_body_without_trailers() -> None:
    events = read(
        b"HTTP/1.1 200 OK\r\nTransfer-Encoding: gzip, chunked\r\n\r\n2\r\nok\r\n0\r\n\r\n"
    )
    assert body(events) == b"ok"
    assert the_end(events) == End(reusable=True)


@pytest.mark.parametrize(
    "head",
    [
        b"HTTP/1.1 200 OK\r\nServer: old",
        b"HTTP/1.1 200 OK\r\nTransfer-Encoding: gzip",
        b"HTTP/1.0 200 OK\r\nConnection: keep-alive",
    ],
)
def test_a_body_without_a_length_ends_when_the_server_closes(head: bytes) -> None:
    wire = head + b"\r\n\r\nall of it\r\n\r\nand more"
    events = read(wire, eof=True)
    assert kinds(events) == ["Head", "Data", "End"]
    assert heads(events)[0].framing is Framing.UNTIL_CLOSE
    assert not heads(events)[0].keep_alive
    assert body(events) == b"all of it\r\n\r\nand more"
    assert the_end(events) == End(reusable=False)
    # Until the close, the answer is not over.
    assert kinds(read(wire)) == ["Head", "Data"]


def test_interim_answers_come_before_the_final_one() -> None:
    events = read(
        b"HTTP/1.1 100 Continue\r\n\r\n"
        b"HTTP/1.1 103 Early Hints\r\nLink: </style.css>; rel=preload\r\n\r\n"
        b"HTTP/1.1 201 Created\r\nContent-Length: 4\r\n\r\ndone"
    )
    assert kinds(events) == ["Head", "Head", "Head", "Data", "End"]
    assert [(h.status, h.interim, h.framing) for h in heads(events)] == [
        (100, True, Framing.NONE),
        (103, True, Framing.NONE),
        (201, False, Framing.LENGTH),
    ]
    assert heads(events)[1].headers == ((b"link", b"</style.css>; rel=preload"),)
    assert body(events) == b"done"


@pytest.mark.parametrize("status", [b"204 No Content", b"304 Not Modified"])
def test_204_and_304_have_no_body_whatever_their_headers_say(status: bytes) -> None:
    events = read(b"HTTP/1.1 " + status + b"\r\nContent-Length: 99\r\n\r\n")
    assert kinds(events) == ["Head", "End"]
    assert heads(events)[0].framing is Framing.NONE
    assert the_end(events) == End(reusable=True)


def test_connection_close_and_http_1_0_end_the_connection_with_the_answer() -> None:
    for wire in (
        b"HTTP/1.1 200 OK\r\nConnection: Keep-Alive, close\r\nContent-Length: 2\r\n\r\nok",
        b"HTTP/1.0 200 OK\r\nContent-Length: 2\r\n\r\nok",
    ):
        events = read(wire)
        assert body(events) == b"ok"
        assert the_end(events) == End(reusable=False)
    events = read(b"HTTP/1.0 200 OK\r\nConnection: keep-alive\r\nContent-Length: 2\r\n\r\nok")
    assert the_end(events) == End(reusable=True)


def test_bytes_beyond_the_answer_end_the_connection() -> None:
    # In one read: the server does not frame as efd reads, and nothing after it is trusted.
    reader = ResponseReader(LIMIT)
    events = reader.feed(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nokHTTP/1.1 200 OK\r\n")
    assert kinds(events) == ["Head", "Data", "End"]
    assert the_end(events) == End(reusable=False)
    assert refusal(reader.feed(b"\r\n")) == "bytes after an answer that ends the connection"


def test_a_close_between_answers_is_no_event_and_within_one_a_refusal() -> None:
    reader = ResponseReader(LIMIT)
    assert reader.feed_eof() == []
    assert kinds(reader.feed(WEBHOOK_200)) == ["Head", "Data", "End"]
    assert reader.feed_eof() == []
    for partial in (WEBHOOK_200[:10], WEBHOOK_200[:-1]):
        events = read(partial, eof=True)
        assert refusal(events) == "the connection closed in the middle of the answer"


# -- the read limit ------------------------------------------------------------------------


@pytest.mark.parametrize("length", [11, 100])
def test_a_body_over_the_limit_is_cut_there_and_ends_the_connection(length: int) -> None:
    wire = b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\n\r\n" % length + b"x" * length
    events = read(wire, limit=10)
    assert kinds(events) == ["Head", "Data", "End"]
    assert body(events) == b"x" * 10
    assert the_end(events) == End(reusable=False, cut=True)


def test_a_body_of_exactly_the_limit_is_whole() -> None:
    events = read(b"HTTP/1.1 200 OK\r\nContent-Length: 10\r\n\r\n" + b"x" * 10, limit=10)
    assert the_end(events) == End(reusable=True)


def test_a_chunked_body_over_the_limit_is_cut_and_its_trailers_count() -> None:
    chunked = b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n"
    events = read(chunked + b"8\r\n12345678\r\n8\r\n12345678\r\n0\r\n\r\n", limit=12)
    assert body(events) == b"123456781234"
    assert the_end(events) == End(reusable=False, cut=True)
    # 8 bytes of body and a 5-byte trailer line: over 12.
    events = read(chunked + b"8\r\n12345678\r\n0\r\nX-A:1\r\n\r\n", limit=12)
    assert body(events) == b"12345678"
    assert the_end(events) == End(reusable=False, cut=True, trailers=(b"X-A:1",))


def test_a_body_until_close_over_the_limit_is_cut() -> None:
    events = read(b"HTTP/1.1 200 OK\r\n\r\n" + b"y" * 50, limit=20)
    assert body(events) == b"y" * 20
    assert the_end(events) == End(reusable=False, cut=True)


# -- refusals ------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("wire", "reason"),
    [
        (
            b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\nTransfer-Encoding: chunked\r\n\r\nok",
            "both Transfer-Encoding and Content-Length",
        ),
        (
            b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\nContent-Length: 2\r\n\r\n",
            "both Transfer-Encoding and Content-Length",
        ),
        (
            b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\nContent-Length: 3\r\n\r\nok",
            "invalid Content-Length",
        ),
        (b"HTTP/1.1 200 OK\r\nContent-Length: 2, 3\r\n\r\nok", "invalid Content-Length"),
        (b"HTTP/1.1 200 OK\r\nContent-Length: +2\r\n\r\nok", "invalid Content-Length"),
        (b"HTTP/1.1 200 OK\r\nContent-Length: 0x2\r\n\r\nok", "invalid Content-Length"),
        (
            b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked, chunked\r\n\r\n",
            "chunked applied twice",
        ),
        (b"HTTP/2 200 OK\r\n\r\n", "malformed status line b'HTTP/2 200 OK'"),
        (b"HTTP/1.1 20 OK\r\n\r\n", "malformed status line b'HTTP/1.1 20 OK'"),
        (b"HTTP/1.1 2000 OK\r\n\r\n", "malformed status line b'HTTP/1.1 2000 OK'"),
        (b"http/1.1 200 OK\r\n\r\n", "malformed status line b'http/1.1 200 OK'"),
        (b"HTTP/1.1  200 OK\r\n\r\n", "malformed status line b'HTTP/1.1  200 OK'"),
        (b"<html>\r\n\r\n", "malformed status line b'<html>'"),
        (b"HTTP/1.1 200 OK\r\nName : v\r\n\r\n", "malformed header line b'Name : v'"),
        (b"HTTP/1.1 200 OK\r\n folded\r\n\r\n", "malformed header line b' folded'"),
    ],
)
def test_heads_that_frame_ambiguously_or_are_not_http_are_refused(wire: bytes, reason: str) -> None:
    events = read(wire)
    assert kinds(events) == ["Refused"]
    assert refusal(events) == reason


def test_a_switch_of_protocols_efd_never_asked_for_is_refused() -> None:
    events = read(b"HTTP/1.1 101 Switching Protocols\r\nUpgrade: h2c\r\n\r\n")
    assert kinds(events) == ["Head", "Refused"]
    assert refusal(events) == "101 Switching Protocols without an Upgrade"


CHUNKED = b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n"


@pytest.mark.parametrize(
    ("chunks", "reason"),
    [
        (b"1" * 17 + b"\r\n", "malformed chunk size b'" + "1" * 17 + "'"),  # past 64 bits
        (b"F" * 17 + b"\r\n", "malformed chunk size b'" + "F" * 17 + "'"),
        (b"zz\r\n", "malformed chunk size b'zz'"),
        (b"-1\r\n", "malformed chunk size b'-1'"),
        (b"0x10\r\n", "malformed chunk size b'0x10'"),
        (b" 1\r\n", "malformed chunk size b' 1'"),
        (b"\r\n", "malformed chunk size b''"),
        (b"2\r\nokXY", "a chunk not followed by CRLF"),
        (b"1" * 4097 + b"\r\n", "a chunk or trailer line longer than 4 KiB"),
        (b"0\r\nX: " + b"t" * 4100, "a chunk or trailer line longer than 4 KiB"),
    ],
)
def test_malformed_chunks_are_refused(chunks: bytes, reason: str) -> None:
    events = read(CHUNKED + chunks)
    assert [kind for kind in kinds(events) if kind != "Data"] == ["Head", "Refused"]
    assert refusal(events) == reason


def test_a_chunk_line_at_the_line_limit_is_read() -> None:
    line = b"2;" + b"e" * 4094
    assert len(line) == 4096
    events = read(CHUNKED + line + b"\r\nok\r\n0\r\n\r\n")
    assert body(events) == b"ok"


@pytest.mark.parametrize("size", [256, 300])
def test_an_oversize_head_is_refused_however_it_arrives(size: int) -> None:
    start = b"HTTP/1.1 200 OK\r\nContent-Length: 0\r\nX: "
    at_limit = start + b"a" * (size - len(start))
    assert len(at_limit) == size
    events = read(at_limit + b"\r\n\r\n", max_head=size)
    assert kinds(events) == ["Head", "End"]
    too_large = f"the answer's head is larger than {size} bytes"
    events = read(at_limit + b"a\r\n\r\n", max_head=size)
    assert refusal(events) == too_large
    # Never ended: refused once it cannot be a head within the limit.
    events = read(at_limit + b"a" * 10, max_head=size)
    assert refusal(events) == too_large
    assert read(at_limit + b"\r\n\r", max_head=size) == []  # not over yet


def test_the_default_head_limit_is_64_kib() -> None:
    reader = ResponseReader(LIMIT)
    assert refusal(reader.feed(b"HTTP/1.1 200 OK\r\nX: " + b"a" * MAX_HEAD)) == (
        "the answer's head is larger than 64 KiB"
    )


def test_a_refused_reader_reads_nothing_more() -> None:
    reader = ResponseReader(LIMIT)
    [first] = reader.feed(b"HTTP/9 200\r\n\r\n")
    assert isinstance(first, Refused)
    assert reader.feed(WEBHOOK_200) == [first]
    assert reader.feed_eof() == [first]
