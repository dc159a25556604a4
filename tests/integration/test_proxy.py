"""Delivery through an HTTP proxy: a real daemon, a real tinyproxy (with and without Basic
authentication) and real receivers on 127.0.0.1, plain HTTP and HTTPS (a test CA trusted
through delivery.ca_file). SQLite and PostgreSQL."""

from __future__ import annotations

import asyncio
import functools
import logging
import socket
import ssl
import time
from collections.abc import Awaitable, Callable, Coroutine, Iterator, Sequence
from pathlib import Path
from typing import Any

import pytest
import trustme
import uvloop
import yarl
from aiohttp import web

from efd.delivery import netguard, proxyrules, tls
from efd.delivery.http1 import Client, RequestFailed
from efd.delivery.outauth import ClientCredentials
from efd.delivery.tokens import TokenSource, token_client
from tests.conftest import (
    DaemonFactory,
    Receiver,
    ReceiverFactory,
    eventually,
    free_port,
    post,
    settings_dict,
    sql,
)
from tests.support.tinyproxy import PASSWORD, USER, ProxyFactory, Tinyproxy, installed

TRACK = {"userId": "u-1", "event": "Order Completed"}
# `localhost` is 127.0.0.1 and ::1: through a proxy every address of a receiver's name must be
# one the guard allows.
LOOPBACK = ["127.0.0.0/8", "::1/128"]


@pytest.fixture
def tinyproxy_factory(tmp_path: Path) -> Iterator[ProxyFactory]:
    if not installed():
        pytest.skip("tinyproxy is not installed (scripts/ensure-proxy installs it)")
    started: list[Tinyproxy] = []

    def make(connect_ports: Sequence[int], *, auth: bool = False) -> Tinyproxy:
        directory = tmp_path / f"tinyproxy-{len(started)}"
        directory.mkdir()
        proxy = Tinyproxy(free_port(), directory, auth)
        started.append(proxy)
        return proxy.start(connect_ports)

    yield make
    for proxy in started:
        proxy.stop()


@pytest.fixture
def authority(tmp_path: Path) -> tuple[trustme.CA, str]:
    ca = trustme.CA()
    ca_file = tmp_path / "ca.pem"
    ca.cert_pem.write_to_path(str(ca_file))
    return ca, str(ca_file)


async def https_receiver(receiver_factory: ReceiverFactory, ca: trustme.CA) -> Receiver:
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    ca.issue_cert("localhost").configure_cert(context)
    return await receiver_factory(ssl_context=context)


def port_of(receiver: Receiver) -> int:
    port = yarl.URL(receiver.url).port
    assert port is not None
    return port


def proxied(db_url: str, url: str, proxy: str, **delivery: Any) -> dict[str, Any]:
    return settings_dict(
        db_url, [url], delivery={"proxy": proxy, "allowed_networks": LOOPBACK, **delivery}
    )


def attempts(db_url: str) -> list[tuple[Any, ...]]:
    return sql(db_url, "SELECT outcome, status_code, error_class, error FROM attempts ORDER BY id")


def delivered_count(db_url: str, count: int) -> bool:
    rows = sql(db_url, "SELECT count(*) FROM deliveries WHERE status = 'delivered'")
    return int(rows[0][0]) == count


def delivered(db_url: str) -> bool:
    return sql(db_url, "SELECT status FROM deliveries") == [("delivered",)]


async def test_plain_http_goes_through_the_proxy_in_absolute_form_with_its_credentials(
    db_url: str,
    receiver_factory: ReceiverFactory,
    daemon_factory: DaemonFactory,
    tinyproxy_factory: ProxyFactory,
) -> None:
    receiver = await receiver_factory()
    proxy = tinyproxy_factory([], auth=True)
    daemon = await daemon_factory(proxied(db_url, receiver.url, proxy.url()))
    assert (await post(daemon.port, "/v1/track", TRACK))[0] == 200
    await receiver.wait_for(1)
    await eventually(lambda: delivered(db_url))
    assert proxy.requests() == [f"POST {receiver.url} HTTP/1.1"]
    # The proxy forwarded it (Via), and kept its own credentials to itself.
    headers = {name.lower(): value for name, value in receiver.received[0].headers.items()}
    assert "tinyproxy" in headers["via"]
    assert "proxy-authorization" not in headers


