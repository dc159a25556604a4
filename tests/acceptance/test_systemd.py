"""efd under systemd, as systemd sees it: the notify socket (READY=1 once serving, STATUS=,
watchdog pings from the event loop, STOPPING=1) and `systemctl reload` (SIGHUP: a new
configuration applied without dropping a delivery in flight; a broken one refused). A real
`efd serve` process; the test binds the datagram socket systemd would."""

from __future__ import annotations

import asyncio
import re
import signal
import socket
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from aiohttp import web

from tests.conftest import (
    DaemonProcess,
    ReceiverFactory,
    basic,
    eventually,
    file_permissions_apply,
    free_port,
    post,
    settings_dict,
    sql,
    write_toml,
)

pytestmark = pytest.mark.slow


class NotifySocket:
    """What systemd listens on: one datagram per sd_notify call."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        self.sock.bind(str(path))
        self.sock.setblocking(False)
        self.messages: list[dict[str, str]] = []

    def drain(self) -> list[dict[str, str]]:
        while True:
            try:
                data = self.sock.recv(4096)
            except BlockingIOError:
                return self.messages
            fields = dict(line.split("=", 1) for line in data.decode().splitlines())
            fields["_at"] = str(time.monotonic())
            self.messages.append(fields)

    def seen(self, key: str, value: str | None = None) -> list[dict[str, str]]:
        return [m for m in self.drain() if key in m and (value is None or m[key] == value)]

    def close(self) -> None:
        self.sock.close()


@pytest.fixture
def notify(tmp_path: Path) -> Iterator[NotifySocket]:
    sock = NotifySocket(tmp_path / "notify.sock")
    yield sock
    sock.close()


def _healthz(port: int) -> int:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/healthz", timeout=5) as answer:
            return int(answer.status)
    except OSError:
        return 0


def _process(
    tmp_path: Path,
    settings: dict[str, Any],
    notify: NotifySocket,
    prefix: list[str] | None = None,
    **env: str,
) -> DaemonProcess:
    port = free_port()
    settings["server"] = {**settings["server"], "port": port}
    config = write_toml(tmp_path / "efd.toml", settings)
    return DaemonProcess(
        config,
        port,
        tmp_path / "efd.log",
        env={"NOTIFY_SOCKET": str(notify.path), **env},
        prefix=prefix,
    )


async def test_ready_status_watchdog_and_stopping(
    db_url: str, receiver_factory: ReceiverFactory, tmp_path: Path, notify: NotifySocket
) -> None:
    receiver = await receiver_factory()
    daemon = _process(
        tmp_path, settings_dict(db_url, [receiver.url]), notify, WATCHDOG_USEC="600000"
    )
    daemon.start()
    try:
        # READY=1 arrives only once the daemon answers /healthz (store migrated, reachable,
        # port listening): at the moment it is seen, /healthz already says 200.
        await eventually(lambda: notify.seen("READY", "1"), timeout=30)
        assert _healthz(daemon.port) == 200
        [ready] = notify.seen("READY", "1")
        assert ready["STATUS"] == "serving"
        # The watchdog: pinged again and again, from the event loop, every half
        # WATCHDOG_USEC.
        await eventually(lambda: len(notify.seen("WATCHDOG", "1")) >= 3, timeout=30)
        assert daemon.terminate() == 0
        assert notify.seen("STOPPING", "1")
    finally:
        daemon.ensure_stopped()


async def test_no_watchdog_pings_meant_for_another_process(
    sqlite_url: str, tmp_path: Path, notify: NotifySocket
) -> None:
    daemon = _process(
        tmp_path, settings_dict(sqlite_url), notify, WATCHDOG_USEC="200000", WATCHDOG_PID="1"
    )
    daemon.start()
    try:
        await eventually(lambda: notify.seen("READY", "1"), timeout=30)
        # A reload round-trip orders the check after at least one whole watchdog interval
        # without sleeping: the daemon answers RELOADING=1, then READY=1 again.
        assert daemon.proc is not None
        daemon.proc.send_signal(signal.SIGHUP)
        await eventually(lambda: len(notify.seen("READY", "1")) >= 2, timeout=30)
        assert notify.seen("WATCHDOG") == []
    finally:
        daemon.ensure_stopped()


@pytest.mark.parametrize("senders", [0, 1], ids=["in-process sender", "sender process"])
async def test_reload_adds_a_destination_and_keeps_a_delivery_in_flight(
    db_url: str,
    receiver_factory: ReceiverFactory,
    tmp_path: Path,
    notify: NotifySocket,
    senders: int,
) -> None:
    arrived = asyncio.Event()
    release = asyncio.Event()

    async def held(_request: web.Request, _n: int) -> web.StreamResponse:
        arrived.set()
        await release.wait()
        return web.Response(text="ok")

    slow, added = await receiver_factory(held), await receiver_factory()
    settings = settings_dict(db_url, [slow.url], delivery={"sender_processes": senders})
    daemon = _process(tmp_path, settings, notify)
    daemon.start()
    try:
        await eventually(lambda: notify.seen("READY", "1"), timeout=30)
        await post(
            daemon.port, "/v1/track", {"userId": "u", "event": "E", "messageId": "in-flight"}
        )
        await asyncio.wait_for(arrived.wait(), 30)  # its round is at the receiver now

        settings["destinations"].append(
            {"name": "added", "type": "webhooks", "hooks": [{"url": added.url}]}
        )
        settings["sources"][0]["destinations"] = ["hooks", "added"]
        write_toml(daemon.config_path, settings)
        assert daemon.proc is not None
        daemon.proc.send_signal(signal.SIGHUP)
        await eventually(lambda: notify.seen("RELOADING", "1"), timeout=30)
        await eventually(lambda: len(notify.seen("READY", "1")) >= 2, timeout=30)
        assert "reloaded" in daemon.log()

        await post(daemon.port, "/v1/track", {"userId": "u", "event": "E", "messageId": "next"})
        [got] = await added.wait_for(1, timeout=30)
        assert got.json()["messageId"] == "next"
        release.set()  # the round in flight during the reload completes, once
        await eventually(
            lambda: (
                sql(
                    db_url,
                    "SELECT m.message_id, d.destination, d.status, d.attempts FROM deliveries d "
                    "JOIN messages m ON m.id = d.message_pk WHERE d.status <> 'pending' "
                    "ORDER BY m.id, d.destination",
                )
                == [
                    ("in-flight", "hooks", "delivered", 1),
                    ("next", "added", "delivered", 1),
                    ("next", "hooks", "delivered", 1),
                ]
            ),
            timeout=30,
        )
        assert [r.json()["messageId"] for r in slow.received] == ["in-flight", "next"]
    finally:
        release.set()
        daemon.ensure_stopped()


async def test_a_broken_configuration_changes_nothing(
    sqlite_url: str, receiver_factory: ReceiverFactory, tmp_path: Path, notify: NotifySocket
) -> None:
    receiver = await receiver_factory()
    settings = settings_dict(sqlite_url, [receiver.url])
    daemon = _process(tmp_path, settings, notify)
    daemon.start()
    try:
        await eventually(lambda: notify.seen("READY", "1"), timeout=30)
        broken = {**settings, "sources": [{**settings["sources"][0], "destinations": ["nope"]}]}
        broken["destinations"] = [{**settings["destinations"][0], "hooks": []}]
        write_toml(daemon.config_path, broken)
        assert daemon.proc is not None
        daemon.proc.send_signal(signal.SIGHUP)
        await eventually(lambda: len(notify.seen("READY", "1")) >= 2, timeout=30)
        log = daemon.log()
        assert "reload refused, the running configuration stays" in log
        assert "sources[0].destinations[0]" in log
        assert "destinations[0].hooks" in log
        # Still serving, to the destination it had.
        assert (await post(daemon.port, "/v1/track", {"userId": "u", "event": "E"}))[0] == 200
        await receiver.wait_for(1, timeout=30)
    finally:
        daemon.ensure_stopped()


async def test_settings_that_need_a_restart_are_named_and_not_applied(
    sqlite_url: str, tmp_path: Path, notify: NotifySocket
) -> None:
    settings = settings_dict(sqlite_url)
    daemon = _process(tmp_path, settings, notify)
    daemon.start()
    try:
        await eventually(lambda: notify.seen("READY", "1"), timeout=30)
        changed = {**settings, "server": {**settings["server"], "port": free_port()}}
        changed["delivery"] = {**settings["delivery"], "user_agent": "efd-reloaded/2"}
        write_toml(daemon.config_path, changed)
        assert daemon.proc is not None
        daemon.proc.send_signal(signal.SIGHUP)
        await eventually(lambda: len(notify.seen("READY", "1")) >= 2, timeout=30)
        assert "not applied until a restart: server.port" in daemon.log()
        assert _healthz(daemon.port) == 200  # still on the port it listens on
    finally:
        daemon.ensure_stopped()


# Secrets of the configuration that must never reach the log, whatever a reload meets.
_WRITE_KEY = "wk_reload_never_logged"
_TOKEN = "tok_reload_never_logged_0123"


def _spoil(path: Path, case: str) -> str:
    """Make the configuration file unusable; the reason the refusal must give."""
    if case == "not UTF-8":
        path.write_bytes(path.read_bytes() + b'\n[logging]\nlevel = "\xff"\n')
        return f"{path}: not valid UTF-8 (line "
    if case == "unreadable":
        path.chmod(0)
        return f"{path}: permission denied (efd runs as user "
    if case == "missing":
        path.unlink()
        return f"{path}: no such file"
    if case == "a directory":
        path.unlink()
        path.mkdir()
        return f"{path}: a directory, not a file"
    if case == "not TOML":
        path.write_bytes(path.read_bytes() + b"\n[logging\n")
        return f"{path}: not valid TOML: "
    path.write_bytes(path.read_bytes() + b'\n[logging]\nlevel = "LOUD"\n')
    return f"{path} has 1 problem: logging.level: "


@pytest.mark.parametrize(
    "case", ["not UTF-8", "unreadable", "missing", "a directory", "not TOML", "invalid values"]
)
async def test_a_reload_that_cannot_load_the_file_is_refused_in_one_line(
    sqlite_url: str,
    receiver_factory: ReceiverFactory,
    tmp_path: Path,
    notify: NotifySocket,
    case: str,
) -> None:
    receiver = await receiver_factory()
    settings = settings_dict(sqlite_url, [receiver.url], server={"admin_token": _TOKEN})
    settings["sources"][0]["write_key"] = _WRITE_KEY
    # File permissions hold for the daemon even when the suite runs as root.
    daemon = _process(tmp_path, settings, notify, prefix=file_permissions_apply())
    daemon.start()
    try:
        await eventually(lambda: notify.seen("READY", "1"), timeout=30)
        why = _spoil(daemon.config_path, case)
        logged_before = len(daemon.log())
        assert daemon.proc is not None
        daemon.proc.send_signal(signal.SIGHUP)
        # systemd hears that the reload is over, refused as it is: READY=1 after RELOADING=1.
        await eventually(lambda: len(notify.seen("READY", "1")) >= 2, timeout=30)
        told = [m for m in notify.drain() if "READY" in m or "RELOADING" in m]
        assert [("RELOADING" in m, m.get("READY")) for m in told] == [
            (False, "1"),
            (True, None),
            (False, "1"),
        ]
        log = daemon.log()
        # One line: every line since the signal is a record of its own (a timestamp first).
        lines = log[logged_before:].splitlines()
        assert all(re.match(r"\d{4}-\d\d-\d\d \d\d:", line) for line in lines), lines
        [refused] = [line for line in lines if "efd.daemon: reload" in line]
        assert "reload refused, the running configuration stays: " + why in refused, refused
        for secret in (_WRITE_KEY, _TOKEN):
            assert secret not in log
        assert "Traceback" not in log
        # Still serving, with the configuration it had.
        answer = await post(
            daemon.port, "/v1/track", {"userId": "u", "event": "E"}, basic(_WRITE_KEY)
        )
        assert answer[0] == 200
        await receiver.wait_for(1, timeout=30)
    finally:
        daemon.ensure_stopped()
