"""Connecting to a name with several addresses (efd/delivery/connect.py, the staggered race,
and efd/delivery/addresses.py): real sockets on 127.0.0.x and ::1, names resolved by the
client's resolver hook, on the default asyncio loop and on uvloop."""

from __future__ import annotations

import asyncio
import pathlib
import socket
import ssl
import time
from collections.abc import Sequence
from typing import Any, Self

import pytest
import trustme

from efd.delivery import netguard, tls
from efd.delivery.addresses import AddressInfo
from efd.delivery.http1 import Answer, Client, RequestFailed
from tests.integration.test_http_client import OK, RUNNERS, Runner, Server, answer, client

NAME = "eyeballs.test"
LOOPBACKS = netguard.parse_networks(["127.0.0.0/8", "::1/128"])


def info(address: tuple[str, int]) -> AddressInfo:
    family = socket.AF_INET6 if ":" in address[0] else socket.AF_INET
    return (family, socket.SOCK_STREAM, socket.IPPROTO_TCP, "", address)


def resolving(*addresses: tuple[str, int], **options: Any) -> Client:
    """A client (`options` as `client` takes) to which NAME resolves to `addresses`, in that
    order, on any port."""
    infos = [info(address) for address in addresses]

    async def resolve(host: str, _port: int) -> Sequence[AddressInfo]:
        if host != NAME:
            raise socket.gaierror(socket.EAI_NONAME, "unknown name")
        return infos

    return client(resolver=resolve, **options)


class Blackhole:
    """A listening socket whose accept queue is full and never emptied: Linux drops the SYNs
    that arrive at it, as a host that silently drops packets does."""

    def __init__(self, host: str) -> None:
        family = socket.AF_INET6 if ":" in host else socket.AF_INET
        self.listener = socket.socket(family, socket.SOCK_STREAM)
        self.listener.bind((host, 0))
        self.listener.listen(0)  # room for one connection waiting to be accepted
        self.address: tuple[str, int] = self.listener.getsockname()[:2]
        self.filler = socket.create_connection(self.address, timeout=5)  # takes that room

    def connecting(self) -> int:
        """How many sockets on this host are still trying to connect here (SYN sent)."""
        if ":" in self.address[0]:
            table, packed = "tcp6", socket.inet_pton(socket.AF_INET6, self.address[0])
            # /proc prints an IPv6 address as four 32-bit words, each in host byte order.
            host = "".join(packed[i : i + 4][::-1].hex() for i in range(0, 16, 4))
        else:
            table, host = "tcp", socket.inet_aton(self.address[0])[::-1].hex()
        remote = f"{host}:{self.address[1]:04x}".upper()
        lines = pathlib.Path(f"/proc/net/{table}").read_text().splitlines()[1:]
        return sum(1 for line in lines if line.split()[2:4] == [remote, "02"])

    def close(self) -> None:
        self.filler.close()
        self.listener.close()