@pytest.mark.parametrize("sender_processes", [0, 1])
async def test_https_goes_through_connect_with_tls_to_the_receiver_end_to_end(
    db_url: str,
    receiver_factory: ReceiverFactory,
    daemon_factory: DaemonFactory,
    tinyproxy_factory: ProxyFactory,
    authority: tuple[trustme.CA, str],
    sender_processes: int,
) -> None:
    ca, ca_file = authority
    receiver = await https_receiver(receiver_factory, ca)
    proxy = tinyproxy_factory([port_of(receiver)], auth=True)
    settings = proxied(
        db_url, receiver.url, proxy.url(), ca_file=ca_file, sender_processes=sender_processes
    )
    daemon = await daemon_factory(settings)
    for n in (1, 2):
        assert (await post(daemon.port, "/v1/track", {**TRACK, "messageId": f"m{n}"}))[0] == 200
        await receiver.wait_for(n)
        # Answered and pooled before the next: the second goes on the same connection.
        await eventually(functools.partial(delivered_count, db_url, n))
    port = port_of(receiver)
    assert proxy.requests()[0] == f"CONNECT localhost:{port} HTTP/1.1"
    # The proxy saw a tunnel, never the request: no Via, and one tunnel for both (keep-alive).
    assert "via" not in {name.lower() for name in receiver.received[0].headers}
    assert proxy.requests() == [f"CONNECT localhost:{port} HTTP/1.1"]


async def test_the_receivers_certificate_is_checked_through_the_tunnel(
    db_url: str,
    receiver_factory: ReceiverFactory,
    daemon_factory: DaemonFactory,
    tinyproxy_factory: ProxyFactory,
    authority: tuple[trustme.CA, str],
) -> None:
    ca, _ = authority
    receiver = await https_receiver(receiver_factory, ca)
    proxy = tinyproxy_factory([port_of(receiver)])
    daemon = await daemon_factory(proxied(db_url, receiver.url, proxy.url()))  # CA not trusted
    await post(daemon.port, "/v1/track", TRACK)
    rows = await eventually(lambda: attempts(db_url))
    assert rows[0][:3] == ("fail", None, "tls"), rows
    assert "certificate" in rows[0][3]
    assert receiver.received == []


# tinyproxy answers 407 to a request without credentials and 401 to wrong ones; both are the
# proxy's, to CONNECT and in absolute form alike.
@pytest.mark.parametrize("scheme", ["http", "https"])
@pytest.mark.parametrize(
    ("credentials", "status"), [(None, 407), ("WRONG-secret", 401)], ids=["none", "wrong"]
)
async def test_a_proxy_refusing_the_credentials_is_the_proxys_and_the_receiver_is_untouched(
    db_url: str,
    receiver_factory: ReceiverFactory,
    daemon_factory: DaemonFactory,
    tinyproxy_factory: ProxyFactory,
    authority: tuple[trustme.CA, str],
    caplog: pytest.LogCaptureFixture,
    scheme: str,
    credentials: str | None,
    status: int,
) -> None:
    caplog.set_level(logging.DEBUG)
    ca, ca_file = authority
    receiver = await (
        https_receiver(receiver_factory, ca) if scheme == "https" else receiver_factory()
    )
    proxy = tinyproxy_factory([port_of(receiver)], auth=True)
    url = proxy.url(password=credentials) if credentials else f"http://127.0.0.1:{proxy.port}"
    settings = proxied(db_url, receiver.url, url, ca_file=ca_file, circuit_failures=1)
    daemon = await daemon_factory(settings)
    await post(daemon.port, "/v1/track", TRACK)
    rows = await eventually(lambda: (rows := attempts(db_url))[2:] and rows)
    for outcome, status_code, error_class, error in rows:
        assert (outcome, status_code, error_class) == ("retry", None, "proxy"), rows
        assert error.startswith(f"proxy 127.0.0.1:{proxy.port} answered {status} "), error
        if scheme == "https":
            assert error.endswith(f" to CONNECT localhost:{port_of(receiver)}"), error
    assert receiver.received == []
    # Three attempts of one message under circuit_failures = 1 in quick succession: the
    # receiver's circuit never opened, or the later ones would have waited for its probe.
    assert "circuit" not in caplog.text
    assert "WRONG-secret" not in caplog.text
    assert "WRONG-secret" not in str(rows)
    assert USER not in str(rows)


