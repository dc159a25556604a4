"""Egress through an HTTP proxy (pure: text in, bytes out, no I/O): the proxy's URL, which
hosts bypass it (`no_proxy`), the CONNECT request that opens a tunnel to an HTTPS receiver,
what the proxy's answer to it means, and the absolute-form request target of plain HTTP.

The I/O is efd/delivery/http1.py's. Nothing here puts the proxy's credentials in a message:
a proxy is shown as `host:port`.
"""

from __future__ import annotations

import base64
import ipaddress
import re
from collections.abc import Sequence
from dataclasses import dataclass, field
from urllib.parse import unquote

import yarl

from efd.delivery import netguard

ERROR_CLASS = "proxy"
# The longest answer head efd reads from a proxy to CONNECT; a longer one is refused.
MAX_CONNECT_HEAD = 16 * 1024
# A name of letters, digits, hyphens and underscores between dots (ASCII: an
# internationalised name is written in its xn-- form, as the URL's host is).
_NAME = re.compile(r"[a-z0-9_](?:[a-z0-9_-]*[a-z0-9_])?(?:\.[a-z0-9_](?:[a-z0-9_-]*[a-z0-9_])?)*")
_STATUS_LINE = re.compile(rb"HTTP/1\.[01] ([0-9]{3})(?: ([^\r\n]*))?")


class ProxyConfigError(ValueError):
    """A proxy URL or no_proxy entry efd cannot use; the message never holds credentials."""


@dataclass(frozen=True, slots=True)
class Proxy:
    """An HTTP proxy: where it is and what efd tells it who it is."""

    host: str  # what is resolved and connected to (no brackets)
    port: int
    # The Proxy-Authorization value, when the URL has credentials; never in a repr.
    authorization: str | None = field(default=None, repr=False)

    @property
    def shown(self) -> str:
        """The proxy as messages name it: host and port, never the credentials."""
        return authority(self.host, self.port)


def parse_proxy(url: str) -> Proxy:
    """The proxy of `url`, `http://[user:password@]host:port[/]`; ProxyConfigError saying what
    is wrong otherwise. The port is required: proxies listen on no one standard port."""
    if any(ch.isspace() or ord(ch) < 0x20 or ord(ch) == 0x7F for ch in url):
        raise ProxyConfigError("must be an http:// URL without spaces")
    scheme = url.split(":", 1)[0].lower() if ":" in url else ""
    if scheme == "https":
        raise ProxyConfigError(
            "an https:// proxy (TLS to the proxy itself) is not supported: give the proxy's "
            "http:// address; HTTPS to receivers still runs end to end through CONNECT"
        )
    if scheme != "http":
        raise ProxyConfigError("must be an http:// URL, e.g. http://proxy.internal:3128")
    try:
        parsed = yarl.URL(url)
        host, explicit = parsed.raw_host, parsed.explicit_port
    except (ValueError, TypeError):
        raise ProxyConfigError("must be an http:// URL, e.g. http://proxy.internal:3128") from None
    if not host:
        raise ProxyConfigError("has no host")
    if explicit is None:
        raise ProxyConfigError("must name the proxy's port, e.g. http://proxy.internal:3128")
    if explicit == 0:
        raise ProxyConfigError("has port 0, which nothing listens on")
    if parsed.raw_path not in ("", "/") or parsed.raw_query_string or parsed.raw_fragment:
        raise ProxyConfigError("must be the proxy's address only: no path, query or fragment")
    if problem := netguard.numeric_host_problem(host):
        raise ProxyConfigError(problem)
    authorization = None
    if parsed.raw_user is not None or parsed.raw_password is not None:
        user = unquote(parsed.raw_user or "")
        password = unquote(parsed.raw_password or "")
        if ":" in user:
            raise ProxyConfigError("has a user name holding ':', which Basic cannot carry")
        authorization = basic(user, password)
    return Proxy(host=host, port=explicit, authorization=authorization)


def basic(user: str, password: str) -> str:
    """The Basic credentials of `user` and `password`, UTF-8 encoded (RFC 7617)."""
    pair = f"{user}:{password}".encode()
    return "Basic " + base64.b64encode(pair).decode("ascii")


def authority(host: str, port: int) -> str:
    """`host:port`, an IPv6 address in brackets: a CONNECT target and a Host value."""
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


@dataclass(frozen=True, slots=True)
class Bypass:
    """The hosts reached directly rather than through the proxy (`no_proxy`)."""

    names: frozenset[str] = frozenset()  # exact host names
    suffixes: tuple[str, ...] = ()  # ".example.com": every name under example.com
    networks: tuple[netguard.IPNetwork, ...] = ()  # IP literal hosts in these

    def matches(self, host: str) -> bool:
        """Whether a URL's host (as yarl gives it: no brackets) goes direct."""
        name = host.lower().rstrip(".")
        if name in self.names:
            return True
        if self.suffixes and name.endswith(self.suffixes):
            return True
        if self.networks and (":" in name or name.replace(".", "").isdigit()):
            try:
                address = ipaddress.ip_address(name.split("%", 1)[0])
            except ValueError:
                return False
            return any(address in net for net in self.networks if net.version == address.version)
        return False


