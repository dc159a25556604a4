"""efd.delivery.netguard: which peer addresses a delivery may connect to (pure, fast)."""

from __future__ import annotations

import ipaddress

import pytest

from efd.delivery.netguard import check, embedded_ipv4, parse_networks

NONE: tuple[ipaddress.IPv4Network | ipaddress.IPv6Network, ...] = ()


@pytest.mark.parametrize(
    ("address", "reason"),
    [
        # loopback
        ("127.0.0.1", "loopback address 127.0.0.1"),
        ("127.255.255.254", "loopback address 127.255.255.254"),
        ("::1", "loopback address ::1"),
        # private
        ("10.0.0.1", "private address 10.0.0.1"),
        ("10.255.255.255", "private address 10.255.255.255"),
        ("172.16.0.1", "private address 172.16.0.1"),
        ("172.31.255.254", "private address 172.31.255.254"),
        ("192.168.1.1", "private address 192.168.1.1"),
        ("fc00::1", "private address fc00::1"),
        ("fd12:3456::1", "private address fd12:3456::1"),
        ("fd00:ec2::254", "private address fd00:ec2::254"),  # AWS metadata over IPv6
        # link-local (cloud metadata lives here)
        ("169.254.169.254", "link-local address 169.254.169.254"),
        ("169.254.0.1", "link-local address 169.254.0.1"),
        ("fe80::1", "link-local address fe80::1"),
        ("febf::1", "link-local address febf::1"),
        # carrier-grade NAT
        ("100.64.0.1", "carrier-grade NAT address 100.64.0.1"),
        ("100.127.255.254", "carrier-grade NAT address 100.127.255.254"),
        # multicast
        ("224.0.0.1", "multicast address 224.0.0.1"),
        ("239.255.255.250", "multicast address 239.255.255.250"),
        ("ff02::1", "multicast address ff02::1"),
        ("ff0e::1", "multicast address ff0e::1"),
        # unspecified
        ("0.0.0.0", "unspecified address 0.0.0.0"),
        ("::", "unspecified address ::"),
    ],
)
def test_blocked_with_reason(address: str, reason: str) -> None:
    assert check(address, NONE) == reason


@pytest.mark.parametrize(
    "address",
    [
        "0.1.2.3",  # "this network"
        "192.0.0.170",  # IETF protocol assignments
        "192.0.2.1",  # TEST-NET-1
        "198.18.0.1",  # benchmarking
        "198.51.100.1",  # TEST-NET-2
        "203.0.113.1",  # TEST-NET-3
        "240.0.0.1",  # reserved class E
        "255.255.255.255",  # broadcast
        "100::1",  # discard-only
        "2001:2::1",  # benchmarking
        "2001:db8::1",  # documentation
        "5f00::1",  # SRv6 SIDs
        "::ffff:0:7f00:1",  # IPv4-translated
        pytest.param(
            "fec0::1",
        ),
        pytest.param(
            "3fff::1",
        ),
    ],
)
def test_reserved_and_special_purpose_blocked(address: str) -> None:
    assert check(address, NONE) is not None


@pytest.mark.parametrize(
    ("address", "reason_start"),
    [
        # IPv4-mapped
        ("::ffff:127.0.0.1", "loopback address 127.0.0.1 (as "),
        ("::ffff:10.0.0.1", "private address 10.0.0.1 (as "),
        ("::ffff:169.254.169.254", "link-local address 169.254.169.254 (as "),
        ("::ffff:100.64.0.1", "carrier-grade NAT address 100.64.0.1 (as "),
        ("::ffff:0.0.0.0", "unspecified address 0.0.0.0 (as "),
        ("::ffff:224.0.0.1", "multicast address 224.0.0.1 (as "),
        # 6to4
        ("2002:7f00:1::", "loopback address 127.0.0.1 (as "),
        ("2002:a00:1::1", "private address 10.0.0.1 (as "),
        ("2002:a9fe:a9fe::1", "link-local address 169.254.169.254 (as "),
        # NAT64, well-known and local-use prefixes
        ("64:ff9b::127.0.0.1", "loopback address 127.0.0.1 (as "),
        ("64:ff9b::a9fe:a9fe", "link-local address 169.254.169.254 (as "),
        ("64:ff9b:1::10.0.0.1", "private address 10.0.0.1 (as "),
        # deprecated IPv4-compatible
        ("::127.0.0.1", "loopback address 127.0.0.1 (as "),
        ("::10.1.2.3", "private address 10.1.2.3 (as "),
        # Teredo: the client address is stored inverted (here 127.0.0.1 and 10.0.0.1)
        ("2001:0:4136:e378:8000:63bf:80ff:fffe", "loopback address 127.0.0.1 (as "),
        ("2001:0:4136:e378:8000:63bf:f5ff:fffe", "private address 10.0.0.1 (as "),
    ],
)
def test_ipv6_forms_of_blocked_ipv4_addresses(address: str, reason_start: str) -> None:
    reason = check(address, NONE)
    assert reason is not None
    assert reason.startswith(reason_start)
    assert reason.endswith(f"{ipaddress.ip_address(address)})")


