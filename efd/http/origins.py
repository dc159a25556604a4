"""Origins and `allowed_origins` patterns (pure): what a source's list allows.

The CORS answers themselves are efd/http/cors.py's.
"""

from __future__ import annotations

import ipaddress
import re
from collections.abc import Iterable
from typing import NamedTuple
from urllib.parse import urlsplit

_DEFAULT_PORTS = {"http": 80, "https": 443}
_LABEL = r"[a-z0-9](?:[a-z0-9-]*[a-z0-9])?"
_HOST_NAME = re.compile(rf"{_LABEL}(?:\.{_LABEL})*")
_SHAPE = "must be an origin: scheme://host[:port], e.g. https://shop.example"


class Origin(NamedTuple):
    """An origin, normalised as browsers send it: lower case, no default port."""

    scheme: str
    host: str  # for a pattern, "*.example.com"
    port: int

    @property
    def wildcard(self) -> bool:
        return self.host.startswith("*.")


def parse_origin(text: str, *, wildcard: bool = False) -> Origin:
    """`scheme://host[:port]` → Origin; ValueError saying what is wrong.

    With `wildcard`, the host may be `*.example.com`: any subdomain of example.com, at any
    depth, but not example.com itself.
    """
    if not text or any(ch.isspace() or ord(ch) < 0x20 or ord(ch) > 0x7E for ch in text):
        raise ValueError(f"{_SHAPE} (ASCII, no spaces: an IDN host in its xn-- form)")
    parts = urlsplit(text)
    scheme = parts.scheme.lower()
    if scheme not in _DEFAULT_PORTS or "//" not in text:
        raise ValueError(f"{_SHAPE}, with http or https")
    if not parts.netloc:
        raise ValueError(f"{_SHAPE}: no host")
    if parts.path or parts.query or parts.fragment or text.endswith(("?", "#")):
        raise ValueError(f"{_SHAPE}, without a path (not even /), query or fragment")
    if "@" in parts.netloc:
        raise ValueError(f"{_SHAPE}, without user or password")
    try:
        port = parts.port
    except ValueError:
        raise ValueError(f"{_SHAPE}: the port is not a number from 0 to 65535") from None
    host = (parts.hostname or "").lower()
    if wildcard and host.startswith("*."):
        if not _HOST_NAME.fullmatch(host[2:]) or _is_ip(host[2:]):
            raise ValueError(f"{_SHAPE}: a wildcard is *. followed by a domain name")
    elif "*" in host:
        raise ValueError(
            f"{_SHAPE}: a wildcard stands for whole leading labels only, as in *.example.com"
            if wildcard
            else f"{_SHAPE}, without a wildcard"
        )
    elif not (_HOST_NAME.fullmatch(host) or _is_ip(host)):
        raise ValueError(f"{_SHAPE}: {host!r} is not a host name or IP address")
    return Origin(scheme, host, _DEFAULT_PORTS[scheme] if port is None else port)


def check_pattern(text: str) -> str:
    """Validate one `allowed_origins` entry (a pydantic validator); the text is kept as is."""
    if text == "*":
        raise ValueError(f"{_SHAPE}; leave allowed_origins out to allow every origin")
    parse_origin(text, wildcard=True)
    return text


def _is_ip(host: str) -> bool:
    try:
        ipaddress.ip_address(host)
    except ValueError:
        return False
    return True


class AllowedOrigins:
    """One source's `allowed_origins`: exact origins and `*.domain` patterns."""

    def __init__(self, patterns: Iterable[str]) -> None:
        origins = [parse_origin(pattern, wildcard=True) for pattern in patterns]
        self._exact = {origin for origin in origins if not origin.wildcard}
        # (scheme, ".example.com", port): the suffix keeps its dot, so that
        # *.example.com allows a.example.com but not badexample.com.
        self._suffixes = [(o.scheme, o.host[1:], o.port) for o in origins if o.wildcard]

    def allows(self, origin: str) -> bool:
        """Whether a request's Origin header value is allowed (never for a malformed one,
        nor for `null`, which sandboxed frames and file: pages send)."""
        try:
            parsed = parse_origin(origin)
        except ValueError:
            return False
        if parsed in self._exact:
            return True
        return any(
            parsed.scheme == scheme and parsed.port == port and parsed.host.endswith(suffix)
            for scheme, suffix, port in self._suffixes
        )
