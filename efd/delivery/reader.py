"""Reading an HTTP/1.1 answer (pure: no I/O). A `ResponseReader` is fed the bytes a
connection receives and returns what they complete: the head, pieces of the body, the end of
the answer, or a refusal (RFC 9112).

The rules are strict where a lenient reading could make efd and a receiver disagree about
where an answer ends (Content-Length against Transfer-Encoding, two lengths, a length that
is not digits, a chunk size that is not hex), and lenient elsewhere (header names' case, a
missing reason phrase, trailers), since efd only needs the status, Retry-After, the first
bytes of the body and whether the connection can carry the next POST.

A refusal quotes the line it refuses whole: the receiver may echo the hook URL in it, and
the caller hides the URL's credentials before it shortens the text (a cut through a secret
would leave a piece redaction no longer recognises).
"""

from __future__ import annotations

import enum
import re
from dataclasses import dataclass

MAX_HEAD = 64 * 1024  # an answer's head larger than this is not a webhook receiver's
MAX_LINE = 4096  # a chunk-size or trailer line


class ProtocolError(ValueError):
    """The answer is not HTTP/1.x as efd can read it."""


class Framing(enum.Enum):
    """How an answer's body is delimited."""

    LENGTH = "Content-Length"
    CHUNKED = "chunked"
    UNTIL_CLOSE = "until close"  # the body ends when the server closes the connection
    NONE = "none"  # an interim answer, 204 or 304: no body whatever the headers say


@dataclass(frozen=True, slots=True)
class Head:
    """An answer's status line and headers, with what they mean for reading the body."""

    status: int
    reason: bytes
    framing: Framing
    length: int  # the body's length when the framing is LENGTH, else 0
    keep_alive: bool  # the head lets the connection carry another request
    retry_after: str | None  # the Retry-After header as sent, if any
    minor: int  # HTTP/1.<minor>
    block: bytes  # the head as received, without its ending blank line

    @property
    def headers(self) -> tuple[tuple[bytes, bytes], ...]:
        """(name, value) in the order sent, names lower-cased, values stripped of blanks.
        Worked out when asked: the client reads only what the head's fields say."""
        pairs = []
        for line in self.block.split(b"\r\n")[1:]:
            name, _, value = line.partition(b":")
            pairs.append((name.lower(), value.strip(_SPACE)))
        return tuple(pairs)

    @property
    def interim(self) -> bool:
        """A 1xx answer: the real answer follows it."""
        return self.status < 200


@dataclass(frozen=True, slots=True)
class Data:
    """Bytes of the body, in order (chunked framing removed)."""

    data: bytes


@dataclass(frozen=True, slots=True)
class End:
    """The answer is over. `reusable`: the connection can carry another request (the head
    allowed it, the body ended by its framing, and no byte followed it). `cut`: the body
    reached the read limit before its end, and the rest is not read."""

    reusable: bool
    cut: bool = False
    trailers: tuple[bytes, ...] = ()  # a chunked body's trailer lines as sent


@dataclass(frozen=True, slots=True)
class Refused:
    """The bytes are not an answer efd can read; the reader reads nothing more."""

    reason: str


Event = Head | Data | End | Refused

_REUSABLE, _LAST = End(reusable=True), End(reusable=False)


class _State(enum.Enum):
    HEAD = enum.auto()
    BODY = enum.auto()
    CHUNK_LINE = enum.auto()
    CHUNK_DATA = enum.auto()
    CHUNK_END = enum.auto()
    TRAILERS = enum.auto()
    UNTIL_CLOSE = enum.auto()
    CLOSED = enum.auto()  # after an answer that the connection cannot follow with another
    REFUSED = enum.auto()


# As module names: read on every call of the loop.
_HEAD, _BODY, _CHUNK_LINE, _CHUNK_DATA = (
    _State.HEAD,
    _State.BODY,
    _State.CHUNK_LINE,
    _State.CHUNK_DATA,
)
_CHUNK_END, _TRAILERS, _UNTIL_CLOSE = _State.CHUNK_END, _State.TRAILERS, _State.UNTIL_CLOSE
_CLOSED, _REFUSED = _State.CLOSED, _State.REFUSED


