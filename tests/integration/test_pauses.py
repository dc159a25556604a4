"""Pause, resume and auto-disable against real daemons and real receivers on 127.0.0.1, on
SQLite and PostgreSQL: a paused destination or hook is sent nothing and loses nothing, its
retry window stands still, the pause outlives a restart, and a hook failing for
disable_after_hours is disabled until resumed."""

from __future__ import annotations

import asyncio
import logging
import time
from collections import Counter
from datetime import datetime
from pathlib import Path
from typing import Any

import pytest
from aiohttp import web

from efd.delivery import dispatcher
from tests.conftest import (
    DaemonFactory,
    ReceiverFactory,
    eventually,
    settings_dict,
    sql,
    write_toml,
)
from tests.integration.test_operators import TOKEN, Switch, run_cli, send, statuses
from tests.integration.test_regulations import api


def paused_settings(db_url: str, hooks: list[str], **delivery: Any) -> dict[str, Any]:
    settings = settings_dict(db_url, hooks, delivery=delivery)
    settings["server"]["admin_token"] = TOKEN
    return settings


async def destinations(port: int) -> dict[str, Any]:
    status, answer = await api(port, "GET", "/admin/destinations")
    assert status == 200, answer
    return {d["name"]: d for d in answer["destinations"]}


def pending_unclaimed(db_url: str) -> int:
    return int(
        sql(
            db_url,
            "SELECT count(*) FROM deliveries WHERE status = 'pending' AND lease_owner IS NULL"
            " AND attempts = 0",
        )[0][0]
    )


async def test_a_paused_destination_is_sent_nothing_and_gets_everything_on_resume(
    db_url: str, daemon_factory: DaemonFactory, receiver_factory: ReceiverFactory
) -> None:
    receiver = await receiver_factory()
    daemon = await daemon_factory(paused_settings(db_url, [receiver.url]))
    status, answer = await api(
        daemon.port, "POST", "/admin/destinations/hooks/pause", {"reason": "maintenance"}
    )
    assert status == 200, answer
    assert answer["pause"]["kind"] == "paused"
    assert answer["pause"]["reason"] == "maintenance"
    assert answer["pause"]["hook"] is None
    for i in range(20):
        await send(daemon.port, f"m-{i}")  # accepted while paused
    await asyncio.sleep(3 * dispatcher.PAUSE_POLL)
    assert receiver.received == []
    assert pending_unclaimed(db_url) == 20  # held: not claimed, not attempted, not expired
    shown = (await destinations(daemon.port))["hooks"]
    assert shown["state"] == "paused"
    assert shown["pause"]["reason"] == "maintenance"
    assert shown["backlog"] == 20

    status, answer = await api(daemon.port, "POST", "/admin/destinations/hooks/resume")
    assert status == 200, answer
    assert answer["resumed"]["kind"] == "paused"
    await receiver.wait_for(20)
    await eventually(lambda: set(statuses(db_url).values()) == {"delivered"})
    ids = Counter(r.json()["messageId"] for r in receiver.received)
    assert ids == Counter({f"m-{i}": 1 for i in range(20)})
    assert (await destinations(daemon.port))["hooks"]["state"] == "active"


