"""Crash safety, shown by killing a real `efd serve` process."""

from __future__ import annotations

import asyncio
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
from aiohttp import web

from tests.conftest import (
    DaemonProcess,
    Receiver,
    ReceiverFactory,
    eventually,
    free_port,
    post,
    settings_dict,
    sql,
    write_toml,
)

pytestmark = pytest.mark.slow


class Switch:
    """A receiver behaviour that answers 503 until switched on."""

    def __init__(self) -> None:
        self.up = False

    async def __call__(self, _request: web.Request, _n: int) -> web.StreamResponse:
        return web.Response(status=200 if self.up else 503)


def _process(tmp_path: Path, settings: dict[str, Any], name: str = "efd") -> DaemonProcess:
    port = free_port()
    settings["server"] = {"host": "127.0.0.1", "port": port}
    settings["logging"] = {"level": "INFO"}
    path = write_toml(tmp_path / f"{name}.toml", settings)
    return DaemonProcess(path, port, tmp_path / f"{name}.log")


def _message_ids(receiver: Receiver) -> Counter[str]:
    return Counter(r.json()["messageId"] for r in receiver.received)


async def test_kill_9_mid_retry_schedule_loses_nothing(
    db_url: str, receiver_factory: ReceiverFactory, tmp_path: Path
) -> None:
    switch = Switch()
    receiver = await receiver_factory(switch)
    # On PostgreSQL, deliveries leased by the killed process wait for the lease to lapse
    # (60 s by default): a short one keeps the test short, and still waits for it.
    settings = settings_dict(
        db_url,
        [receiver.url],
        delivery={
            "timeout_seconds": 2,
            "lease_seconds": 8,
            "retry_initial_seconds": 0.3,
            "retry_max_seconds": 0.6,
            "retry_window_seconds": 600,
            "allowed_networks": ["127.0.0.0/8"],
        },
    )
    daemon = _process(tmp_path, settings).start()
    try:
        batch = [
            {"type": "track", "userId": f"u{i}", "event": "E", "messageId": f"k{i}"}
            for i in range(20)
        ]
        status, _ = await post(daemon.port, "/v1/batch", {"batch": batch})
        assert status == 200
        # Every message has been tried and refused at least once: mid-schedule.
        await eventually(
            lambda: sql(db_url, "SELECT count(*) FROM deliveries WHERE attempts >= 1") == [(20,)],
            timeout=45,
        )
        daemon.kill()
        before = dict(
            sql(db_url, "SELECT id, first_attempt_at FROM deliveries WHERE status = 'pending'")
        )
        assert len(before) == 20
        assert not sql(db_url, "SELECT 1 FROM deliveries WHERE attempts = 0")

        switch.up = True
        daemon.start()
        # The messageIds survive too: a client that re-sends the batch after the crash gets
        # 200, and nothing is stored or delivered twice (on SQLite the deduplication index
        # lives in the writer's memory, rebuilt from the messages table at start).
        status, _ = await post(daemon.port, "/v1/batch", {"batch": batch})
        assert status == 200
        assert sql(db_url, "SELECT count(*) FROM messages") == [(20,)]
        if db_url.startswith("sqlite"):
            assert "deduplication: 20 messageIds of the last 24 h indexed" in daemon.log()
        await eventually(
            lambda: (
                sql(db_url, "SELECT count(*) FROM deliveries WHERE status = 'delivered'") == [(20,)]
            ),
            timeout=60,
        )
        assert set(_message_ids(receiver)) == {f"k{i}" for i in range(20)}
        assert sql(db_url, "SELECT count(*) FROM deliveries") == [(20,)]
        # The schedule carried on: the window still counts from the first attempt.
        after = dict(sql(db_url, "SELECT id, first_attempt_at FROM deliveries"))
        assert after == before
    finally:
        daemon.ensure_stopped()


async def test_kill_9_right_after_acknowledgement(
    db_url: str, receiver_factory: ReceiverFactory, tmp_path: Path
) -> None:
    port = free_port()  # the receiver is down while the daemon runs the first time
    # On PostgreSQL, deliveries leased by the killed process wait for the lease to lapse.
    settings = settings_dict(
        db_url,
        [f"http://127.0.0.1:{port}/hook"],
        delivery={"timeout_seconds": 2, "lease_seconds": 8},
    )
    daemon = _process(tmp_path, settings).start()
    try:
        acked = []
        for i in range(10):
            batch = [
                {"type": "track", "userId": "u", "event": "E", "messageId": f"a{i}-{j}"}
                for j in range(50)
            ]
            status, _ = await post(daemon.port, "/v1/batch", {"batch": batch})
            assert status == 200
            acked += [m["messageId"] for m in batch]
        daemon.kill()

        receiver = await receiver_factory(port=port)
        daemon.start()
        await eventually(lambda: len(_message_ids(receiver)) == len(acked), timeout=60)
        assert set(_message_ids(receiver)) == set(acked)
    finally:
        daemon.ensure_stopped()


async def test_sigterm_finishes_in_flight_delivery_and_exits_0(
    db_url: str, receiver_factory: ReceiverFactory, tmp_path: Path
) -> None:
    async def slow(_request: web.Request, _n: int) -> web.StreamResponse:
        await asyncio.sleep(1.0)
        return web.Response(text="ok")

    receiver = await receiver_factory(slow)
    daemon = _process(tmp_path, settings_dict(db_url, [receiver.url])).start()
    try:
        await post(daemon.port, "/v1/track", {"userId": "u", "event": "E", "messageId": "t1"})
        await receiver.wait_for(1)
        # SIGTERM while the receiver is still answering: the round completes and is recorded.
        code = await asyncio.to_thread(daemon.terminate)
        assert code == 0, daemon.log()
        assert sql(db_url, "SELECT status, attempts FROM deliveries") == [("delivered", 1)]
        assert "shutting down" in daemon.log()
        assert "stopped" in daemon.log()

        # Without a crash nothing is delivered twice, across a restart too: the delivery is
        # finished, and the restarted daemon resumes only unfinished ones.
        daemon.start()
        assert sql(db_url, "SELECT status, lease_owner FROM deliveries") == [("delivered", None)]
        assert "resuming" not in daemon.log()
        assert _message_ids(receiver) == Counter({"t1": 1})
    finally:
        daemon.ensure_stopped()


async def test_a_second_daemon_on_the_same_sqlite_file_is_refused(
    receiver_factory: ReceiverFactory, tmp_path: Path
) -> None:
    db_url = f"sqlite:///{tmp_path / 'shared.db'}"
    first = _process(tmp_path, settings_dict(db_url), name="first").start()
    try:
        second = _process(tmp_path, settings_dict(db_url), name="second")
        with pytest.raises(AssertionError, match="another efd process"):
            second.start(timeout=30)
    finally:
        first.ensure_stopped()
