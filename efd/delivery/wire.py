"""HTTP/1.1 on the wire for webhook requests (pure: text in, bytes out): the request head efd
writes. What efd reads from an answer is efd/delivery/reader.py.

A header that could change how the request is framed or routed, or that cannot be written as
it is, is refused rather than mended: the receiver would read another request than the one
signed.
"""

from __future__ import annotations

import re
from collections.abc import Mapping


class BadHeader(ValueError):
    """A request header that cannot be sent as it is."""


_FIELD_NAME = re.compile(r"[!#$%&'*+\-.^_`|~0-9A-Za-z]+")  # a token
# Names that change how the request is framed or routed: efd writes them itself.
_FRAMING = frozenset({"host", "content-length", "transfer-encoding", "connection"})
# Names already found to be tokens efd may send: a hook's headers are the same few on
# every request, so each name is checked once.
_GOOD_NAMES: set[str] = set()
# The methods efd sends: a webhook's POST, and what an action may choose. Each carries a
# body framed by Content-Length.
METHODS = frozenset({"POST", "PUT", "PATCH"})


def request_head(
    target: str, host: str, headers: Mapping[str, str], length: int, method: str = "POST"
) -> bytes:
    """`METHOD target HTTP/1.1` with Host, the given headers as given (names' case kept), and
    Content-Length. BadHeader, and nothing to send, when a header value holds CR, LF or NUL,
    a header holds a character Latin-1 cannot encode, a name is not a token, or a name sets
    the framing; ValueError for a method other than METHODS (the configuration allows no
    other)."""
    if method not in METHODS:
        raise ValueError(f"efd does not send {method[:20]!r} requests")
    for name in headers:
        if name not in _GOOD_NAMES:
            _check_name(name)
    values = "".join(headers.values())
    if "\r" in values or "\n" in values or "\x00" in values:
        raise BadHeader(_why_bad(headers))
    lines = "".join([f"{name}: {value}\r\n" for name, value in headers.items()])
    text = f"{method} {target} HTTP/1.1\r\nHost: {host}\r\n{lines}Content-Length: {length}\r\n\r\n"
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