class Counter:
    """A listener that counts the connections made to it and answers none of them."""

    def __init__(self) -> None:
        self.connections = 0
        self.port = 0
        self._server: asyncio.Server | None = None
        self._held: list[asyncio.StreamWriter] = []

    async def start(self, host: str) -> Self:
        self._server = await asyncio.start_server(self._count, host, 0)
        self.port = self._server.sockets[0].getsockname()[1]
        return self

    async def _count(self, _reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.connections += 1
        self._held.append(writer)  # kept open, silent: a TLS handshake here never ends

    async def stop(self) -> None:
        for writer in self._held:
            writer.close()
        if self._server is not None:
            self._server.close()


class Talker(Counter):
    """A listener that greets each connection in plain text and closes it: a TLS client
    reads that as a broken handshake."""

    async def _count(self, _reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.connections += 1
        writer.write(b"HTTP/1.1 400 Bad Request\r\nConnection: close\r\n\r\n")
        await writer.drain()
        writer.close()


async def settled(count: Blackhole) -> int:
    """How many attempts at the blackhole are still pending, once they had time to go."""
    for _ in range(100):
        if not count.connecting():
            return 0
        await asyncio.sleep(0.02)
    return count.connecting()


@RUNNERS
@pytest.mark.parametrize("dropping", ["127.0.0.2", "::1"], ids=["ipv4", "ipv6"])
def test_a_first_address_that_drops_packets_is_overtaken_by_the_next(
    run: Runner, dropping: str
) -> None:
    async def scenario() -> tuple[Answer | RequestFailed, float, Server, int]:
        blackhole = Blackhole(dropping)
        server = await Server(answer(OK)).start()
        http = resolving(blackhole.address, ("127.0.0.1", server.port), allowed=LOOPBACKS)
        started = time.monotonic()
        try:
            result: Answer | RequestFailed = await http.post(
                f"http://{NAME}:{server.port}/hook", b"{}", {}
            )
        except RequestFailed as failure:
            result = failure
        try:
            return result, time.monotonic() - started, server, await settled(blackhole)
        finally:
            await http.close()
            await server.stop()
            blackhole.close()

    result, took, server, pending = run(scenario())
    assert isinstance(result, Answer), result  # not a timeout at the first address
    assert result.status == 200
    assert (server.connections, len(server.requests)) == (1, 1)
    assert pending == 0  # the attempt at the first address was cancelled, its socket closed
    assert took < 3.0  # well within the 5 s deadline


def _tls_contexts(tmp_path: pathlib.Path) -> tuple[ssl.SSLContext, str]:
    authority = trustme.CA()
    ca_file = tmp_path / "ca.pem"
    authority.cert_pem.write_to_path(str(ca_file))
    server_context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    authority.issue_cert(NAME).configure_cert(server_context)
    return server_context, str(ca_file)


async def _tls_server(context: ssl.SSLContext) -> Server:
    server = Server(answer(OK))
    server._server = await asyncio.start_server(server._serve, "127.0.0.1", 0, ssl=context)
    server.port = server._server.sockets[0].getsockname()[1]
    return server


@RUNNERS
def test_an_address_whose_tls_handshake_never_ends_is_overtaken_by_the_next(
    run: Runner, tmp_path: pathlib.Path
) -> None:
    server_context, ca_file = _tls_contexts(tmp_path)

    async def scenario() -> tuple[Answer | RequestFailed, Counter, Server]:
        silent = await Counter().start("127.0.0.2")
        server = await _tls_server(server_context)
        http = resolving(
            ("127.0.0.2", silent.port), ("127.0.0.1", server.port), tls=tls.verifying(ca_file)
        )
        try:
            return await http.post(f"https://{NAME}:{server.port}/hook", b"{}", {}), silent, server
        except RequestFailed as failure:
            return failure, silent, server
        finally:
            await http.close()
            await server.stop()
            await silent.stop()

    result, silent, server = run(scenario())
    assert isinstance(result, Answer), result
    assert result.status == 200
    assert silent.connections == 1  # its TCP handshake went through; TLS never answered
    assert len(server.requests) == 1


@RUNNERS
def test_a_tls_handshake_that_fails_moves_on_to_the_next_address(
    run: Runner, tmp_path: pathlib.Path
) -> None:
    server_context, ca_file = _tls_contexts(tmp_path)

    async def scenario() -> tuple[Answer | RequestFailed, Talker, Server]:
        plain = await Talker().start("127.0.0.1")
        server = await _tls_server(server_context)
        http = resolving(
            ("127.0.0.1", plain.port), ("127.0.0.1", server.port), tls=tls.verifying(ca_file)
        )
        try:
            return await http.post(f"https://{NAME}:{server.port}/hook", b"{}", {}), plain, server
        except RequestFailed as failure:
            return failure, plain, server
        finally:
            await http.close()
            await server.stop()
            await plain.stop()

    result, plain, server = run(scenario())
    assert isinstance(result, Answer), result
    assert plain.connections == 1
    assert len(server.requests) == 1


@RUNNERS
def test_a_rejected_certificate_ends_the_race(run: Runner, tmp_path: pathlib.Path) -> None:
    server_context, ca_file = _tls_contexts(tmp_path)
    stranger = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    trustme.CA().issue_cert(NAME).configure_cert(stranger)

    async def scenario() -> Answer | RequestFailed:
        untrusted = await _tls_server(stranger)
        server = await _tls_server(server_context)
        http = resolving(
            ("127.0.0.1", untrusted.port), ("127.0.0.1", server.port), tls=tls.verifying(ca_file)
        )
        try:
            return await http.post(f"https://{NAME}:{server.port}/hook", b"{}", {})
        except RequestFailed as failure:
            return failure
        finally:
            await http.close()
            await server.stop()
            await untrusted.stop()

    result = run(scenario())
    assert isinstance(result, RequestFailed)  # the trusted second address was not tried
    assert result.error_class == "tls"
    assert result.message.startswith("certificate rejected: ")


@RUNNERS
def test_a_refused_connection_starts_the_next_attempt_at_once(run: Runner) -> None:
    async def scenario() -> tuple[Answer | RequestFailed, Server]:
        closed = await Server(answer(OK)).start()
        await closed.stop()  # nothing listens on its port now
        server = await Server(answer(OK)).start()
        # An attempt delay past the deadline: only the refusal can start the second attempt.
        http = resolving(("127.0.0.1", closed.port), ("127.0.0.1", server.port), attempt_delay=60.0)
        try:
            return await http.post(f"http://{NAME}:{server.port}/hook", b"{}", {}), server
        except RequestFailed as failure:
            return failure, server
        finally:
            await http.close()
            await server.stop()

    result, server = run(scenario())
    assert isinstance(result, Answer), result
    assert len(server.requests) == 1


@RUNNERS
def test_every_address_failing_is_a_connect_error(run: Runner) -> None:
    async def scenario() -> RequestFailed:
        closed = [await Server(answer(OK)).start() for _ in range(2)]
        for server in closed:
            await server.stop()
        http = resolving(*[("127.0.0.1", server.port) for server in closed])
        try:
            await http.post(f"http://{NAME}:{closed[0].port}/hook", b"{}", {})
        except RequestFailed as failure:
            return failure
        finally:
            await http.close()
        raise AssertionError("no failure")

    assert run(scenario()).error_class == "connect"


# -- the address guard on every address ---------------------------------------------------


@RUNNERS
def test_the_guard_skips_a_refused_address_and_connects_to_an_allowed_one(run: Runner) -> None:
    async def scenario() -> tuple[Answer | RequestFailed, Counter, Server]:
        refused = await Counter().start("127.0.0.2")
        server = await Server(answer(OK)).start()
        http = resolving(
            ("127.0.0.2", refused.port),
            ("127.0.0.1", server.port),
            allowed=netguard.parse_networks(["127.0.0.1/32"]),
        )
        try:
            return await http.post(f"http://{NAME}:{server.port}/hook", b"{}", {}), refused, server
        except RequestFailed as failure:
            return failure, refused, server
        finally:
            await http.close()
            await server.stop()
            await refused.stop()

    result, refused, server = run(scenario())
    assert isinstance(result, Answer), result
    assert refused.connections == 0
    assert len(server.requests) == 1


@RUNNERS
def test_a_name_whose_every_address_is_refused_is_blocked(run: Runner) -> None:
    async def scenario() -> tuple[RequestFailed, Counter, Server]:
        refused = await Counter().start("127.0.0.2")
        server = await Server(answer(OK)).start()
        http = resolving(("127.0.0.2", refused.port), ("127.0.0.1", server.port), allowed=())
        try:
            await http.post(f"http://{NAME}:{server.port}/hook", b"{}", {})
        except RequestFailed as failure:
            return failure, refused, server
        finally:
            await http.close()
            await server.stop()
            await refused.stop()
        raise AssertionError("no failure")

    failure, refused, server = run(scenario())
    assert (failure.error_class, failure.message) == (
        "blocked",
        "efd address guard: loopback address 127.0.0.2 is not allowed",
    )
    assert refused.connections == server.connections == 0