async def test_a_pause_outlasts_the_retry_window_and_a_restart(
    db_url: str, daemon_factory: DaemonFactory, receiver_factory: ReceiverFactory, tmp_path: Path
) -> None:
    switch = Switch(503)
    receiver = await receiver_factory(switch)
    window = 4.0
    settings = paused_settings(db_url, [receiver.url], retry_window_seconds=window)
    config = str(write_toml(tmp_path / "efd.toml", settings))
    daemon = await daemon_factory(settings)
    await send(daemon.port, "m-1")
    await receiver.wait_for(1)
    # From the CLI, as from another process: the daemon applies it within PAUSE_POLL.
    code, out, err = await asyncio.to_thread(
        run_cli, "pause", "hooks", "--reason", "receiver upgrade", "--config", config
    )
    assert code == 0, err
    assert "paused since" in out
    await asyncio.sleep(2 * dispatcher.PAUSE_POLL)
    sent = len(receiver.received)
    await asyncio.sleep(window + 1)  # the window would have closed by now
    assert len(receiver.received) == sent
    assert statuses(db_url) == {"m-1": "pending"}

    await daemon.stop()
    daemon = await daemon_factory(settings)
    await asyncio.sleep(3 * dispatcher.PAUSE_POLL)
    assert len(receiver.received) == sent  # still paused after the restart
    assert statuses(db_url) == {"m-1": "pending"}
    shown = (await destinations(daemon.port))["hooks"]
    assert shown["state"] == "paused"
    assert shown["pause"]["reason"] == "receiver upgrade"
    code, out, _ = await asyncio.to_thread(run_cli, "deliveries", "--config", config)
    assert code == 0
    assert "hooks: paused since" in out

    # The first attempt after the resume fails too: only a window moved past the pause
    # leaves room for another.
    resumed_at = len(receiver.received)

    async def once_more(request: web.Request, n: int) -> web.StreamResponse:
        return web.Response(status=503 if n == resumed_at + 1 else 200)

    receiver.behaviour = once_more
    code, out, err = await asyncio.to_thread(run_cli, "resume", "hooks", "--config", config)
    assert code == 0, err
    assert "deliveries due now: 1" in out
    await eventually(lambda: statuses(db_url) == {"m-1": "delivered"}, timeout=15)
    assert len(receiver.received) == resumed_at + 2


async def test_pausing_one_hook_of_two_sends_the_other_everything(
    db_url: str, daemon_factory: DaemonFactory, receiver_factory: ReceiverFactory, tmp_path: Path
) -> None:
    first, second = await receiver_factory(), await receiver_factory()
    settings = paused_settings(db_url, [first.url, second.url])
    config = str(write_toml(tmp_path / "efd.toml", settings))
    daemon = await daemon_factory(settings)
    code, _, err = await asyncio.to_thread(
        run_cli, "pause", "hooks", "--hook", "2", "--config", config
    )
    assert code == 0, err
    await asyncio.sleep(2 * dispatcher.PAUSE_POLL)
    for i in range(10):
        await send(daemon.port, f"m-{i}")
    await first.wait_for(10)
    await eventually(lambda: set(statuses(db_url).values()) == {"delivered"})
    assert second.received == []
    shown = (await destinations(daemon.port))["hooks"]
    assert shown["state"] == "partly"
    assert shown["pause"] is None
    assert [h["pause"] and h["pause"]["kind"] for h in shown["hooks"]] == [None, "paused"]
    assert [h["hook"] for h in shown["hooks"]] == [1, 2]

    status, answer = await api(daemon.port, "POST", "/admin/destinations/hooks/resume", {"hook": 2})
    assert status == 200, answer
    assert answer["resumed"]["hook"] == 2
    await send(daemon.port, "m-after")
    await eventually(lambda: len(first.received) + len(second.received) >= 12)
    assert len(second.received) == 1


async def test_a_hook_failing_for_disable_after_hours_is_disabled_until_resumed(
    db_url: str,
    daemon_factory: DaemonFactory,
    receiver_factory: ReceiverFactory,
    caplog: pytest.LogCaptureFixture,
) -> None:
    switch = Switch(503)
    receiver = await receiver_factory(switch)
    hours = 0.0005  # 1.8 s
    daemon = await daemon_factory(
        paused_settings(db_url, [receiver.url], disable_after_hours=hours)
    )
    caplog.set_level(logging.WARNING, logger="efd.delivery.dispatcher")
    for i in range(5):
        await send(daemon.port, f"m-{i}")

    def disabled() -> Any:
        rows = sql(db_url, "SELECT kind, reason, hook FROM pauses WHERE kind = 'disabled'")
        return rows[0] if rows else None

    _, reason, hook = await eventually(disabled, timeout=20)
    assert hook == 1
    assert reason.startswith("failing since ")
    assert reason.endswith(f"(last: {receiver.url}: HTTP 503)")
    await asyncio.sleep(2 * dispatcher.PAUSE_POLL)
    sent = len(receiver.received)
    await asyncio.sleep(3 * dispatcher.PAUSE_POLL)
    assert len(receiver.received) == sent  # never tried again
    shown = (await destinations(daemon.port))["hooks"]
    assert shown["state"] == "disabled"
    assert shown["hooks"][0]["pause"]["kind"] == "disabled"
    assert shown["hooks"][0]["pause"]["reason"] == reason
    logged = [r for r in caplog.records if "is disabled" in r.getMessage()]
    assert len(logged) == 1, [r.getMessage() for r in logged]
    assert set(statuses(db_url).values()) == {"pending"}

    switch.status = 200
    status, answer = await api(daemon.port, "POST", "/admin/destinations/hooks/resume", {"hook": 1})
    assert status == 200, answer
    assert answer["resumed"]["kind"] == "disabled"
    await eventually(lambda: set(statuses(db_url).values()) == {"delivered"}, timeout=15)
    assert sql(db_url, "SELECT count(*) FROM pauses WHERE kind != 'failing'")[0][0] == 0


