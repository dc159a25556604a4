"""Client certificates (mTLS): a real TLS receiver on 127.0.0.1 that requires one, from a CA
made here; the receiver's own certificate trusted through delivery.ca_file. SQLite and
PostgreSQL."""

from __future__ import annotations

import asyncio
import ssl
from pathlib import Path
from typing import Any

import pytest
import trustme
from aiohttp import web

from efd import config
from tests.conftest import DaemonFactory, ReceiverFactory, eventually, post, settings_dict, sql

TRACK = {"userId": "u-1", "event": "Order Completed"}


class Authority:
    """A test CA: it signs the receiver's certificate and efd's client certificates, and
    the receiver accepts only clients it signed."""

    def __init__(self, tmp_path: Path) -> None:
        self.ca = trustme.CA()
        self.dir = tmp_path
        self.ca_file = tmp_path / "ca.pem"
        self.ca.cert_pem.write_to_path(str(self.ca_file))

    def server_context(self) -> ssl.SSLContext:
        context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
        self.ca.issue_cert("localhost").configure_cert(context)
        self.ca.configure_trust(context)
        context.verify_mode = ssl.CERT_REQUIRED
        return context

    def client_files(self, name: str) -> dict[str, str]:
        """A client certificate for `name` written to client.crt and client.key (the same
        paths each time: a renewal)."""
        issued = self.ca.issue_cert(name)
        cert, key = self.dir / "client.crt", self.dir / "client.key"
        issued.cert_chain_pems[0].write_to_path(str(cert))
        issued.private_key_pem.write_to_path(str(key))
        return {"client_cert": str(cert), "client_key": str(key)}


class Presented:
    """A receiver behaviour recording the client certificate name of each request, and
    holding the answer to request n until `release[n]` is set, when there is one."""

    def __init__(self) -> None:
        self.names: list[str | None] = []
        self.release: dict[int, asyncio.Event] = {}

    async def __call__(self, request: web.Request, n: int) -> web.StreamResponse:
        peer = request.transport.get_extra_info("peercert") if request.transport else None
        names = [value for kind, value in (peer or {}).get("subjectAltName", ()) if kind == "DNS"]
        self.names.append(names[0] if names else None)
        if n in self.release:
            await self.release[n].wait()
        return web.json_response({"ok": True})


@pytest.fixture
def authority(tmp_path: Path) -> Authority:
    return Authority(tmp_path)


def mtls_settings(db_url: str, url: str, authority: Authority, **hook: Any) -> dict[str, Any]:
    settings = settings_dict(db_url, [url], delivery={"ca_file": str(authority.ca_file)})
    settings["destinations"][0]["hooks"][0].update(hook)
    return settings


def statuses(db_url: str) -> list[tuple[str, int]]:
    return sql(db_url, "SELECT status, attempts FROM deliveries ORDER BY id")


async def test_the_hook_gets_the_certificate_and_delivery_succeeds(
    db_url: str,
    receiver_factory: ReceiverFactory,
    daemon_factory: DaemonFactory,
    authority: Authority,
) -> None:
    presented = Presented()
    receiver = await receiver_factory(presented, ssl_context=authority.server_context())
    files = authority.client_files("efd-client.example")
    daemon = await daemon_factory(mtls_settings(db_url, receiver.url, authority, **files))
    assert (await post(daemon.port, "/v1/track", TRACK))[0] == 200
    await receiver.wait_for(1)
    await eventually(lambda: statuses(db_url) == [("delivered", 1)])
    assert presented.names == ["efd-client.example"]


async def test_without_a_certificate_the_receiver_refuses_the_connection(
    db_url: str,
    receiver_factory: ReceiverFactory,
    daemon_factory: DaemonFactory,
    authority: Authority,
) -> None:
    receiver = await receiver_factory(ssl_context=authority.server_context())
    daemon = await daemon_factory(mtls_settings(db_url, receiver.url, authority))
    await post(daemon.port, "/v1/track", TRACK)
    rows = await eventually(
        lambda: sql(db_url, "SELECT outcome, status_code, error_class, error FROM attempts")
    )
    outcome, status_code, error_class, error = rows[0]
    # The handshake ends in the receiver's alert, or its reset of the connection.
    assert (outcome, status_code) == ("retry", None), rows[0]
    assert error_class in ("connect", "reset"), rows[0]
    assert error
    assert receiver.received == []  # no request reached the receiver's application


@pytest.mark.parametrize("sender_processes", [0, 1])
async def test_a_reload_presents_the_renewed_certificate_and_keeps_rounds_in_flight(
    db_url: str,
    receiver_factory: ReceiverFactory,
    daemon_factory: DaemonFactory,
    authority: Authority,
    sender_processes: int,
) -> None:
    presented = Presented()
    presented.release[1] = asyncio.Event()  # the first request waits through the reload
    receiver = await receiver_factory(presented, ssl_context=authority.server_context())
    settings = mtls_settings(
        db_url, receiver.url, authority, **authority.client_files("before.example")
    )
    settings["delivery"]["sender_processes"] = sender_processes
    daemon = await daemon_factory(settings)
    await post(daemon.port, "/v1/track", {**TRACK, "messageId": "first"})
    await receiver.wait_for(1)

    authority.client_files("renewed.example")  # new files at the same paths
    assert await daemon.reload(config.load(None, **settings)) == []
    await post(daemon.port, "/v1/track", {**TRACK, "messageId": "second"})
    await receiver.wait_for(2)
    presented.release[1].set()

    await eventually(lambda: statuses(db_url) == [("delivered", 1), ("delivered", 1)])
    assert presented.names == ["before.example", "renewed.example"]
    assert [r.json()["messageId"] for r in receiver.received] == ["first", "second"]
