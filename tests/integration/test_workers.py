"""Sender processes: rounds sent from child processes, and what happens when one dies."""

from __future__ import annotations

import asyncio
import os
import signal
import sys
import time
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
from aiohttp import web

from efd.daemon import StartupError, cgroups
from efd.daemon.startup import usable_cpus
from efd.segment import webhooks
from tests.conftest import (
    SECRET,
    DaemonFactory,
    DaemonProcess,
    ReceiverFactory,
    eventually,
    free_port,
    post,
    settings_dict,
    sql,
    write_toml,
)


def _children(pid: int) -> set[int]:
    children: set[int] = set()
    for task in os.listdir(f"/proc/{pid}/task"):
        with open(f"/proc/{pid}/task/{task}/children") as handle:
            children.update(int(child) for child in handle.read().split())
    return children


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as handle:
            return handle.read().rsplit(")", 1)[1].split()[0] != "Z"
    except FileNotFoundError:
        return False


@pytest.mark.parametrize("processes", [0, 2])
async def test_rounds_from_any_number_of_sender_processes(
    processes: int, db_url: str, receiver_factory: ReceiverFactory, daemon_factory: DaemonFactory
) -> None:
    receiver = await receiver_factory()
    settings = settings_dict(db_url, [receiver.url], delivery={"sender_processes": processes})
    daemon = await daemon_factory(settings)
    assert len(daemon.senders.pids if daemon.senders else []) == processes
    batch = [
        {"type": "track", "userId": "u", "event": "E", "messageId": f"m{i}"} for i in range(40)
    ]
    assert (await post(daemon.port, "/v1/batch", {"batch": batch}))[0] == 200
    received = await receiver.wait_for(40)
    assert Counter(r.json()["messageId"] for r in received) == {f"m{i}": 1 for i in range(40)}
    assert all(r.headers["X-Signature"] == webhooks.sign(SECRET, r.body) for r in received)
    await eventually(
        lambda: (
            sql(db_url, "SELECT status, count(*) FROM deliveries GROUP BY status")
            == [("delivered", 40)]
        )
    )
    assert sql(db_url, "SELECT outcome, count(*) FROM attempts GROUP BY outcome") == [
        ("success", 40)
    ]


async def test_killed_sender_process_is_replaced_and_its_round_retried(
    db_url: str,
    receiver_factory: ReceiverFactory,
    daemon_factory: DaemonFactory,
    caplog: pytest.LogCaptureFixture,
) -> None:
    arrived = asyncio.Event()

    async def slow_first(_request: web.Request, n: int) -> web.StreamResponse:
        if n == 1:
            arrived.set()
            await asyncio.sleep(3)
        return web.Response(text="ok")

    receiver = await receiver_factory(slow_first)
    settings = settings_dict(db_url, [receiver.url], delivery={"sender_processes": 1})
    daemon = await daemon_factory(settings)
    assert daemon.senders is not None
    [first] = daemon.senders.pids
    assert (await post(daemon.port, "/v1/track", {"userId": "u", "event": "E"}))[0] == 200
    await asyncio.wait_for(arrived.wait(), 10)
    os.kill(first, signal.SIGKILL)  # mid-round: the answer will never reach the daemon

    await eventually(
        lambda: sql(db_url, "SELECT status, attempts FROM deliveries") == [("delivered", 2)],
        timeout=20,
    )
    assert sql(db_url, "SELECT outcome, error_class FROM attempts ORDER BY id") == [
        ("retry", "interrupted"),
        ("success", None),
    ]
    [second] = daemon.senders.pids
    assert second != first
    assert "sender process 0 exited unexpectedly" in caplog.text


