"""efd.http.server's rules that need no socket: whom a connection counts against, and the
[server] keys that bound connections."""

from __future__ import annotations

import pytest

from efd import config
from efd.daemon import fit_open_files, reserved_files
from efd.http.server import address_key


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
def test_connections_count_against_an_ipv4_address_or_an_ipv6_64(
    peer: object, key: str | None
) -> None:
    assert address_key(peer) == key


def _server(**server: object) -> config.Settings:
    return config.load(None, server=server)


def test_the_per_address_bound_may_not_exceed_max_connections() -> None:
    assert _server(max_connections=10, max_connections_per_address=10)
    with pytest.raises(config.ConfigError) as error:
        _server(max_connections=10, max_connections_per_address=11)
    assert error.value.problems == [
        "server.max_connections_per_address: may not exceed server.max_connections"
    ]
    with pytest.raises(config.ConfigError) as error:
        _server(max_connections_per_address=0)
    assert [p.split(":")[0] for p in error.value.problems] == ["server.max_connections_per_address"]


def test_the_open_files_kept_besides_connections_follow_the_configuration() -> None:
    sqlite = config.load(
        None,
        storage={"url": "sqlite:////tmp/efd.db"},
        delivery={"sender_processes": 0, "max_per_hook": 10},
        server={"parse_processes": 1},
        destinations=[
            {"name": "a", "hooks": [{"url": "https://a.example/1"}, {"url": "https://a.example/2"}]}
        ],
    )
    # base, 3 SQLite connections of 3 files, one parser's pipes, 2 hooks of 10 requests each
    assert reserved_files(sqlite, cpus=2) == 64 + 9 + 4 + 20
    postgresql = config.load(
        None,
        storage={"url": "postgresql://efd@db/efd", "pool_size": 5},
        delivery={"sender_processes": 2},
        server={"parse_processes": 1},
    )
    # base, the pool and its overflow with LISTEN and a spare, three children's pipes; the
    # sender processes hold the outbound sockets
    assert reserved_files(postgresql, cpus=2) == 64 + 12 + 12
    # Unset, the helpers follow the CPUs: one sender and one parser process, or on one CPU
    # none, and then the daemon holds the outbound sockets itself.
    default = config.load(
        None,
        storage={"url": "sqlite:////tmp/efd.db"},
        delivery={"max_per_hook": 10},
        destinations=[{"name": "a", "hooks": [{"url": "https://a.example/1"}]}],
    )
    assert reserved_files(default, cpus=2) == 64 + 9 + 8
    assert reserved_files(default, cpus=1) == 64 + 9 + 10


def test_an_open_file_limit_that_holds_everything_changes_nothing() -> None:
    settings = _server(max_connections=8)
    assert fit_open_files(settings, cpus=2) == 8
