"""Delivery through an HTTP proxy: a real daemon, a real tinyproxy (with and without Basic
authentication) and real receivers on 127.0.0.1, plain HTTP and HTTPS (a test CA trusted
through delivery.ca_file). SQLite and PostgreSQL."""

from __future__ import annotations

import asyncio
import functools
import logging
from collections.abc import AsyncIterator, Sequence
from pathlib import Path
from typing import Any

import pytest
import trustme
import yarl

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
async def tinyproxy_factory(tmp_path: Path) -> AsyncIterator[ProxyFactory]:
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
        await asyncio.to_thread(proxy.stop)


@pytest.fixture
def authority(tmp_path: Path) -> tuple[trustme.CA, str]:
    ca = trustme.CA()
    ca_file = tmp_path / "ca.pem"
    ca.cert_pem.write_to_path(str(ca_file))
    return ca, str(ca_file)


async def https_receiver(receiver_factory: ReceiverFactory, ca: trustme.CA) -> Receiver:
    import ssl

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


async def test_https_goes_through_connect_with_tls_to_the_receiver_end_to_end(
    db_url: str,
    receiver_factory: ReceiverFactory,
    daemon_factory: DaemonFactory,
    tinyproxy_factory: ProxyFactory,
    authority: tuple[trustme.CA, str],
) -> None:
    ca, ca_file = authority
    receiver = await https_receiver(receiver_factory, ca)
    proxy = tinyproxy_factory([port_of(receiver)], auth=True)
    settings = proxied(db_url, receiver.url, proxy.url(), ca_file=ca_file)
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
