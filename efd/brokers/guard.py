"""The address guard for brokers: a broker's host is resolved and judged before any socket
opens, and only an address the guard allows (efd/delivery/netguard.py, `allowed_networks`) is
connected to, by the address itself, so a name that resolves elsewhere later (DNS rebinding)
changes nothing. TLS still checks the certificate against the URL's host."""

from __future__ import annotations

import asyncio
import socket
import ssl
from collections.abc import Awaitable, Callable, Coroutine, Sequence
from typing import Any

from efd.brokers.failures import BLOCKED, CONNECT, DNS, TLS, PublishFailed
from efd.brokers.targets import Broker
from efd.delivery import addresses, connect, netguard
from efd.delivery.addresses import AddressInfo

GUARD_TAG = "efd address guard"
# What a name and port resolve to, as getaddrinfo answers for a stream socket.
Resolver = Callable[[str, int], Awaitable[Sequence[AddressInfo]]]


async def allowed_addresses(
    broker: Broker, allowed: Sequence[netguard.IPNetwork], resolver: Resolver | None = None
) -> tuple[AddressInfo, ...]:
    """The broker's addresses the guard allows, in the order they are tried (the address
    families taking turns, efd/delivery/addresses.py); PublishFailed `dns` when the name has
    none, `blocked` when the guard refuses every one."""
    try:
        if resolver is not None:
            infos = list(await resolver(broker.host, broker.port))
        else:
            loop = asyncio.get_running_loop()
            infos = await loop.getaddrinfo(
                broker.host, broker.port, type=socket.SOCK_STREAM, flags=socket.AI_ADDRCONFIG
            )
    except OSError as error:
        raise PublishFailed(DNS, f"{broker.host}: {error.strerror or error}") from None
    if not infos:
        raise PublishFailed(DNS, f"no address for {broker.host}")
    plan = addresses.plan(infos, allowed)
    if not plan.addresses:
        raise PublishFailed(BLOCKED, f"{GUARD_TAG}: {plan.refused} is not allowed")
    return plan.addresses


def _final(error: Exception) -> bool:
    """A refused certificate is refused at every address."""
    return isinstance(error, PublishFailed) and error.error_class == TLS


async def open_stream(
    broker: Broker,
    infos: Sequence[AddressInfo],
    context: ssl.SSLContext | None,
) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
    """A stream to the first of `infos` to answer (the staggered race of
    efd/delivery/connect.py), the TLS handshake done with `context` against the broker's
    host name."""

    def attempt(
        info: AddressInfo,
    ) -> Callable[[], Coroutine[Any, Any, tuple[asyncio.StreamReader, asyncio.StreamWriter]]]:
        async def open_one() -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
            family, _type, _proto, _name, address = info
            try:
                return await asyncio.open_connection(
                    host=address[0],
                    port=address[1],
                    family=family,
                    ssl=context,
                    server_hostname=broker.host.rstrip(".") if context is not None else None,
                )
            except ssl.SSLCertVerificationError as error:
                raise PublishFailed(TLS, f"certificate rejected: {error.verify_message}") from None
            except ssl.SSLError as error:
                raise PublishFailed(CONNECT, f"TLS handshake failed: {error.reason}") from None
            except OSError as error:
                raise PublishFailed(CONNECT, error.strerror or str(error)) from None

        return open_one

    def discard(stream: tuple[asyncio.StreamReader, asyncio.StreamWriter]) -> None:
        stream[1].close()

    return await connect.race(
        [attempt(info) for info in infos], connect.ATTEMPT_DELAY, discard=discard, final=_final
    )


def open_socket(broker: Broker, infos: Sequence[AddressInfo], timeout: float) -> socket.socket:
    """A blocking socket to the first of `infos` that accepts (for a client library that
    connects in a thread); OSError from the last address when none does."""
    last: OSError | None = None
    for family, type_, proto, _name, address in infos:
        sock = socket.socket(family, type_, proto)
        try:
            sock.settimeout(timeout)
            sock.connect(address)
        except OSError as error:
            sock.close()
            last = error
            continue
        return sock
    assert last is not None
    raise last