async def test_the_proxys_own_answer_for_a_receiver_it_cannot_reach_is_the_proxys(
    db_url: str, daemon_factory: DaemonFactory, tinyproxy_factory: ProxyFactory
) -> None:
    proxy = tinyproxy_factory([])
    down = f"http://127.0.0.1:{free_port()}/hook"  # nothing listens there
    daemon = await daemon_factory(proxied(db_url, down, proxy.url()))
    await post(daemon.port, "/v1/track", TRACK)
    rows = await eventually(lambda: attempts(db_url))
    outcome, status_code, error_class, error = rows[0]
    # tinyproxy's own 500, without the Via header it adds to the answers it forwards.
    assert (outcome, status_code, error_class) == ("retry", None, "proxy"), rows
    assert error == (
        f"proxy 127.0.0.1:{proxy.port} answered 500 Unable to connect itself "
        "(the answer has no Via header)"
    )


async def test_a_host_in_no_proxy_is_reached_directly(
    db_url: str, receiver_factory: ReceiverFactory, daemon_factory: DaemonFactory
) -> None:
    receiver = await receiver_factory()
    down = f"http://127.0.0.1:{free_port()}"  # nothing listens: only a direct POST succeeds
    settings = proxied(db_url, receiver.url, down, no_proxy=["127.0.0.0/8"])
    daemon = await daemon_factory(settings)
    await post(daemon.port, "/v1/track", TRACK)
    await receiver.wait_for(1)
    await eventually(lambda: delivered(db_url))
    assert "via" not in {name.lower() for name in receiver.received[0].headers}


async def test_a_proxy_that_is_down_is_the_proxys_failure(
    db_url: str, receiver_factory: ReceiverFactory, daemon_factory: DaemonFactory
) -> None:
    receiver = await receiver_factory()
    port = free_port()
    settings = proxied(db_url, receiver.url, f"http://{USER}:{PASSWORD}@127.0.0.1:{port}")
    daemon = await daemon_factory(settings)
    await post(daemon.port, "/v1/track", TRACK)
    rows = await eventually(lambda: attempts(db_url))
    outcome, status_code, error_class, error = rows[0]
    assert (outcome, status_code, error_class) == ("retry", None, "proxy"), rows
    assert error.startswith(f"proxy 127.0.0.1:{port}: cannot connect: "), error
    assert PASSWORD not in error
    assert receiver.received == []


@pytest.mark.parametrize("scheme", ["http", "https"])
async def test_the_guard_judges_the_receivers_name_before_the_proxy_is_asked(
    db_url: str,
    receiver_factory: ReceiverFactory,
    daemon_factory: DaemonFactory,
    tinyproxy_factory: ProxyFactory,
    authority: tuple[trustme.CA, str],
    scheme: str,
) -> None:
    ca, ca_file = authority
    receiver = await (
        https_receiver(receiver_factory, ca) if scheme == "https" else receiver_factory()
    )
    proxy = tinyproxy_factory([port_of(receiver)])
    # No network allowed: the receiver (localhost, 127.0.0.1) is refused before the proxy is
    # asked, while the proxy itself, on 127.0.0.1 too, is the operator's choice.
    settings = proxied(db_url, receiver.url, proxy.url(), ca_file=ca_file, allowed_networks=[])
    daemon = await daemon_factory(settings)
    await post(daemon.port, "/v1/track", TRACK)
    rows = await eventually(lambda: attempts(db_url))
    assert rows[0] == (
        "fail",
        None,
        "blocked",
        "efd address guard: loopback address 127.0.0.1 is not allowed",
    ), rows
    assert proxy.requests() == []
    assert receiver.received == []


# -- the client alone, on the default asyncio loop and on uvloop (the sender processes' loop)

Runner = Callable[[Coroutine[Any, Any, Any]], Any]
RUNNERS = pytest.mark.parametrize("run", [asyncio.run, uvloop.run], ids=["asyncio", "uvloop"])
OK = b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok"


def client(proxy: str, *, timeout: float = 5.0, ca_file: str | None = None) -> Client:
    egress = proxyrules.egress(proxy, [])
    return Client(
        timeout=timeout,
        allowed=netguard.parse_networks(LOOPBACK),
        tls=tls.verifying(ca_file),
        keep=512,
        limit=1 << 20,
        proxy=egress,
    )


