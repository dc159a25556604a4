"""No secret of a hook URL (userinfo, query values) reaches the log, the store, the admin
API, the metrics or the live stream, whatever the hook does: refuse for good, fail until the
retry window closes, answer with something aiohttp cannot parse (whose error names the URL),
or echo the URL it was called at. A real `efd serve` (with a sender process), real receivers."""

from __future__ import annotations

import asyncio
import contextlib
import json
import signal
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from aiohttp import web

from tests.conftest import (
    DaemonProcess,
    eventually,
    free_port,
    post,
    settings_dict,
    sql,
    write_toml,
)

pytestmark = pytest.mark.slow

TOKEN = "admin-token-for-the-redaction-test"
USER, PASSWORD = "hookuser-7x", "pa55-Secret-1"
KEY_1, KEY_2, KEY_3 = "Secret-Key-One", "Secret-Key-Two", "Secret-Token-Three"
SECRETS = (USER, PASSWORD, KEY_1, KEY_2, KEY_3)


async def start_receiver() -> tuple[web.AppRunner, int, list[str]]:
    """Refuses api_key=KEY_1 for good (404), asks for a retry otherwise (500); both answers
    echo the path and query they were sent to, as many error pages do."""
    called: list[str] = []

    async def answer(request: web.Request) -> web.Response:
        await request.read()
        called.append(request.query.get("api_key", ""))
        status = 404 if request.query.get("api_key") == KEY_1 else 500
        return web.Response(status=status, text=f"nothing for {request.path_qs}")

    app = web.Application()
    app.router.add_post("/in", answer)
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    return runner, runner.addresses[0][1], called


async def start_garbled() -> asyncio.Server:
    """Answers with a header line efd refuses, echoing the URL it was called at: the
    protocol error quotes the line."""

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        with contextlib.suppress(ConnectionError, asyncio.IncompleteReadError):
            target = (await reader.readuntil(b"\r\n\r\n")).split(b" ")[1]
            writer.write(
                b"HTTP/1.1 200 OK\r\nBad Header\x01: %s\r\nContent-Length: 2\r\n\r\nok" % target
            )
            await writer.drain()
        writer.close()

    return await asyncio.start_server(handle, "127.0.0.1", 0)


@contextlib.asynccontextmanager
async def stream(port: int) -> AsyncIterator[list[str]]:
    """GET /admin/stream's text, as it arrives, until the block ends."""
    received: list[str] = []
    opened = asyncio.Event()

    async def read() -> None:
        async with (
            aiohttp.ClientSession() as session,
            session.get(
                f"http://127.0.0.1:{port}/admin/stream",
                headers={"Authorization": f"Bearer {TOKEN}"},
            ) as response,
        ):
            assert response.status == 200
            opened.set()
            async for chunk in response.content.iter_any():
                received.append(chunk.decode())

    task = asyncio.create_task(read())
    await asyncio.wait_for(opened.wait(), timeout=30)
    try:
        yield received
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task


async def get(port: int, path: str) -> str:
    async with (
        aiohttp.ClientSession() as session,
        session.get(
            f"http://127.0.0.1:{port}{path}", headers={"Authorization": f"Bearer {TOKEN}"}
        ) as response,
    ):
        assert response.status == 200, (path, await response.text())
        return await response.text()


def found(text: str) -> list[str]:
    return [secret for secret in SECRETS if secret in text]


async def test_no_secret_of_a_hook_url_is_logged_stored_or_shown(
    tmp_path: Path, db_url: str
) -> None:
    receiver, port, called = await start_receiver()
    garbled = await start_garbled()
    garbled_port = garbled.sockets[0].getsockname()[1]
    base = f"http://{USER}:{PASSWORD}@127.0.0.1:{port}/in"
    refusing, retrying = f"{base}?api_key={KEY_1}", f"{base}?api_key={KEY_2}"
    unparsable = f"http://127.0.0.1:{garbled_port}/in?token={KEY_3}"
    daemon_port = free_port()
    settings: dict[str, Any] = settings_dict(
        db_url,
        delivery={
            "retry_window_seconds": 3,
            "circuit_failures": 1,  # one message: its first failure opens a circuit
            "sender_processes": 1,
        },
    )
    settings["server"].update(port=daemon_port, admin_token=TOKEN)
    settings["sources"][0]["destinations"] = ["refused", "expiring"]
    settings["destinations"] = [
        {"name": "refused", "hooks": [{"url": refusing}]},
        # Two hooks that differ only in their query value: one refuses, the other retries.
        {"name": "expiring", "hooks": [{"url": u} for u in (refusing, retrying, unparsable)]},
    ]
    config_path = write_toml(tmp_path / "efd.toml", settings)
    daemon = DaemonProcess(config_path, daemon_port, tmp_path / "efd.log").start()
    answers = []
    try:
        async with stream(daemon_port) as events:
            status, _ = await post(
                daemon_port, "/v1/track", {"userId": "u", "event": "E", "messageId": "m-1"}
            )
            assert status == 200
            assert daemon.proc is not None
            daemon.proc.send_signal(signal.SIGHUP)  # a reload logs too
            await eventually(
                lambda: (
                    sql(db_url, "SELECT destination, status FROM deliveries ORDER BY id")
                    == [("refused", "failed"), ("expiring", "expired")]
                ),
                timeout=60,
            )
            for path in (
                "/admin/messages/web/m-1",
                "/admin/deliveries",
                "/admin/destinations",
                "/metrics",
            ):
                answers.append(await get(daemon_port, path))
            await eventually(lambda: "event: attempt" in "".join(events))
        streamed = "".join(events)
    finally:
        daemon.terminate()
        await receiver.cleanup()
        garbled.close()
    log = daemon.log()
    stored = repr(sql(db_url, "SELECT * FROM deliveries")) + repr(
        sql(db_url, "SELECT * FROM attempts")
    )

    assert found(log) == [], log
    assert found(stored) == [], stored
    assert [found(answer) for answer in answers] == [[]] * len(answers), answers
    assert found(streamed) == [], streamed

    # What was hidden is still told apart: the retrying hook kept being tried after its
    # sibling, which reads alike but for " #2", had failed for good.
    label = f"http://***@127.0.0.1:{port}/in?api_key=***"
    failed = sql(db_url, "SELECT destination, failed_hooks FROM deliveries ORDER BY id")
    assert [(d, json.loads(f)) for d, f in failed] == [("refused", [label]), ("expiring", [label])]
    assert called.count(KEY_1) == 2  # once for each destination
    assert called.count(KEY_2) >= 2
    hooks = {row[0] for row in sql(db_url, "SELECT DISTINCT hook_url FROM attempts")}
    assert hooks == {label, f"{label} #2", f"http://127.0.0.1:{garbled_port}/in?token=***"}
    assert f"message m-1 to refused failed for good: {label}: HTTP 404" in log
    assert "message m-1 to expiring expired" in log or "deliveries to expiring expired" in log
    assert f"circuit of {label} #2 (expiring) opened" in log
    errors = sql(db_url, "SELECT error FROM attempts WHERE error_class = 'protocol'")
    assert errors
    assert all("malformed header line b'Bad Header\\x01: /in?token=***'" in e for (e,) in errors)
    heads = sql(db_url, "SELECT response_head FROM attempts WHERE status_code = 404")
    assert heads == [("nothing for /in?api_key=***",)] * 2