@pytest.mark.parametrize(
    ("address", "reason"),
    [
        ("fe80::1%eth0", "link-local address fe80::1"),
        ("fe80::abcd%25", "link-local address fe80::abcd"),
        ("::1%lo", "loopback address ::1"),
        ("ff02::1%1", "multicast address ff02::1"),
    ],
)
def test_zone_ids_are_ignored(address: str, reason: str) -> None:
    assert check(address, NONE) == reason


@pytest.mark.parametrize(
    "address",
    [
        "8.8.8.8",
        "1.1.1.1",
        "93.184.215.14",
        "100.63.255.255",  # just below CGNAT
        "100.128.0.1",  # just above
        "172.15.255.255",  # just below 172.16/12
        "172.32.0.1",  # just above
        "192.167.255.255",
        "192.169.0.1",
        "169.253.255.255",
        "223.255.255.254",
        "2606:4700:4700::1111",
        "2001:4860:4860::8888",
        "2a00:1450:4001:80b::200e",
        "::ffff:8.8.8.8",  # mapped public
        "2002:808:808::1",  # 6to4 of a public address
        "64:ff9b::8.8.8.8",  # NAT64 of a public address
        "2606:4700:4700::1111%eth0",
    ],
)
def test_public_addresses_allowed(address: str) -> None:
    assert check(address, NONE) is None


@pytest.mark.parametrize(
    ("allowed", "address"),
    [
        (["127.0.0.0/8"], "127.0.0.1"),
        (["127.0.0.1/32"], "127.0.0.1"),
        (["127.0.0.1"], "127.0.0.1"),
        (["10.0.0.0/8"], "10.20.30.40"),
        (["10.0.0.5/8"], "10.1.1.1"),  # host bits are tolerated (strict=False)
        (["192.168.0.0/16", "10.0.0.0/8"], "10.0.0.1"),
        (["100.64.0.0/10"], "100.100.0.1"),
        (["169.254.169.254/32"], "169.254.169.254"),
        (["::1/128"], "::1"),
        (["fd00::/8"], "fd00::1"),
        (["fe80::/10"], "fe80::1%eth0"),
        # An IPv4 exemption covers the IPv6 forms that reach the same host.
        (["127.0.0.0/8"], "::ffff:127.0.0.1"),
        (["10.0.0.0/8"], "::ffff:10.9.8.7"),
        (["127.0.0.0/8"], "2002:7f00:1::"),
        (["10.0.0.0/8"], "64:ff9b::10.1.2.3"),
        (["127.0.0.0/8"], "::127.0.0.1"),
    ],
)
def test_allowed_networks_exempt(allowed: list[str], address: str) -> None:
    assert check(address, parse_networks(allowed)) is None


@pytest.mark.parametrize(
    ("allowed", "address"),
    [
        (["127.0.0.0/8"], "::1"),  # exempting IPv4 loopback does not exempt IPv6 loopback
        (["::1/128"], "127.0.0.1"),
        (["::1/128"], "::ffff:127.0.0.1"),
        (["127.0.0.1/32"], "127.0.0.2"),
        (["10.0.0.0/16"], "10.1.0.1"),
        (["10.0.0.0/8"], "192.168.0.1"),
        (["10.0.0.0/8"], "::ffff:192.168.0.1"),
        (["fd00::/8"], "fc00::1"),
        (["::ffff:0:0/96"], "::ffff:10.0.0.1"),  # the host is judged, not its IPv6 wrapping
    ],
)
def test_allowed_networks_exempt_only_what_they_cover(allowed: list[str], address: str) -> None:
    assert check(address, parse_networks(allowed)) is not None


def test_parse_networks() -> None:
    assert parse_networks(["10.0.0.0/8", "::1", "192.168.1.7/24"]) == (
        ipaddress.ip_network("10.0.0.0/8"),
        ipaddress.ip_network("::1/128"),
        ipaddress.ip_network("192.168.1.0/24"),
    )
    assert parse_networks([]) == ()


@pytest.mark.parametrize("cidr", ["nope", "10.0.0.0/33", "300.0.0.0/8", ""])
def test_parse_networks_rejects_garbage(cidr: str) -> None:
    with pytest.raises(ValueError, match="does not appear to be an IPv4 or IPv6"):
        parse_networks([cidr])


@pytest.mark.parametrize("address", ["localhost", "example.com", "", "1.2.3", "::g"])
def test_check_needs_an_ip_address(address: str) -> None:
    with pytest.raises(ValueError, match="does not appear to be an IPv4 or IPv6 address"):
        check(address, NONE)


@pytest.mark.parametrize(
    ("address", "embedded"),
    [
        ("127.0.0.1", None),
        ("::ffff:1.2.3.4", "1.2.3.4"),
        ("2002:102:304::1", "1.2.3.4"),
        ("64:ff9b::1.2.3.4", "1.2.3.4"),
        ("64:ff9b:1::1.2.3.4", "1.2.3.4"),
        ("::1.2.3.4", "1.2.3.4"),
        ("2001:0:4136:e378:8000:63bf:3fff:fdd2", "192.0.2.45"),  # RFC 4380's example
        ("::1", None),
        ("::", None),
        ("2606:4700:4700::1111", None),
        ("fe80::1", None),
    ],
)
def test_embedded_ipv4(address: str, embedded: str | None) -> None:
    found = embedded_ipv4(ipaddress.ip_address(address))
    assert (None if found is None else str(found)) == embedded
