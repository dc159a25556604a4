"""efd.server's rules that need no socket: whom a connection counts against, and the
[server] keys that bound connections."""

from __future__ import annotations

import pytest

from efd import config
from efd.server import address_key


@pytest.mark.parametrize(
    ("peer", "key"),
    [
        (("203.0.113.7", 50000), "203.0.113.7"),
        (("2001:db8:1:2:aaaa::1", 50000, 0, 0), "2001:db8:1:2::/64"),
        (("2001:db8:1:2:bbbb::9", 50000, 0, 0), "2001:db8:1:2::/64"),
        (("2001:db8:1:3::1", 50000, 0, 0), "2001:db8:1:3::/64"),
        (("::ffff:203.0.113.7", 50000, 0, 0), "203.0.113.7"),
        (("fe80::1%lo", 50000, 0, 1), "fe80::/64"),
        ("/run/efd.sock", None),
        (None, None),
    ],
)
def test_connections_count_against_an_ipv4_address_or_an_ipv6_64(peer, key):
    assert address_key(peer) == key


def _server(**server: object) -> config.Settings:
    return config.load(None, server=server)


def test_the_per_address_bound_may_not_exceed_max_connections():
    assert _server(max_connections=10, max_connections_per_address=10)
    with pytest.raises(config.ConfigError) as error:
        _server(max_connections=10, max_connections_per_address=11)
    assert error.value.problems == [
        "server.max_connections_per_address: may not exceed server.max_connections"
    ]
    with pytest.raises(config.ConfigError) as error:
        _server(max_connections_per_address=0)
    assert [p.split(":")[0] for p in error.value.problems] == ["server.max_connections_per_address"]
