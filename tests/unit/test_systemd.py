"""efd/observe/systemd.py: reading systemd's environment, and the datagrams it sends."""

from __future__ import annotations

import os
import socket
from pathlib import Path

import pytest

from efd import config
from efd.config import Settings
from efd.daemon import Daemon, _reload
from efd.observe.systemd import Notifier


def test_without_notify_socket_nothing_is_sent_and_nothing_fails() -> None:
    notifier = Notifier({})
    assert not notifier.enabled
    notifier.notify(ready="1")  # no socket: nothing happens
    assert notifier.watchdog_interval is None


def test_watchdog_interval_is_half_watchdog_usec_for_this_process() -> None:
    assert Notifier({"WATCHDOG_USEC": "30000000"}).watchdog_interval == 15.0
    mine = {"WATCHDOG_USEC": "2000000", "WATCHDOG_PID": str(os.getpid())}
    assert Notifier(mine).watchdog_interval == 1.0
    assert Notifier({"WATCHDOG_USEC": "2000000", "WATCHDOG_PID": "1"}).watchdog_interval is None
    assert Notifier({"WATCHDOG_USEC": "soon"}).watchdog_interval is None


def test_fields_arrive_as_one_datagram_of_key_value_lines(tmp_path: Path) -> None:
    with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as systemd:
        systemd.bind(str(tmp_path / "notify"))
        notifier = Notifier({"NOTIFY_SOCKET": str(tmp_path / "notify")})
        notifier.notify(ready="1", status="serving")
        assert systemd.recv(4096) == b"READY=1\nSTATUS=serving"
        notifier.close()


def test_an_abstract_socket_name_starts_with_a_nul() -> None:
    name = f"efd-test-{os.getpid()}"
    with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as systemd:
        systemd.bind("\0" + name)
        notifier = Notifier({"NOTIFY_SOCKET": "@" + name})
        notifier.notify(stopping="1")
        assert systemd.recv(4096) == b"STOPPING=1"
        notifier.close()


class _FailingDaemon(Daemon):
    """A daemon whose reload breaks part-way (what efd.daemon._reload does then is under test)."""

    async def reload(self, settings: Settings) -> list[str]:
        raise RuntimeError("a part refused the new configuration")


async def test_a_reload_that_fails_part_way_still_ends_with_ready(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    config_path = tmp_path / "efd.toml"
    config_path.write_text("")  # valid: every default
    with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as systemd:
        systemd.bind(str(tmp_path / "notify"))
        notifier = Notifier({"NOTIFY_SOCKET": str(tmp_path / "notify")})
        await _reload(_FailingDaemon(config.load(None)), str(config_path), notifier)
        notifier.close()
        assert systemd.recv(4096) == b"RELOADING=1\nSTATUS=reloading the configuration"
        assert systemd.recv(4096) == b"READY=1\nSTATUS=serving"
    assert "reload failed part-way" in caplog.text