async def tls_server(ca: trustme.CA, seen: list[bytes]) -> asyncio.Server:
    """An HTTPS receiver for `localhost` answering 200 to each request; heads in `seen`."""
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    ca.issue_cert("localhost").configure_cert(context)

    async def serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            while True:
                head = await reader.readuntil(b"\r\n\r\n")
                length = int(head.lower().split(b"content-length: ")[1].split(b"\r\n")[0])
                await reader.readexactly(length)
                seen.append(head)
                writer.write(OK)
                await writer.drain()
        except (asyncio.IncompleteReadError, ConnectionError, ssl.SSLError):
            pass
        finally:
            writer.close()

    return await asyncio.start_server(serve, "127.0.0.1", 0, ssl=context)


@RUNNERS
def test_the_client_tunnels_https_and_reuses_the_tunnel(
    run: Runner, tinyproxy_factory: ProxyFactory, authority: tuple[trustme.CA, str]
) -> None:
    ca, ca_file = authority

    async def scenario() -> tuple[list[int], int, list[bytes]]:
        seen: list[bytes] = []
        server = await tls_server(ca, seen)
        port = server.sockets[0].getsockname()[1]
        proxy = tinyproxy_factory([port], auth=True)
        http = client(proxy.url(), ca_file=ca_file)
        try:
            url = f"https://localhost:{port}/hook"
            answers = [await http.post(url, b"{}", {"X-N": str(n)}) for n in range(3)]
        finally:
            await http.close()
            server.close()
            # The TLS close and the server's readers end on the loop before it closes.
            await asyncio.sleep(0.2)
            await server.wait_closed()
        return [a.status for a in answers], len(proxy.requests()), seen

    statuses, tunnels, seen = run(scenario())
    assert statuses == [200, 200, 200]
    assert tunnels == 1
    # Inside the tunnel the request is origin-form, as to the receiver directly.
    assert [head.split(b"\r\n")[0] for head in seen] == [b"POST /hook HTTP/1.1"] * 3


async def fake_proxy(answer: bytes | None, *, close: bool = False) -> tuple[asyncio.Server, int]:
    """A proxy that reads a CONNECT and answers `answer` (nothing when None), then closes
    the connection when `close` or else keeps it open without a word."""

    async def serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            await reader.readuntil(b"\r\n\r\n")
            if answer is not None:
                writer.write(answer)
                await writer.drain()
            if not close:
                await reader.read()
        except (asyncio.IncompleteReadError, ConnectionError):
            pass
        finally:
            writer.close()

    server = await asyncio.start_server(serve, "127.0.0.1", 0)
    return server, server.sockets[0].getsockname()[1]


async def failure_through(
    answer: bytes | None, *, close: bool = False, timeout: float = 5.0
) -> tuple[RequestFailed, float, int]:
    server, port = await fake_proxy(answer, close=close)
    http = client(f"http://u:secret@127.0.0.1:{port}", timeout=timeout)
    started = time.monotonic()
    try:
        with pytest.raises(RequestFailed) as caught:
            await http.post("https://localhost:9/hook", b"{}", {})
    finally:
        await http.close()
        server.close()
    return caught.value, time.monotonic() - started, port


@RUNNERS
@pytest.mark.parametrize(
    ("answer", "close", "error_class", "message"),
    [
        (
            b"HTTP/1.1 502 Bad Gateway\r\nContent-Length: 0\r\n\r\n",
            False,
            "proxy",
            "proxy 127.0.0.1:{port} answered 502 Bad Gateway to CONNECT localhost:9",
        ),
        (
            b"HTTP/1.0 403 Forbidden\r\n\r\n",
            True,
            "proxy",
            "proxy 127.0.0.1:{port} answered 403 Forbidden to CONNECT localhost:9",
        ),
        (
            b"SSH-2.0-OpenSSH_9.2\r\n",
            False,
            "proxy",
            "proxy 127.0.0.1:{port} sent an answer that is not HTTP/1.x to CONNECT",
        ),
        (
            None,
            True,
            "proxy",
            "proxy 127.0.0.1:{port} closed the connection before answering CONNECT",
        ),
        (
            b"HTTP/1.1 200 Connection established\r\n\r\nhello",
            False,
            "proxy",
            "proxy 127.0.0.1:{port} sent bytes after its answer to CONNECT",
        ),
    ],
    ids=["502", "403", "not-http", "closed", "bytes-after"],
)
def test_what_the_proxy_answers_to_connect_is_the_proxys(
    run: Runner, answer: bytes | None, close: bool, error_class: str, message: str
) -> None:
    failure, _, port = run(failure_through(answer, close=close))
    assert (failure.error_class, failure.message) == (error_class, message.format(port=port))
    assert "secret" not in failure.message


