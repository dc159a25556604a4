"""Which peer addresses a delivery may connect to (pure: the SSRF rule).

Webhook URLs come from configuration, but DNS answers do not: a public name can resolve to
127.0.0.1 or a cloud metadata address at any time. The dispatcher checks the address each
socket actually connects to, so the rule holds against DNS rebinding too.
"""

from __future__ import annotations

import ipaddress
from collections.abc import Sequence
from urllib.parse import urlsplit

import yarl

IPAddress = ipaddress.IPv4Address | ipaddress.IPv6Address
IPNetwork = ipaddress.IPv4Network | ipaddress.IPv6Network

_CGNAT = ipaddress.ip_network("100.64.0.0/10")
_NAT64 = (ipaddress.ip_network("64:ff9b::/96"), ipaddress.ip_network("64:ff9b:1::/48"))
_SIX_TO_FOUR = ipaddress.ip_network("2002::/16")
# Not global, but unknown to Python 3.11's tables: site-local (RFC 3879), documentation (RFC 9637).
_EXTRA_RESERVED = (ipaddress.ip_network("fec0::/10"), ipaddress.ip_network("3fff::/20"))


def embedded_ipv4(address: IPAddress) -> ipaddress.IPv4Address | None:
    """The IPv4 address an IPv6 address stands for (mapped, 6to4, NAT64, Teredo), if any."""
    if isinstance(address, ipaddress.IPv4Address):
        return None
    if address.ipv4_mapped is not None:
        return address.ipv4_mapped
    if address in _SIX_TO_FOUR:
        return address.sixtofour
    if address.teredo is not None:
        return address.teredo[1]
    for network in _NAT64:
        if address in network:
            return ipaddress.IPv4Address(int(address) & 0xFFFFFFFF)
    if int(address) >> 32 == 0 and int(address) > 1:
        return ipaddress.IPv4Address(int(address))  # deprecated IPv4-compatible ::a.b.c.d
    return None


def _blocked_reason(address: IPAddress) -> str | None:
    if address.is_loopback:
        return "loopback"
    if address.is_link_local:
        return "link-local"
    if address.is_multicast:
        return "multicast"
    if address.is_unspecified:
        return "unspecified"
    if isinstance(address, ipaddress.IPv4Address) and address in _CGNAT:
        return "carrier-grade NAT"
    if address.is_private:
        return "private"
    if (
        address.is_reserved
        or not address.is_global
        or any(address in net for net in _EXTRA_RESERVED if net.version == address.version)
    ):
        return "reserved"
    return None


def numeric_host_problem(host: str) -> str | None:
    """Why a URL's host (as yarl normalises it, which the sender connects to) is never
    connected to, if it is a numeric IPv4 form other than a dotted quad: `2130706433`,
    `127.1`, `0177.0.0.1`, `127.0.0.1.`. The C library reads such forms as addresses, each
    its own way; the sender (efd/delivery/http1.py) refuses them before resolving, as
    aiohttp does, so every delivery to one fails. The rule: a host of digits and dots must
    be four decimal parts from 0 to 255 without leading zeros. Hex forms (`0x7f.0.0.1`) are
    names to the sender: the resolver reads them and the guard judges the address."""
    if not host or ":" in host or not host.replace(".", "").isdigit():
        return None  # a name, or an IPv6 address
    parts = host.split(".")
    if len(parts) == 4 and all(
        part.isascii()
        and part.isdigit()
        and 1 <= len(part) <= 3
        and (part == "0" or not part.startswith("0"))
        and int(part) <= 255
        for part in parts
    ):
        return None
    return (
        f"the host {host} is a numeric IPv4 form other than a dotted quad, which is never "
        "connected to: write the address as four decimal numbers, a.b.c.d (no leading zeros)"
    )


def parse_networks(cidrs: Sequence[str]) -> tuple[IPNetwork, ...]:
    return tuple(ipaddress.ip_network(c, strict=False) for c in cidrs)


def check(address: str, allowed: Sequence[IPNetwork]) -> str | None:
    """None when `address` may be connected to, else why not ("private 10.0.0.5")."""
    ip = ipaddress.ip_address(address.split("%", 1)[0])  # drop an IPv6 zone id
    # An IPv6 form that carries an IPv4 address reaches that IPv4 host: judge the host.
    target: IPAddress = embedded_ipv4(ip) or ip
    if any(target in net for net in allowed if target.version == net.version):
        return None
    reason = _blocked_reason(target)
    if reason is None:
        return None
    shown = f"{target} (as {ip})" if target != ip else str(target)
    return f"{reason} address {shown}"


def http_url_problem(url: str) -> str | None:
    """Why `url` cannot be a URL efd sends to (a hook's, a token endpoint's), or None: a full
    http:// or https:// URL with no spaces, a valid port, and a numeric host only as a dotted
    quad (numeric_host_problem)."""
    if any(ch.isspace() or ord(ch) < 0x20 or ord(ch) == 0x7F for ch in url):
        return "must be a full http:// or https:// URL (no spaces)"
    parts = urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        return "must be a full http:// or https:// URL"
    try:
        _ = parts.port
    except ValueError:
        return "has an invalid port"
    try:
        host = yarl.URL(url).raw_host or ""  # the host the sender connects to
    except ValueError:
        return "must be a full http:// or https:// URL"
    return numeric_host_problem(host)