@pytest.mark.parametrize(
    ("server", "delivery", "which"),
    [
        ({"parse_processes": 0}, {"sender_processes": 1}, "sender process 0"),
        ({"parse_processes": 1}, {"sender_processes": 0}, "parser process 0"),
    ],
)
async def test_child_process_that_cannot_start_stops_the_daemon(
    server: dict[str, int],
    delivery: dict[str, int],
    which: str,
    db_url: str,
    daemon_factory: DaemonFactory,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(sys, "executable", "/bin/false")  # the child exits at once
    settings = settings_dict(db_url, delivery=delivery)
    settings["server"].update(server)
    with pytest.raises(StartupError, match=f"{which} did not start"):
        await daemon_factory(settings)


def _big_batch(prefix: str, count: int = 60) -> list[dict[str, Any]]:
    """A batch well over the size parsed in a parser process, fully determined by its input."""
    return [
        {
            "type": "track",
            "userId": f"{prefix}-u{i}",
            "event": "Order Completed",
            "messageId": f"{prefix}-{i}",
            "timestamp": "2026-11-21T10:00:00.000Z",
            "properties": {"revenue": i + 0.5, "note": "x" * 100, "n": 1e21, "z": 10.0},
            "integrations": {"All": True},
        }
        for i in range(count)
    ]


async def test_parser_processes_store_what_the_daemon_itself_would(
    db_url: str, receiver_factory: ReceiverFactory, daemon_factory: DaemonFactory
) -> None:
    receiver = await receiver_factory()
    bodies = {}
    for processes in (0, 1):
        settings = settings_dict(db_url, [receiver.url])
        settings["server"]["parse_processes"] = processes
        daemon = await daemon_factory(settings)
        assert len(daemon.parsers.pids if daemon.parsers else []) == processes
        batch = _big_batch(f"p{processes}")
        status, _ = await post(daemon.port, "/v1/batch", {"batch": batch})
        assert status == 200
        bodies[processes] = [
            body.replace(f"p{processes}", "p")
            for (body,) in sql(
                db_url,
                "SELECT body FROM messages WHERE message_id LIKE :prefix ORDER BY id",
                prefix=f"p{processes}-%",
            )
        ]
        if processes == 0:
            await daemon.stop()  # what it did not deliver, the next daemon will
    assert len(bodies[1]) == 60
    assert bodies[1] == bodies[0]
    received = await receiver.wait_for(120)
    assert all(r.headers["X-Signature"] == webhooks.sign(SECRET, r.body) for r in received)


async def test_parser_processes_reject_like_the_daemon(
    db_url: str, daemon_factory: DaemonFactory
) -> None:
    batch = _big_batch("r")
    batch[37]["type"] = "bogus"
    answers = []
    for processes in (0, 1):
        settings = settings_dict(db_url)
        settings["server"]["parse_processes"] = processes
        daemon = await daemon_factory(settings)
        answers.append(await post(daemon.port, "/v1/batch", {"batch": batch}))
        await daemon.stop()
    assert answers[0] == answers[1]
    status, answer = answers[1]
    assert status == 400
    assert answer["index"] == 37
    assert sql(db_url, "SELECT count(*) FROM messages") == [(0,)]


async def test_killed_parser_process_is_replaced_and_nothing_is_refused(
    db_url: str, daemon_factory: DaemonFactory, caplog: pytest.LogCaptureFixture
) -> None:
    settings = settings_dict(db_url)
    settings["server"]["parse_processes"] = 1
    daemon = await daemon_factory(settings)
    assert daemon.parsers is not None
    [first] = daemon.parsers.pids
    os.kill(first, signal.SIGKILL)
    # Whether the request reaches the dying process or waits for the new one, it is parsed.
    for round_ in range(3):
        status, _ = await post(daemon.port, "/v1/batch", {"batch": _big_batch(f"k{round_}")})
        assert status == 200
    assert sql(db_url, "SELECT count(*) FROM messages") == [(180,)]
    await eventually(lambda: daemon.parsers is not None and len(daemon.parsers.pids) == 1)
    assert daemon.parsers.pids != [first]
    assert "parser process 0 exited unexpectedly" in caplog.text


@pytest.mark.slow
@pytest.mark.parametrize("cpus", [1, 2])
async def test_helper_processes_by_default_follow_the_cpus_the_daemon_may_run_on(
    sqlite_url: str, receiver_factory: ReceiverFactory, tmp_path: Path, cpus: int
) -> None:
    # Unset, sender_processes and parse_processes are one each, or none on one CPU (taskset,
    # CPUAffinity=, a cpuset), where a child could only take turns with the daemon.
    available = sorted(os.sched_getaffinity(0))
    if len(available) < cpus:
        pytest.skip(f"this machine lets tests run on {len(available)} CPU(s)")
    if usable_cpus().usable < min(cpus, len(available)):
        pytest.skip("a CPU quota narrows what the tests may use")
    pinned = set(available[:cpus])
    receiver = await receiver_factory()
    port = free_port()
    settings = settings_dict(sqlite_url, [receiver.url])
    del settings["delivery"]["sender_processes"]
    settings["server"] = {"host": "127.0.0.1", "port": port}
    daemon = DaemonProcess(
        write_toml(tmp_path / "efd.toml", settings),
        port,
        tmp_path / "efd.log",
        preexec_fn=lambda: os.sched_setaffinity(0, pinned),
    ).start()
    try:
        assert daemon.proc is not None
        helpers = 0 if cpus == 1 else 1
        assert len(_children(daemon.proc.pid)) == 2 * helpers
        assert (await post(port, "/v1/track", {"userId": "u", "event": "E"}))[0] == 200
        await eventually(
            lambda: sql(sqlite_url, "SELECT status FROM deliveries") == [("delivered",)]
        )
        assert len(receiver.received) == 1
        assert daemon.terminate() == 0
    finally:
        daemon.ensure_stopped()
    said = f"{helpers} sender and {helpers} parser processes, the default where efd may use"
    assert f"{said} {cpus} CPU(s) (" in daemon.log()


def _cpu_quota_cgroup(tmp_name: str) -> str | None:
    """A new cgroup limited to one CPU, on whichever version mounts the cpu controller where
    this test may write; None where none does."""
    with open("/proc/self/mountinfo") as handle:
        mounts = cgroups.mounts(handle.read())
    for mount in mounts:
        if mount.fstype == "cgroup" and "cpu" in mount.options:
            limit = {"cpu.cfs_period_us": "100000", "cpu.cfs_quota_us": "100000"}
        elif mount.fstype == "cgroup2":
            try:
                with open(f"{mount.point}/cgroup.subtree_control") as handle:
                    if "cpu" not in handle.read().split():
                        continue
            except OSError:
                continue
            limit = {"cpu.max": "100000 100000"}
        else:
            continue
        directory = f"{mount.point}/{tmp_name}"
        try:
            os.mkdir(directory)
        except OSError:
            continue
        try:
            for name, text in limit.items():
                with open(f"{directory}/{name}", "w") as handle:
                    handle.write(text)
        except OSError:
            os.rmdir(directory)
            continue
        return directory
    return None


@pytest.mark.slow
async def test_helper_processes_by_default_follow_a_cpu_quota(
    sqlite_url: str, receiver_factory: ReceiverFactory, tmp_path: Path
) -> None:
    # systemd's CPUQuota=100% (or a container's one-CPU limit) on a host with more CPUs: a
    # child process could only take turns with the daemon, as on one CPU.
    if len(os.sched_getaffinity(0)) < 2:
        pytest.skip("a one-CPU quota only narrows more than one CPU")
    directory = _cpu_quota_cgroup(f"efd-test-{os.getpid()}-{tmp_path.name}")
    if directory is None:
        pytest.skip("no cgroup hierarchy with the cpu controller this test may write")
    receiver = await receiver_factory()
    port = free_port()
    settings = settings_dict(sqlite_url, [receiver.url])
    del settings["delivery"]["sender_processes"]
    settings["server"] = {"host": "127.0.0.1", "port": port}

    def join() -> None:
        with open(f"{directory}/cgroup.procs", "w") as handle:
            handle.write(str(os.getpid()))

    daemon = DaemonProcess(
        write_toml(tmp_path / "efd.toml", settings), port, tmp_path / "efd.log", preexec_fn=join
    )
    try:
        daemon.start()
        assert daemon.proc is not None
        assert _children(daemon.proc.pid) == set()
        assert (await post(port, "/v1/track", {"userId": "u", "event": "E"}))[0] == 200
        await eventually(
            lambda: sql(sqlite_url, "SELECT status FROM deliveries") == [("delivered",)]
        )
        assert daemon.terminate() == 0
    finally:
        daemon.ensure_stopped()
        deadline = time.monotonic() + 10
        while True:
            try:
                os.rmdir(directory)
                break
            except OSError:
                if time.monotonic() > deadline:
                    raise
                await asyncio.sleep(0.1)
    affinity = len(os.sched_getaffinity(0))
    assert (
        "0 sender and 0 parser processes, the default where efd may use 1 CPU(s): its CPU "
        f"quota allows 1.00 of the {affinity} it may run on"
    ) in daemon.log()


@pytest.mark.slow
async def test_child_processes_exit_when_the_daemon_is_killed(
    sqlite_url: str, tmp_path: Path
) -> None:
    port = free_port()
    settings = settings_dict(sqlite_url, delivery={"sender_processes": 2})
    settings["server"] = {"host": "127.0.0.1", "port": port, "parse_processes": 1}
    daemon = DaemonProcess(write_toml(tmp_path / "efd.toml", settings), port, tmp_path / "efd.log")
    daemon.start()
    try:
        assert daemon.proc is not None
        children = _children(daemon.proc.pid)
        assert len(children) == 3  # 2 sender processes, 1 parser process
        daemon.kill()
        deadline = time.monotonic() + 10
        while any(_alive(pid) for pid in children) and time.monotonic() < deadline:
            await asyncio.sleep(0.05)
        assert not any(_alive(pid) for pid in children)
    finally:
        daemon.ensure_stopped()


@pytest.mark.slow
async def test_sigterm_to_the_whole_group_lets_the_daemon_drain(
    sqlite_url: str, receiver_factory: ReceiverFactory, tmp_path: Path
) -> None:
    # systemd signals every process of the service; the sender processes must not die
    # before the daemon has finished the rounds in flight.
    arrived = asyncio.Event()

    async def slow(_request: web.Request, _n: int) -> web.StreamResponse:
        arrived.set()
        await asyncio.sleep(1.5)
        return web.Response(text="ok")

    receiver = await receiver_factory(slow)
    port = free_port()
    settings = settings_dict(sqlite_url, [receiver.url], delivery={"sender_processes": 1})
    settings["server"] = {"host": "127.0.0.1", "port": port}
    config = write_toml(tmp_path / "efd.toml", settings)
    daemon = DaemonProcess(config, port, tmp_path / "efd.log", own_group=True).start()
    try:
        assert (await post(port, "/v1/track", {"userId": "u", "event": "E"}))[0] == 200
        await asyncio.wait_for(arrived.wait(), 10)
        daemon.signal_group(signal.SIGTERM)
        assert daemon.proc is not None
        assert await asyncio.to_thread(daemon.proc.wait, 30) == 0
    finally:
        daemon.ensure_stopped()
    assert sql(sqlite_url, "SELECT status, attempts FROM deliveries") == [("delivered", 1)]
    assert sql(sqlite_url, "SELECT outcome FROM attempts") == [("success",)]
    assert len(receiver.received) == 1
    assert "stopped" in daemon.log()