async def test_pause_and_resume_need_the_token_and_refuse_bad_input(
    db_url: str, daemon_factory: DaemonFactory, receiver_factory: ReceiverFactory
) -> None:
    receiver = await receiver_factory()
    off = await daemon_factory(settings_dict(db_url, [receiver.url]))
    for action in ("pause", "resume"):
        path = f"/admin/destinations/hooks/{action}"
        status, answer = await api(off.port, "POST", path, token="anything")
        assert (status, answer["code"]) == (403, "admin_api_disabled")
    await off.stop()
    daemon = await daemon_factory(paused_settings(db_url, [receiver.url]))
    for action in ("pause", "resume"):
        path = f"/admin/destinations/hooks/{action}"
        for token in (None, "wrong"):
            status, answer = await api(daemon.port, "POST", path, token=token)
            assert (status, answer["code"]) == (401, "unauthorized")
        status, answer = await api(daemon.port, "POST", f"/admin/destinations/nope/{action}")
        assert (status, answer["code"]) == (404, "unknown_destination"), answer
        assert "nope" in answer["message"]
        status, answer = await api(daemon.port, "POST", path, {"hook": 2})
        assert (status, answer["code"], answer["field"]) == (404, "unknown_hook", "hook")
        assert "from 1 to 1" in answer["message"]
        for body, field in [
            ({"hook": 0}, "hook"),
            ({"hook": "1"}, "hook"),
            ({"hook": True}, "hook"),
            ({"hook": 1.5}, "hook"),
            ({"colour": "red"}, "colour"),
            (b"{not json", "body"),
            (b"[1]", "body"),
        ]:
            status, answer = await api(daemon.port, "POST", path, body)
            assert (status, answer.get("field")) == (400, field), (action, body, answer)
    for body in ({"reason": 5}, {"reason": "x" * 501}):
        status, answer = await api(daemon.port, "POST", "/admin/destinations/hooks/pause", body)
        assert (status, answer["field"]) == (400, "reason"), answer
    status, answer = await api(daemon.port, "POST", "/admin/destinations/hooks/resume")
    assert (status, answer) == (200, {"resumed": None, "due": 0})
    assert sql(db_url, "SELECT count(*) FROM pauses")[0][0] == 0


async def test_the_cli_refuses_an_unknown_destination_or_hook(db_url: str, tmp_path: Path) -> None:
    from efd.store import migrate

    migrate.upgrade(db_url)
    config = str(write_toml(tmp_path / "efd.toml", settings_dict(db_url, ["http://127.0.0.1:9/"])))
    code, _, err = await asyncio.to_thread(run_cli, "pause", "nope", "--config", config)
    assert code == 2
    assert "no destination named 'nope'" in err
    code, _, err = await asyncio.to_thread(
        run_cli, "pause", "hooks", "--hook", "3", "--config", config
    )
    assert code == 2
    assert "hook must be a number from 1 to 1" in err
    code, out, _ = await asyncio.to_thread(run_cli, "resume", "hooks", "--config", config)
    assert code == 0
    assert "was not paused" in out


async def test_a_pause_survives_a_reload(
    db_url: str, daemon_factory: DaemonFactory, receiver_factory: ReceiverFactory
) -> None:
    from efd import config

    receiver = await receiver_factory()
    settings = paused_settings(db_url, [receiver.url])
    daemon = await daemon_factory(settings)
    status, _ = await api(daemon.port, "POST", "/admin/destinations/hooks/pause")
    assert status == 200
    await send(daemon.port, "m-1")
    settings["delivery"]["max_per_hook"] = 8  # a change, so the reload rebuilds the routes
    await daemon.reload(config.load(None, **settings))
    await asyncio.sleep(3 * dispatcher.PAUSE_POLL)
    assert receiver.received == []
    assert (await destinations(daemon.port))["hooks"]["state"] == "paused"
    status, _ = await api(daemon.port, "POST", "/admin/destinations/hooks/resume")
    assert status == 200
    await receiver.wait_for(1)


