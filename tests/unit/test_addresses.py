"""efd.delivery.addresses: which of a host's addresses are tried, and in which order (pure)."""

from __future__ import annotations

import socket

import pytest

from efd.delivery.addresses import AddressInfo, interleave, plan
from efd.delivery.netguard import parse_networks

PUBLIC4 = ("93.184.215.14", "93.184.215.15", "93.184.215.16")
PUBLIC6 = ("2606:2800:21f:cb07::1", "2606:2800:21f:cb07::2", "2606:2800:21f:cb07::3")


def info(address: str, port: int = 443) -> AddressInfo:
    if ":" in address:
        return (socket.AF_INET6, socket.SOCK_STREAM, socket.IPPROTO_TCP, "", (address, port, 0, 0))
    return (socket.AF_INET, socket.SOCK_STREAM, socket.IPPROTO_TCP, "", (address, port))


def hosts(infos: tuple[AddressInfo, ...]) -> list[str]:
    return [str(i[4][0]) for i in infos]


@pytest.mark.parametrize(
    ("given", "tried"),
    [
        ([], []),
        (["a1"], ["a1"]),
        (["a1", "a2", "a3"], ["a1", "a2", "a3"]),  # one family: the resolver's order
        (["a1", "a2", "b1", "b2"], ["a1", "b1", "a2", "b2"]),
        (["b1", "a1", "a2", "a3"], ["b1", "a1", "a2", "a3"]),  # the first address's family first
        (["a1", "a2", "a3", "b1"], ["a1", "b1", "a2", "a3"]),  # a family that runs out
        (["a1", "b1", "b2", "a2", "b3"], ["a1", "b1", "a2", "b2", "b3"]),
    ],
)
def test_families_take_turns_from_the_first_addresss_family(
    given: list[str], tried: list[str]
) -> None:
    named = {
        **{f"a{n}": address for n, address in enumerate(PUBLIC6, 1)},
        **{f"b{n}": address for n, address in enumerate(PUBLIC4, 1)},
    }
    names = {address: name for name, address in named.items()}
    ordered = interleave([info(named[name]) for name in given])
    assert [names[host] for host in hosts(ordered)] == tried


def test_the_plan_keeps_every_allowed_address_interleaved() -> None:
    infos = [info(PUBLIC4[0]), info(PUBLIC4[1]), info(PUBLIC6[0])]
    result = plan(infos, ())
    assert hosts(result.addresses) == [PUBLIC4[0], PUBLIC6[0], PUBLIC4[1]]
    assert result.refused is None


def test_the_guard_judges_every_address_and_the_first_refusal_is_kept() -> None:
    infos = [info("10.0.0.5"), info(PUBLIC4[0]), info("::1"), info("169.254.169.254")]
    result = plan(infos, ())
    assert hosts(result.addresses) == [PUBLIC4[0]]
    assert result.refused == "private address 10.0.0.5"


def test_the_guard_judges_an_address_behind_every_allowed_one() -> None:
    # A public first answer must not carry the private addresses after it through.
    infos = [info(PUBLIC4[0]), info("127.0.0.1"), info("::ffff:10.1.2.3")]
    result = plan(infos, ())
    assert hosts(result.addresses) == [PUBLIC4[0]]
    assert result.refused == "loopback address 127.0.0.1"


def test_allowed_networks_let_their_addresses_through() -> None:
    infos = [info("127.0.0.2"), info("127.0.0.3"), info("10.0.0.5")]
    result = plan(infos, parse_networks(["127.0.0.3/32"]))
    assert hosts(result.addresses) == ["127.0.0.3"]
    assert result.refused == "loopback address 127.0.0.2"


def test_every_address_refused_leaves_nothing_to_try() -> None:
    result = plan([info("127.0.0.1"), info("::1")], ())
    assert result.addresses == ()
    assert result.refused == "loopback address 127.0.0.1"


def test_an_address_given_twice_is_tried_once() -> None:
    infos = [info(PUBLIC4[0]), info(PUBLIC6[0]), info(PUBLIC4[0]), info(PUBLIC4[1])]
    assert hosts(plan(infos, ()).addresses) == [PUBLIC4[0], PUBLIC6[0], PUBLIC4[1]]


def test_the_same_address_on_another_port_is_another_address() -> None:
    infos = [info(PUBLIC4[0], 443), info(PUBLIC4[0], 8443)]
    assert [i[4] for i in plan(infos, ()).addresses] == [(PUBLIC4[0], 443), (PUBLIC4[0], 8443)]