class ResponseReader:
    """Reads the answers of one connection, one after the other. `feed` returns the events
    the bytes complete: an answer's head, its body's pieces and its `End`, or a `Refused`,
    after which nothing more is read (nor after an `End` that is not `reusable`); `feed_eof`
    says the server closed the connection. `limit`: body bytes read at most (trailer lines
    count), after which the answer ends `cut`."""

    def __init__(self, limit: int, max_head: int = MAX_HEAD, max_line: int = MAX_LINE) -> None:
        self._limit = limit
        self._max_head = max_head
        self._max_line = max_line
        self._head_too_large = f"the answer's head is larger than {_size(max_head)}"
        self._line_too_long = f"a chunk or trailer line longer than {_size(max_line)}"
        self._buffer = bytearray()
        self._state = _HEAD
        self._keep_alive = False  # the answer being read lets the connection carry another
        self._read = 0  # body bytes read of this answer
        self._remaining = 0  # of the body or the current chunk
        self._trailers: list[bytes] = []
        self._refusal: Refused | None = None

    @property
    def idle(self) -> bool:
        """Between answers, with no byte of the next one received."""
        return self._state is _HEAD and not self._buffer

    def feed(self, data: bytes) -> list[Event]:
        if self._refusal is not None:
            return [self._refusal]
        events: list[Event] = []
        if self._state is _CLOSED:
            self._refuse(events, "bytes after an answer that ends the connection")
            return events
        if self._buffer:  # the rest of an earlier read, which these bytes continue
            self._buffer += data
            data = bytes(self._buffer)
            self._buffer.clear()
        try:
            if self._state is _HEAD:
                read_to = self._answer(data, events)
                if read_to < 0:
                    return events
            else:
                read_to = self._advance(data, events, 0)
        except ProtocolError as error:
            self._refuse(events, str(error))
            return events
        if read_to < len(data) and self._state is not _CLOSED:
            self._buffer += memoryview(data)[read_to:]
        return events

    def feed_eof(self) -> list[Event]:
        """The server closed the connection: the end of a body read until close; nothing
        between answers; a refusal in the middle of one."""
        if self._refusal is not None:
            return [self._refusal]
        events: list[Event] = []
        if self._state is _UNTIL_CLOSE:
            self._end(events, False)
        elif not self.idle and self._state is not _CLOSED:
            self._refuse(events, "the connection closed in the middle of the answer")
        return events

    def _refuse(self, events: list[Event], reason: str) -> None:
        self._refusal = Refused(reason)
        self._state = _REFUSED
        self._buffer.clear()
        events.append(self._refusal)

    def _answer(self, data: bytes, events: list[Event]) -> int:
        """Read `data`, which starts an answer, as _advance does; -1 when it held a whole
        answer by Content-Length and nothing more, read at once: the usual webhook answer,
        which needs none of the state machine's steps."""
        end = data.find(b"\r\n\r\n")
        if end < 0 or end > self._max_head:
            return self._advance(data, events, 0)  # refused there, or waiting for more
        head = parse_head(data[:end])
        pos = end + 4
        length = head.length
        if (
            head.framing is Framing.LENGTH
            and len(data) - pos == length
            and 0 < length <= self._limit
        ):
            if not head.keep_alive:
                self._state = _CLOSED
            events += (head, Data(data[pos:]), _REUSABLE if head.keep_alive else _LAST)
            return -1
        events.append(head)
        if self._start(head, events, pos < len(data)):
            return pos
        return self._advance(data, events, pos)

    def _advance(self, data: bytes, events: list[Event], pos: int) -> int:
        """Read `data` from `pos`, appending to `events`; where the reading stopped (what
        follows waits for more bytes, or for the next answer)."""
        size = len(data)
        while True:
            state = self._state
            if state is _HEAD:
                end = data.find(b"\r\n\r\n", pos)
                if end < 0:
                    # Its last three bytes may begin the blank line.
                    if size - pos - 3 > self._max_head:
                        raise ProtocolError(self._head_too_large)
                    return pos
                if end - pos > self._max_head:
                    raise ProtocolError(self._head_too_large)
                head = parse_head(data[pos:end])
                pos = end + 4
                events.append(head)
                if self._start(head, events, pos < size):
                    return pos  # an answer without a body, over
            elif state is _BODY or state is _CHUNK_DATA:
                if pos == size:
                    return pos
                take = size - pos
                if take > self._remaining:
                    take = self._remaining
                room = self._limit - self._read
                if take > room:
                    take = room
                if take:
                    events.append(Data(data[pos : pos + take]))
                    pos += take
                self._read += take
                self._remaining -= take
                if state is _BODY and not self._remaining:
                    self._end(events, self._keep_alive and pos == size)
                    return pos
                if self._read >= self._limit:
                    self._end(events, False, True)
                    return pos
                if self._remaining:
                    return pos
                self._state = _CHUNK_END
            elif state is _CHUNK_LINE or state is _TRAILERS:
                end = data.find(b"\r\n", pos)
                if end < 0:
                    if size - pos - 1 > self._max_line:
                        raise ProtocolError(self._line_too_long)
                    return pos
                if end - pos > self._max_line:
                    raise ProtocolError(self._line_too_long)
                line = data[pos:end]
                pos = end + 2
                if state is _CHUNK_LINE:
                    self._remaining = chunk_size(line)
                    self._state = _CHUNK_DATA if self._remaining else _TRAILERS
                elif not line:
                    self._end(events, self._keep_alive and pos == size)
                    return pos
                else:
                    self._trailers.append(line)
                    self._read += len(line)
                    if self._read >= self._limit:
                        self._end(events, False, True)
                        return pos
            elif state is _CHUNK_END:
                if size - pos < 2:
                    return pos
                if data[pos : pos + 2] != b"\r\n":
                    raise ProtocolError("a chunk not followed by CRLF")
                pos += 2
                self._state = _CHUNK_LINE
            elif state is _UNTIL_CLOSE:
                if pos < size:
                    take = min(size - pos, self._limit - self._read)
                    events.append(Data(data[pos : pos + take]))
                    pos += take
                    self._read += take
                    if self._read >= self._limit:
                        self._end(events, False, True)
                return pos
            else:  # refused or closed: feed does not call here
                return pos

    def _start(self, head: Head, events: list[Event], more: bool) -> bool:
        """Begin reading the body `head` announces; True when the answer is over already
        (`more`: bytes follow the head in this read)."""
        framing = head.framing
        if head.status < 200:
            if head.status == 101:  # efd never asks to switch protocols
                raise ProtocolError("101 Switching Protocols without an Upgrade")
            return False  # an interim answer (100 Continue, 103 Early Hints): skipped
        self._keep_alive = head.keep_alive
        if framing is Framing.LENGTH:
            if head.length:
                self._remaining = head.length
                self._state = _BODY
                return False
        elif framing is Framing.CHUNKED:
            self._state = _CHUNK_LINE
            return False
        elif framing is Framing.UNTIL_CLOSE:
            self._state = _UNTIL_CLOSE
            return False
        self._end(events, head.keep_alive and not more)
        return True

    def _end(self, events: list[Event], reusable: bool, cut: bool = False) -> None:
        """The answer is over; `reusable`: the head allowed another request and no byte
        followed the answer in its read (a server that sends more does not frame as efd
        reads)."""
        trailers = tuple(self._trailers) if self._trailers else ()
        reusable = reusable and not cut
        if cut or trailers:
            events.append(End(reusable, cut, trailers))
        else:  # the usual ends, made once: an End is immutable
            events.append(_REUSABLE if reusable else _LAST)
        self._state = _HEAD if reusable else _CLOSED
        self._keep_alive = False
        self._read = 0
        self._remaining = 0
        if self._trailers:
            self._trailers = []


