"""HTTP/1.1 on the wire for webhook POSTs (pure: bytes in, bytes out): the request head efd
writes, and what it reads from an answer's head and chunk lines (RFC 9112).

The rules are strict where a lenient reading could make efd and a receiver disagree about
where an answer ends (Content-Length against Transfer-Encoding, two lengths, a length that
is not digits), and lenient elsewhere (header names' case, a missing reason phrase), since
efd only needs the status, Retry-After and whether the connection can carry the next POST.

A ProtocolError quotes the line it refuses whole: the receiver may echo the hook URL in it,
and the caller hides the URL's credentials before it shortens the text (a cut through a
secret would leave a piece redaction no longer recognises).
"""

from __future__ import annotations

import re
from collections.abc import Mapping


class ProtocolError(ValueError):
    """The answer is not HTTP/1.x as efd can read it."""


class BadHeader(ValueError):
    """A request header that cannot be sent as it is."""


# How an answer's body is framed (plain ints: read on every answer).
LENGTH = 0  # Content-Length bytes follow the head
CHUNKED = 1  # Transfer-Encoding: chunked
CLOSE = 2  # the body ends when the server closes the connection

# An answer's head: status, Retry-After as sent, framing, the body's length when the
# framing is LENGTH (else 0), and whether the connection may carry another request.
Head = tuple[int, str | None, int, int, bool]


_FIELD_NAME = re.compile(r"[!#$%&'*+\-.^_`|~0-9A-Za-z]+")  # a token (RFC 9110 5.6.2)
# Names that change how the request is framed or routed: efd writes them itself.
_FRAMING = frozenset({"host", "content-length", "transfer-encoding", "connection"})
# Names already found to be tokens efd may send: a hook's headers are the same few on
# every request, so each name is checked once.
_GOOD_NAMES: set[str] = set()


def request_head(target: str, host: str, headers: Mapping[str, str], length: int) -> bytes:
    """`POST target HTTP/1.1` with Host, the given headers as given (names' case kept), and
    Content-Length. BadHeader, and nothing to send, when a header value holds CR, LF or NUL,
    a header holds a character Latin-1 cannot encode, a name is not a token, or a name sets
    the framing."""
    for name in headers:
        if name not in _GOOD_NAMES:
            _check_name(name)
    values = "".join(headers.values())
    if "\r" in values or "\n" in values or "\x00" in values:
        raise BadHeader(_why_bad(headers))
    lines = "".join([f"{name}: {value}\r\n" for name, value in headers.items()])
    text = f"POST {target} HTTP/1.1\r\nHost: {host}\r\n{lines}Content-Length: {length}\r\n\r\n"
    try:
        return text.encode("latin-1")
    except UnicodeEncodeError:
        raise BadHeader(_why_bad(headers)) from None


def _check_name(name: str) -> None:
    if _FIELD_NAME.fullmatch(name) is None:
        raise BadHeader(f"the header name {_shown(name)} is not a token")
    if name.lower() in _FRAMING:
        raise BadHeader(f"the header {_shown(name)} is set by efd")
    if len(_GOOD_NAMES) < 1024:
        _GOOD_NAMES.add(name)


def _shown(name: str) -> str:
    return repr(name[:60])


def _why_bad(headers: Mapping[str, str]) -> str:
    for name, value in headers.items():
        if any(c in value for c in "\r\n\x00"):
            return f"the value of header {_shown(name)} holds CR, LF or NUL"
        try:
            value.encode("latin-1")
        except UnicodeEncodeError:
            return f"the value of header {_shown(name)} is not Latin-1"
    return "a header cannot be sent"  # unreachable: the callers' checks found one


_STATUS_LINE = re.compile(rb"HTTP/1\.([01]) ([1-9][0-9][0-9])(?: [^\r\n]*)?")
_DIGITS = re.compile(rb"[0-9]+")
_NO_BODY = frozenset({204, 304})
_SPACE = b" \t"


def parse_head(block: bytes) -> Head:
    """The head of an answer, `block` without its ending blank line. 1xx heads parse too
    (the reader skips them: their status is below 200)."""
    lines = block.split(b"\r\n")
    match = _STATUS_LINE.fullmatch(lines[0])
    if match is None:
        raise ProtocolError(f"malformed status line {lines[0]!r}")
    status = int(match.group(2))
    retry_after: str | None = None
    lengths: list[bytes] = []
    transfer: list[bytes] = []
    connection: list[bytes] = []
    for line in lines[1:]:
        name, colon, value = line.partition(b":")
        # No space inside or around a name (RFC 9112 5.1), no folded line (5.2).
        if not colon or not name or b" " in name or b"\t" in name:
            raise ProtocolError(f"malformed header line {line!r}")
        lower = name.lower()
        if lower == b"content-length":
            lengths += [part.strip(_SPACE) for part in value.split(b",")]
        elif lower == b"transfer-encoding":
            transfer += [part.strip(_SPACE).lower() for part in value.split(b",")]
        elif lower == b"connection":
            connection += [part.strip(_SPACE).lower() for part in value.split(b",")]
        elif lower == b"retry-after":
            retry_after = value.strip(_SPACE).decode("latin-1")
    if match.group(1) == b"1":
        keep_alive = b"close" not in connection
    else:
        keep_alive = b"keep-alive" in connection
    if status < 200 or status in _NO_BODY:
        return status, retry_after, LENGTH, 0, keep_alive
    if transfer:
        if lengths:  # RFC 9112 6.3: a message with both is an attack or a broken server
            raise ProtocolError("both Transfer-Encoding and Content-Length")
        if transfer[-1] != b"chunked":
            return status, retry_after, CLOSE, 0, False
        if transfer.count(b"chunked") > 1:
            raise ProtocolError("chunked applied twice")
        return status, retry_after, CHUNKED, 0, keep_alive
    if lengths:
        first = lengths[0]
        if lengths.count(first) != len(lengths) or _DIGITS.fullmatch(first) is None:
            raise ProtocolError("invalid Content-Length")
        return status, retry_after, LENGTH, int(first), keep_alive
    return status, retry_after, CLOSE, 0, False


_CHUNK_SIZE = re.compile(rb"([0-9A-Fa-f]{1,16})[ \t]*(?:;[^\r\n]*)?")


def chunk_size(line: bytes) -> int:
    """The size on a chunk's line (extensions ignored), without its CRLF."""
    match = _CHUNK_SIZE.fullmatch(line)
    if match is None:
        raise ProtocolError(f"malformed chunk size {line!r}")
    return int(match.group(1), 16)