async def test_daemons_on_one_postgresql_store_each_apply_a_pause_within_a_poll(
    db_url: str, daemon_factory: DaemonFactory, receiver_factory: ReceiverFactory
) -> None:
    if db_url.startswith("sqlite"):
        pytest.skip("one daemon per SQLite file")
    receiver = await receiver_factory()
    settings = paused_settings(db_url, [receiver.url])
    first = await daemon_factory(settings)
    second = await daemon_factory(settings)
    status, _ = await api(first.port, "POST", "/admin/destinations/hooks/pause")
    assert status == 200
    await asyncio.sleep(2 * dispatcher.PAUSE_POLL)  # the second daemon's look at the pauses
    for i in range(10):
        await send(second.port, f"b-{i}")
        await send(first.port, f"a-{i}")
    await asyncio.sleep(2 * dispatcher.PAUSE_POLL)
    assert receiver.received == []
    assert pending_unclaimed(db_url) == 20
    assert (await destinations(second.port))["hooks"]["state"] == "paused"
    status, answer = await api(second.port, "POST", "/admin/destinations/hooks/resume")
    assert (status, answer["due"]) == (200, 20)
    await receiver.wait_for(20)
    await eventually(lambda: set(statuses(db_url).values()) == {"delivered"})
    assert len(receiver.received) == 20


async def test_a_paused_hooks_window_stands_still_while_another_hook_keeps_failing(
    db_url: str, daemon_factory: DaemonFactory, receiver_factory: ReceiverFactory, tmp_path: Path
) -> None:
    up, down = await receiver_factory(), await receiver_factory(Switch(503))
    window = 2.0
    settings = paused_settings(db_url, [up.url, down.url], retry_window_seconds=window)
    config = str(write_toml(tmp_path / "efd.toml", settings))
    daemon = await daemon_factory(settings)
    status, _ = await api(daemon.port, "POST", "/admin/destinations/hooks/pause", {"hook": 1})
    assert status == 200
    await send(daemon.port, "m-1")
    await down.wait_for(1)
    await asyncio.sleep(window + 1.5)  # hook 2 failed all along: its window alone has closed
    assert up.received == []
    assert statuses(db_url) == {"m-1": "pending"}
    code, out, _ = await asyncio.to_thread(
        run_cli, "inspect", "--source", "web", "--message-id", "m-1", "--config", config
    )
    assert code == 0
    assert "hook 1 of hooks: paused since" in out
    status, _ = await api(daemon.port, "POST", "/admin/destinations/hooks/resume", {"hook": 1})
    assert status == 200
    await up.wait_for(1)
    await eventually(lambda: statuses(db_url) == {"m-1": "delivered"})


async def test_a_run_of_failures_outlives_a_restart(
    db_url: str, daemon_factory: DaemonFactory, receiver_factory: ReceiverFactory
) -> None:
    receiver = await receiver_factory(Switch(503))
    hours = 0.002  # 7.2 s; the run is written to the store after half of it
    settings = paused_settings(db_url, [receiver.url], disable_after_hours=hours)
    daemon = await daemon_factory(settings)
    await send(daemon.port, "m-1")
    await receiver.wait_for(1)
    began = receiver.received[0].at
    failing = "SELECT since FROM pauses WHERE kind = 'failing'"
    await eventually(lambda: sql(db_url, failing), timeout=15)
    await daemon.stop()
    restarted = time.time()
    daemon = await daemon_factory(settings)
    rows = await eventually(
        lambda: sql(db_url, "SELECT reason FROM pauses WHERE kind = 'disabled'"), timeout=20
    )
    # The run counted from before the restart: the reason names its start.
    since = rows[0][0].removeprefix("failing since ").split(" ")[0]
    started = datetime.fromisoformat(since.replace("Z", "+00:00")).timestamp()
    assert started < restarted
    assert abs(started - began) < 2