def _size(limit: int) -> str:
    return f"{limit // 1024} KiB" if limit % 1024 == 0 else f"{limit} bytes"


_STATUS_LINE = re.compile(rb"HTTP/1\.([01]) ([1-9][0-9][0-9])(?: ([^\r\n]*))?")
_DIGITS = re.compile(rb"[0-9]+")
_NO_BODY = frozenset({204, 304})
_SPACE = b" \t"


# A line's value: anything up to the next CRLF (a bare CR or LF is the value's).
_VALUE = rb"([^\r]*(?:\r(?!\n)[^\r]*)*)"
# Header lines, each with a colon and a name without blanks (no folded line).
_FIELDS = re.compile(rb"(?:\r\n[^:\r\n \t]+:[^\r]*(?:\r(?!\n)[^\r]*)*)*")
# On the head lower-cased, the headers that say where the answer ends or when to retry; a
# name is a line's start up to its colon.
_FRAMING_FIELDS = re.compile(
    rb"\r\n(content-length|transfer-encoding|connection|retry-after):" + _VALUE
)


def parse_head(block: bytes) -> Head:
    """The head of an answer, `block` without its ending blank line. 1xx heads parse too."""
    eol = block.find(b"\r\n")
    if eol < 0:
        eol = len(block)
    match = _STATUS_LINE.fullmatch(block, 0, eol)
    if match is None:
        raise ProtocolError(f"malformed status line {block[:eol]!r}")
    if _FIELDS.fullmatch(block, eol) is None:
        for line in block[eol + 2 :].split(b"\r\n"):
            if _FIELDS.fullmatch(b"\r\n" + line) is None:
                raise ProtocolError(f"malformed header line {line!r}")
    status = int(match.group(2))
    minor = 1 if match.group(1) == b"1" else 0
    retry_after: str | None = None
    lengths: list[bytes] = []
    transfer: list[bytes] = []
    connection: list[bytes] = []
    # Found by one search in C rather than line by line: the lower-cased copy has the
    # original's offsets, where Retry-After's value is read as sent.
    for found in _FRAMING_FIELDS.finditer(block.lower()):
        name, value = found.group(1, 2)
        if name == b"content-length":
            lengths += [part.strip(_SPACE) for part in value.split(b",")]
        elif name == b"transfer-encoding":
            transfer += [part.strip(_SPACE) for part in value.split(b",")]
        elif name == b"connection":
            connection += [part.strip(_SPACE) for part in value.split(b",")]
        else:
            retry_after = block[found.start(2) : found.end(2)].strip(_SPACE).decode("latin-1")
    keep_alive = b"close" not in connection if minor else b"keep-alive" in connection
    framing = Framing.UNTIL_CLOSE
    length = 0
    if status < 200 or status in _NO_BODY:
        framing = Framing.NONE
    elif transfer:
        if lengths:  # both: an attack or a broken server
            raise ProtocolError("both Transfer-Encoding and Content-Length")
        if transfer[-1] == b"chunked":
            if transfer.count(b"chunked") > 1:
                raise ProtocolError("chunked applied twice")
            framing = Framing.CHUNKED
    elif lengths:
        first = lengths[0]
        if lengths.count(first) != len(lengths) or _DIGITS.fullmatch(first) is None:
            raise ProtocolError("invalid Content-Length")
        framing = Framing.LENGTH
        length = int(first)
    if framing is Framing.UNTIL_CLOSE:
        keep_alive = False
    return Head(
        status,
        match.group(3) or b"",
        framing,
        length,
        keep_alive,
        retry_after,
        minor,
        block,
    )


_CHUNK_SIZE = re.compile(rb"([0-9A-Fa-f]{1,16})[ \t]*(?:;[^\r\n]*)?")


def chunk_size(line: bytes) -> int:
    """The size on a chunk's line (extensions ignored), without its CRLF."""
    match = _CHUNK_SIZE.fullmatch(line)
    if match is None:
        raise ProtocolError(f"malformed chunk size {line!r}")
    return int(match.group(1), 16)
