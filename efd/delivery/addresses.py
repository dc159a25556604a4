"""Which of a host's resolved addresses a delivery tries, and in which order (pure).

The sender races the addresses (Happy Eyeballs, efd/delivery/connect.py) in the order given
here: each one the address guard allows, once, with the address families alternating so
that a family whose every address is unreachable costs one attempt delay, not one per
address.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from efd.delivery import netguard

# As getaddrinfo answers: (family, type, proto, canonname, sockaddr).
AddressInfo = tuple[Any, ...]


@dataclass(frozen=True, slots=True)
class Plan:
    addresses: tuple[AddressInfo, ...]  # the ones to try, in order; the guard allows each
    refused: str | None  # why the guard refused the first address it refused, if any


def plan(infos: Sequence[AddressInfo], allowed: Sequence[netguard.IPNetwork]) -> Plan:
    """The addresses of `infos` to try: the guard judges every one, a repeated address is
    tried once, and the families are interleaved as `interleave` says."""
    kept: list[AddressInfo] = []
    seen: set[tuple[Any, Any]] = set()
    refused: str | None = None
    for info in infos:
        family, sockaddr = info[0], info[4]
        if (family, sockaddr) in seen:
            continue
        seen.add((family, sockaddr))
        reason = netguard.check(str(sockaddr[0]), allowed)
        if reason is not None:
            refused = refused or reason
            continue
        kept.append(info)
    return Plan(interleave(kept), refused)


def interleave(infos: Sequence[AddressInfo]) -> tuple[AddressInfo, ...]:
    """`infos` with their address families taking turns, one address each, starting with the
    first address's family; within a family the resolver's order is kept, and a family
    that runs out leaves the others to go on: A1 A2 A3 B1 -> A1 B1 A2 A3."""
    families: dict[Any, list[AddressInfo]] = {}
    for info in infos:
        families.setdefault(info[0], []).append(info)
    if len(families) < 2:
        return tuple(infos)
    ordered: list[AddressInfo] = []
    queues = list(families.values())
    for turn in range(max(len(queue) for queue in queues)):
        ordered.extend(queue[turn] for queue in queues if turn < len(queue))
    return tuple(ordered)