@RUNNERS
def test_one_deadline_covers_the_proxy_and_connect(run: Runner) -> None:
    failure, elapsed, port = run(failure_through(None, timeout=0.5))
    assert failure.error_class == "timeout"
    assert (
        failure.message == f"no answer from proxy 127.0.0.1:{port} to CONNECT localhost:9 in 0.5 s"
    )
    assert 0.45 < elapsed < 1.5


async def test_the_token_client_goes_through_the_proxy(
    receiver_factory: ReceiverFactory, tinyproxy_factory: ProxyFactory
) -> None:
    async def endpoint(_request: web.Request, _n: int) -> web.StreamResponse:
        return web.json_response({"access_token": "at-1", "token_type": "Bearer"})

    receiver = await receiver_factory(endpoint)
    proxy = tinyproxy_factory([], auth=True)
    made = token_client(
        timeout=5.0,
        allowed=netguard.parse_networks(LOOPBACK),
        tls=tls.verifying(None),
        proxy=proxyrules.egress(proxy.url(), []),
    )
    token_url = receiver.url.replace("/hook", "/token")
    credentials = ClientCredentials(token_url, client_id="efd", client_secret="cs-SECRET")
    try:
        token = await TokenSource(credentials, made).token()
    finally:
        await made.close()
    assert token.header() == "Bearer at-1"
    assert proxy.requests() == [f"POST {token_url} HTTP/1.1"]


def resolving(*addresses: str) -> Callable[[str, int], Awaitable[list[tuple[Any, ...]]]]:
    """A resolver answering `addresses` for every name."""

    async def resolve(_host: str, port: int) -> list[tuple[Any, ...]]:
        return [(socket.AF_INET, socket.SOCK_STREAM, 6, "", (a, port)) for a in addresses]

    return resolve


async def connect_lines(
    resolver: Callable[[str, int], Awaitable[list[tuple[Any, ...]]]],
) -> tuple[RequestFailed, list[bytes]]:
    """What a POST to https://hooks.example/ through a proxy answering 403 to every CONNECT
    ends in, and the CONNECT lines the proxy read."""
    lines: list[bytes] = []

    async def serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        head = await reader.readuntil(b"\r\n\r\n")
        lines.append(head.split(b"\r\n")[0])
        writer.write(b"HTTP/1.1 403 Forbidden\r\nContent-Length: 0\r\n\r\n")
        await writer.drain()
        writer.close()

    server = await asyncio.start_server(serve, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    http = Client(
        timeout=5.0,
        allowed=(),
        tls=tls.verifying(None),
        keep=512,
        limit=1 << 20,
        resolver=resolver,
        proxy=proxyrules.egress(f"http://127.0.0.1:{port}", []),
    )
    try:
        with pytest.raises(RequestFailed) as caught:
            await http.post("https://hooks.example/hook", b"{}", {})
    finally:
        await http.close()
        server.close()
    return caught.value, lines


async def test_one_refused_address_of_the_receivers_name_refuses_it_through_a_proxy() -> None:
    # The proxy resolves the name itself and may pick either address.
    failure, lines = await connect_lines(resolving("93.184.216.34", "10.0.0.5"))
    assert (failure.error_class, failure.message) == (
        "blocked",
        "efd address guard: private address 10.0.0.5 is not allowed",
    )
    assert lines == []


async def test_connect_names_the_receiver_not_the_address_efd_judged() -> None:
    # No network allowed, yet the proxy on 127.0.0.1 is: it is the operator's choice.
    failure, lines = await connect_lines(resolving("93.184.216.34"))
    assert failure.error_class == "proxy"
    assert failure.message.endswith("answered 403 Forbidden to CONNECT hooks.example:443")
    assert lines == [b"CONNECT hooks.example:443 HTTP/1.1"]