def parse_no_proxy(entries: Sequence[str]) -> Bypass:
    """The bypass rules of `entries`: host names (matched exactly), `.suffix` domains
    (matching every name under the domain, not the domain itself) and IP addresses or CIDR
    networks (matching hosts written as IP addresses in them). ProxyConfigError naming every
    entry that is none of these."""
    names: set[str] = set()
    suffixes: list[str] = []
    networks: list[netguard.IPNetwork] = []
    bad: list[str] = []
    for raw in entries:
        entry = raw.strip().lower().rstrip(".")
        network = _network(entry)
        if network is not None:
            networks.append(network)
        elif entry.startswith(".") and _NAME.fullmatch(entry[1:]):
            suffixes.append(entry)
        elif _NAME.fullmatch(entry) and not entry.replace(".", "").isdigit():
            names.add(entry)
        else:
            bad.append(repr(raw))
    if bad:
        raise ProxyConfigError(
            f"not a host name, .domain, IP address or CIDR network: {', '.join(bad)} "
            "(no ports, no wildcards; an internationalised name in its xn-- form)"
        )
    return Bypass(frozenset(names), tuple(suffixes), tuple(networks))


def _network(entry: str) -> netguard.IPNetwork | None:
    if not entry or not (":" in entry or entry.replace(".", "").replace("/", "").isdigit()):
        return None
    try:
        return ipaddress.ip_network(entry.strip("[]"), strict=False)
    except ValueError:
        return None


@dataclass(frozen=True, slots=True)
class Egress:
    """The delivery's proxy and the hosts that bypass it."""

    proxy: Proxy
    bypass: Bypass = Bypass()

    def proxy_for(self, host: str) -> Proxy | None:
        """The proxy to reach `host` through; None when it goes direct."""
        return None if self.bypass.matches(host) else self.proxy


def egress(proxy: str | None, no_proxy: Sequence[str]) -> Egress | None:
    """The configured egress; None without a proxy (no_proxy alone changes nothing)."""
    if proxy is None:
        return None
    return Egress(parse_proxy(proxy), parse_no_proxy(no_proxy))


def connect_request(host: str, port: int, authorization: str | None) -> bytes:
    """`CONNECT host:port HTTP/1.1` with Host, and Proxy-Authorization when given: the
    request that asks the proxy for a tunnel to the receiver."""
    target = authority(host, port)
    lines = [f"CONNECT {target} HTTP/1.1", f"Host: {target}"]
    if authorization is not None:
        lines.append(f"Proxy-Authorization: {authorization}")
    return ("\r\n".join(lines) + "\r\n\r\n").encode("ascii")


def absolute_target(host_header: str, path: str) -> str:
    """The request target of a plain HTTP request through the proxy: the absolute URL
    (RFC 9112 §3.2.2), `path` as encoded in the hook URL."""
    return f"http://{host_header}{path}"


@dataclass(frozen=True, slots=True)
class ConnectAnswer:
    """The head of the proxy's answer to CONNECT."""

    status: int
    reason: str  # printable ASCII, shortened
    rest: bytes  # what came after the head: the tunnel's first bytes


class ProxyProtocolError(Exception):
    """The proxy's answer to CONNECT is not an HTTP/1.x answer efd can read."""


def read_connect_answer(data: bytes) -> ConnectAnswer | None:
    """The answer in `data`, the bytes the proxy sent so far; None while its head is not
    complete. ProxyProtocolError for an answer that is not HTTP/1.x or whose head is longer
    than MAX_CONNECT_HEAD."""
    end = data.find(b"\r\n\r\n")
    if end < 0:
        if len(data) > MAX_CONNECT_HEAD:
            raise ProxyProtocolError(f"an answer head longer than {MAX_CONNECT_HEAD} bytes")
        if data and not b"HTTP/1.".startswith(data[:7]):
            raise ProxyProtocolError("an answer that is not HTTP/1.x")
        return None
    if end + 4 > MAX_CONNECT_HEAD:
        raise ProxyProtocolError(f"an answer head longer than {MAX_CONNECT_HEAD} bytes")
    status_line = data[: data.find(b"\r\n")]
    match = _STATUS_LINE.fullmatch(status_line)
    if match is None:
        raise ProxyProtocolError("an answer that is not HTTP/1.x")
    reason = (match.group(2) or b"").decode("ascii", "replace")
    reason = "".join(c if c.isprintable() and c.isascii() else "?" for c in reason)[:60]
    return ConnectAnswer(int(match.group(1)), reason.strip(), data[end + 4 :])


def refusal(proxy: Proxy, answer: ConnectAnswer, host: str, port: int) -> str | None:
    """Why the tunnel to host:port is not open, in the proxy's name, when its answer is
    not a 2xx; None when it is open."""
    if 200 <= answer.status < 300:
        return None
    said = f"{answer.status} {answer.reason}".rstrip()
    return f"proxy {proxy.shown} answered {said} to CONNECT {authority(host, port)}"


def own_answer(proxy: Proxy, status: int, reason: str, via: bool) -> str | None:
    """Why an answer to a plain HTTP request sent through the proxy (absolute form) is the
    proxy's own rather than the receiver's, or None. A 407 always is; so is any other answer
    but a 2xx that carries no Via header, since a proxy adds Via to every answer it forwards
    (RFC 9110 §7.6.3): its own refusals (401, 403) and its failures to reach the receiver
    (500, 502, 504) come without one. `reason`: the answer's reason phrase."""
    if 200 <= status < 300 or (via and status != 407):
        return None
    shown = "".join(c if c.isprintable() and c.isascii() else "?" for c in reason)[:60].strip()
    said = f"{status} {shown}".rstrip()
    if status == 407:
        return f"proxy {proxy.shown} answered {said}"
    return f"proxy {proxy.shown} answered {said} itself (the answer has no Via header)"
