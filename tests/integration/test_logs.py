"""What a real `efd serve` writes to its log when clients and receivers are hostile: each
record one line (text or JSON), nothing a terminal would act on, and malformed HTTP in one
quiet line rather than an error with a traceback."""

from __future__ import annotations

import asyncio
import json
import re
from pathlib import Path
from typing import Any

import pytest
from aiohttp import web

from tests.conftest import (
    DaemonProcess,
    content_length,
    eventually,
    free_port,
    post,
    settings_dict,
    write_toml,
)

pytestmark = pytest.mark.slow

FORGED_LINE = "2026-01-01 00:00:00,000 CRITICAL efd.delivery.dispatcher: forged"
HOSTILE = f"\r\n{FORGED_LINE}\x1b[31m red\x1b[0m\x85\u2028"
RECORD_START = re.compile(
    r"\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3} (DEBUG|INFO|WARNING|ERROR|CRITICAL) [\w.]+: "
)
# Anything but the line feed that ends each line: C0, DEL, C1, line separators.
RAW_CONTROL = re.compile("[\x00-\x09\x0b-\x1f\x7f-\x9f\u2028\u2029]")


def start_daemon(tmp_path: Path, hooks: list[str], **sections: Any) -> DaemonProcess:
    port = free_port()
    settings = settings_dict(f"sqlite:///{tmp_path / 'efd.db'}", hooks, **sections)
    settings["server"]["port"] = port
    return DaemonProcess(
        write_toml(tmp_path / "efd.toml", settings), port, tmp_path / "efd.log"
    ).start()


async def hostile_receiver() -> tuple[web.AppRunner, str]:
    """Answers every webhook 500 with a body that tries to forge a log line."""

    async def answer(request: web.Request) -> web.Response:
        await request.read()
        return web.Response(status=500, body=f"busy{HOSTILE}".encode())

    app = web.Application()
    app.router.add_post("/hook", answer)
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = runner.addresses[0][1]
    return runner, f"http://127.0.0.1:{port}/hook"


@pytest.mark.parametrize("fmt", ["text", "json"])
async def test_hostile_ids_and_answers_stay_inside_one_record(tmp_path: Path, fmt: str) -> None:
    runner, hook = await hostile_receiver()
    daemon = start_daemon(tmp_path, [hook], logging={"format": fmt})
    try:
        message_id = f"m-1{HOSTILE}"
        # The hostile messageId may be refused at ingestion; the plain one is delivered,
        # and the receiver's answer logged with each of its failed attempts.
        status, _ = await post(
            daemon.port, "/v1/track", {"userId": "u", "event": "E", "messageId": message_id}
        )
        plain, _ = await post(
            daemon.port, "/v1/track", {"userId": "u", "event": "E", "messageId": "m-2"}
        )
        assert plain == 200
        await eventually(lambda: daemon.log().count("busy") >= 2 + (status == 200))
    finally:
        daemon.terminate()
        await runner.cleanup()
    text = daemon.log()
    assert RAW_CONTROL.search(text) is None, [m.group() for m in RAW_CONTROL.finditer(text)]
    lines = text.splitlines()
    if fmt == "json":
        entries = [json.loads(line) for line in lines]
        messages = [entry["message"] for entry in entries]
        assert not any(entry["level"] == "CRITICAL" for entry in entries)
        assert any(f"busy{HOSTILE}" in m for m in messages), messages
        assert any("message m-2 to hooks" in m for m in messages)
        if status == 200:
            assert any(f"message {message_id} to hooks" in m for m in messages)
        return
    for line in lines:
        # A record, or (under an error's record) an indented line of its traceback.
        assert RECORD_START.match(line) or line.startswith("    "), line
        assert not line.startswith(FORGED_LINE)
    escaped = "\\r\\n" + FORGED_LINE + "\\x1b[31m red\\x1b[0m\\x85\\u2028"
    attempts = [line for line in lines if " WARNING efd.delivery.dispatcher: " in line]
    assert attempts
    assert all(f"busy{escaped}" in line for line in attempts), attempts
    assert any("message m-2 to hooks" in line for line in attempts)
    if status == 200:
        assert any(f"message m-1{escaped} to hooks" in line for line in attempts), attempts


# -- malformed HTTP ---------------------------------------------------------------------------

HEAD = b"Host: x\r\n"
TRACK_HEAD = (
    b"POST /v1/track HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
    b"Authorization: Basic d2tfdGVzdDo=\r\n"
)
HEALTHZ = b"GET /healthz HTTP/1.1\r\n" + HEAD + b"\r\n"
# name -> (a valid request sent first on the connection, or None; the malformed bytes)
MALFORMED: dict[str, tuple[bytes | None, bytes]] = {
    "an over-long URL": (None, b"GET /" + b"a" * 20000 + b" HTTP/1.1\r\n" + HEAD + b"\r\n"),
    "an over-long header": (None, b"GET /healthz HTTP/1.1\r\nX-A: " + b"a" * 20000 + b"\r\n\r\n"),
    "200 headers": (
        None,
        b"GET /healthz HTTP/1.1\r\n" + b"".join(b"X-%d: y\r\n" % i for i in range(200)) + b"\r\n",
    ),
    "a NUL in the method": (HEALTHZ, b"G\x00T /healthz HTTP/1.1\r\n" + HEAD + b"\r\n"),
    "HTTP/9.9": (None, b"GET /healthz HTTP/9.9\r\n" + HEAD + b"\r\n"),
    "chunked with Content-Length": (
        None,
        TRACK_HEAD + b"Content-Length: 5\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\n",
    ),
    "a bad chunk": (None, TRACK_HEAD + b"Transfer-Encoding: chunked\r\n\r\nzz\r\n{}\r\n0\r\n\r\n"),
    "a second Content-Length": (
        None,
        TRACK_HEAD + b"Content-Length: 2\r\nContent-Length: 3\r\n\r\n{}",
    ),
    "a folded header": (None, b"GET /healthz HTTP/1.1\r\nX-A: a\r\n b\r\n\r\n"),
}


async def exchange(port: int, first: bytes | None, malformed: bytes) -> bytes:
    """Send `first` (and read its answer), then the malformed bytes; what the server sends
    back before it closes the connection."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    try:
        if first is not None:
            writer.write(first)
            head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), timeout=30)
            length = content_length(head)
            await reader.readexactly(length)
        writer.write(malformed)
        return await asyncio.wait_for(reader.read(), timeout=30)
    finally:
        writer.close()


async def test_malformed_http_is_one_quiet_line_each(tmp_path: Path) -> None:
    daemon = start_daemon(tmp_path, ["http://127.0.0.1:9/unused"])
    try:
        for name, (first, malformed) in MALFORMED.items():
            answer = await exchange(daemon.port, first, malformed)
            assert re.match(rb"HTTP/1\.[01] 4\d\d ", answer), (name, answer)
        # Still serving.
        healthz = await exchange(
            daemon.port, None, HEALTHZ.replace(HEAD, HEAD + b"Connection: close\r\n")
        )
        assert healthz.startswith(b"HTTP/1.1 200"), healthz
    finally:
        daemon.terminate()
    lines = daemon.log().splitlines()
    refused = [line for line in lines if "malformed request from 127.0.0.1 refused" in line]
    assert len(refused) == len(MALFORMED), lines
    assert all(" INFO aiohttp.server: " in line for line in refused)
    assert all(RECORD_START.match(line) for line in lines), lines
    assert not [line for line in lines if re.search(r" (WARNING|ERROR|CRITICAL) ", line)]
