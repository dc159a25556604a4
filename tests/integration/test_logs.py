"""What a real `efd serve` writes to its log when clients and receivers are hostile: each
record one line (text or JSON), nothing a terminal would act on."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest
from aiohttp import web

from tests.conftest import (
    DaemonProcess,
    eventually,
    free_port,
    post,
    settings_dict,
    write_toml,
)

pytestmark = pytest.mark.slow

FORGED_LINE = "2026-01-01 00:00:00,000 CRITICAL efd.dispatcher: forged"
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
    port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
    return runner, f"http://127.0.0.1:{port}/hook"


@pytest.mark.parametrize("fmt", ["text", "json"])
async def test_hostile_ids_and_answers_stay_inside_one_record(tmp_path: Path, fmt: str):
    runner, hook = await hostile_receiver()
    daemon = start_daemon(tmp_path, [hook], logging={"format": fmt})
    try:
        message_id = f"m-1{HOSTILE}"
        status, _ = await post(
            daemon.port, "/v1/track", {"userId": "u", "event": "E", "messageId": message_id}
        )
        # Refused at ingestion or accepted: either way its attempts are logged, the
        # accepted message's with its messageId.
        await eventually(lambda: daemon.log().count("busy") >= 2)
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
        if status == 200:
            assert any(message_id in m for m in messages)
        return
    for line in lines:
        # A record, or (under an error's record) an indented line of its traceback.
        assert RECORD_START.match(line) or line.startswith("    "), line
        assert not line.startswith(FORGED_LINE)
    escaped = "\\r\\n" + FORGED_LINE + "\\x1b[31m red\\x1b[0m\\x85\\u2028"
    attempts = [line for line in lines if " WARNING efd.dispatcher: " in line]
    assert attempts
    assert all(f"busy{escaped}" in line for line in attempts), attempts
    if status == 200:
        assert all(f"message m-1{escaped} to hooks" in line for line in attempts), attempts
