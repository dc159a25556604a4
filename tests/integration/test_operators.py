"""The operator's tools: inspect, the delivery list, redrive and replay, through the admin
API and the CLI. Real daemons, real receivers on 127.0.0.1, SQLite and PostgreSQL."""

from __future__ import annotations

import asyncio
import contextlib
import io
import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from aiohttp import web

from efd import cli
from efd.delivery import dispatcher
from efd.segment import webhooks
from efd.store import operations
from tests.conftest import (
    ROOT,
    SECRET,
    DaemonFactory,
    ReceiverFactory,
    eventually,
    post,
    settings_dict,
    sql,
    write_toml,
)
from tests.integration.test_regulations import api

TOKEN = "adm-secret-0123456789"


def ops_settings(db_url: str, hooks: list[str], token: str | None = TOKEN) -> dict[str, Any]:
    settings = settings_dict(db_url, hooks)
    if token is not None:
        settings["server"]["admin_token"] = token
    return settings


async def send(port: int, message_id: str, user_id: str = "u1") -> None:
    status, answer = await post(
        port, "/v1/track", {"userId": user_id, "event": "Bought", "messageId": message_id}
    )
    assert status == 200, answer


def statuses(db_url: str) -> dict[str, str]:
    rows = sql(
        db_url,
        "SELECT m.message_id, d.status FROM deliveries d JOIN messages m ON m.id = d.message_pk"
        " WHERE d.replay_of IS NULL",
    )
    return {message_id: status for message_id, status in rows}


class Switch:
    """A receiver's behaviour: answers `status` until changed."""

    def __init__(self, status: int) -> None:
        self.status = status

    async def __call__(self, _request: web.Request, _n: int) -> web.StreamResponse:
        return web.json_response({"status": self.status}, status=self.status)


# -- inspect and the list --------------------------------------------------------------------


async def test_inspect_shows_the_message_its_deliveries_and_attempts(
    db_url: str, daemon_factory: DaemonFactory, receiver_factory: ReceiverFactory
) -> None:
    receiver = await receiver_factory()
    daemon = await daemon_factory(ops_settings(db_url, [receiver.url]))
    await send(daemon.port, "m-1")
    await receiver.wait_for(1)
    await eventually(lambda: statuses(db_url) == {"m-1": "delivered"})

    status, answer = await api(daemon.port, "GET", "/admin/messages/web/m-1")
    assert status == 200, answer
    assert answer["source"] == "web"
    assert answer["messageId"] == "m-1"
    assert (answer["type"], answer["userId"], answer["event"]) == ("track", "u1", "Bought")
    assert answer["anonymousId"] is None
    assert answer["receivedAt"].endswith("Z")
    assert answer["body"] == receiver.received[0].json()
    [delivery] = answer["deliveries"]
    assert delivery["destination"] == "hooks"
    assert delivery["status"] == "delivered"
    assert delivery["attemptCount"] == 1
    assert delivery["nextAttemptAt"] is None
    assert delivery["replayOf"] is None
    assert delivery["windowEndsAt"] > answer["receivedAt"]
    [attempt] = delivery["attempts"]
    assert attempt["url"] == receiver.url
    assert attempt["statusCode"] == 200
    assert attempt["error"] is None
    assert attempt["durationMs"] >= 0
    assert json.loads(attempt["response"]) == {"ok": True}

    status, answer = await api(daemon.port, "GET", "/admin/messages/web/nope")
    assert (status, answer["code"]) == (404, "not_found")
    status, answer = await api(daemon.port, "GET", "/admin/messages/other/m-1")
    assert status == 404


async def test_the_list_filters_and_pages_newest_first(
    db_url: str, daemon_factory: DaemonFactory, receiver_factory: ReceiverFactory
) -> None:
    receiver = await receiver_factory()
    daemon = await daemon_factory(ops_settings(db_url, [receiver.url]))
    for n in range(5):
        await send(daemon.port, f"m-{n}", user_id="u-even" if n % 2 == 0 else "u-odd")
    await eventually(lambda: set(statuses(db_url).values()) == {"delivered"})

    seen: list[str] = []
    cursor = None
    pages = 0
    while True:
        path = "/admin/deliveries?limit=2" + (f"&cursor={cursor}" if cursor else "")
        status, answer = await api(daemon.port, "GET", path)
        assert status == 200, answer
        assert len(answer["deliveries"]) <= 2
        seen += [d["messageId"] for d in answer["deliveries"]]
        pages += 1
        cursor = answer["nextCursor"]
        if cursor is None:
            break
    assert seen == ["m-4", "m-3", "m-2", "m-1", "m-0"]
    assert pages == 3

    async def ids(query: str) -> list[str]:
        status, answer = await api(daemon.port, "GET", f"/admin/deliveries?{query}")
        assert status == 200, answer
        return [d["messageId"] for d in answer["deliveries"]]

    assert await ids("user_id=u-odd") == ["m-3", "m-1"]
    assert await ids("message_id=m-2&destination=hooks&status=delivered") == ["m-2"]
    assert await ids("status=failed") == []
    assert await ids("destination=elsewhere") == []
    assert await ids("since=1h") == ["m-4", "m-3", "m-2", "m-1", "m-0"]
    assert await ids("until=1h") == []
    assert await ids("since=2020-01-01T00:00:00Z&until=2020-01-02") == []
    status, answer = await api(daemon.port, "GET", "/admin/deliveries?message_id=m-0")
    [row] = answer["deliveries"]
    assert set(row) == {
        "id",
        "source",
        "messageId",
        "destination",
        "status",
        "attemptCount",
        "receivedAt",
        "nextAttemptAt",
        "windowEndsAt",
        "userId",
        "type",
        "event",
        "replayOf",
        "url",
    }
    assert row["url"] is None  # a webhooks destination's: its hook URLs
    assert (row["source"], row["userId"], row["type"], row["event"]) == (
        "web",
        "u-even",
        "track",
        "Bought",
    )


# -- redrive -----------------------------------------------------------------------------------


async def test_redrive_sends_failed_deliveries_again_and_leaves_purged_ones(
    db_url: str,
    daemon_factory: DaemonFactory,
    receiver_factory: ReceiverFactory,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # Far beyond the test's waits: a redriven delivery arrives because the API woke the
    # dispatcher, not because it polled.
    monkeypatch.setattr(dispatcher, "_IDLE_POLL", 600.0)
    switch = Switch(400)  # final: each delivery fails at once
    receiver = await receiver_factory(switch)
    daemon = await daemon_factory(ops_settings(db_url, [receiver.url]))
    for n in range(3):
        await send(daemon.port, f"m-{n}")
    await eventually(lambda: statuses(db_url) == dict.fromkeys(("m-0", "m-1", "m-2"), "failed"))
    # m-2's payload is purged, as a deletion request leaves it.
    sql(db_url, "UPDATE messages SET body = NULL WHERE message_id = 'm-2'")
    switch.status = 200

    status, answer = await api(daemon.port, "POST", "/admin/redrive", {"dry_run": True})
    assert (status, answer) == (200, {"count": 2})
    status, answer = await api(
        daemon.port, "POST", "/admin/redrive", {"status": "expired", "dry_run": True}
    )
    assert answer == {"count": 0}
    assert statuses(db_url) == dict.fromkeys(("m-0", "m-1", "m-2"), "failed")

    status, answer = await api(
        daemon.port, "POST", "/admin/redrive", {"destination": "hooks", "since": "1h"}
    )
    assert (status, answer) == (200, {"count": 2})
    await eventually(
        lambda: statuses(db_url) == {"m-0": "delivered", "m-1": "delivered", "m-2": "failed"}
    )
    delivered = [r.json()["messageId"] for r in receiver.received[3:]]
    assert sorted(delivered) == ["m-0", "m-1"]
    # The history stays: the failed attempt and the successful one.
    rows = sql(
        db_url,
        "SELECT m.message_id, a.status_code FROM attempts a JOIN deliveries d"
        " ON d.id = a.delivery_id JOIN messages m ON m.id = d.message_pk ORDER BY a.id",
    )
    assert sorted(rows) == sorted(
        [("m-0", 400), ("m-1", 400), ("m-2", 400), ("m-0", 200), ("m-1", 200)]
    )
    status, answer = await api(daemon.port, "POST", "/admin/redrive", {})
    assert answer == {"count": 0}


async def test_a_redrive_larger_than_a_chunk_moves_and_counts_every_delivery(
    db_url: str,
    daemon_factory: DaemonFactory,
    receiver_factory: ReceiverFactory,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(operations, "REDRIVE_CHUNK", 3)
    switch = Switch(400)  # final: each delivery fails at once
    receiver = await receiver_factory(switch)
    daemon = await daemon_factory(ops_settings(db_url, [receiver.url]))
    names = [f"m-{n}" for n in range(8)]
    for name in names:
        await send(daemon.port, name)
    await eventually(lambda: statuses(db_url) == dict.fromkeys(names, "failed"))
    switch.status = 200
    status, answer = await api(daemon.port, "POST", "/admin/redrive", {"dry_run": True})
    assert (status, answer) == (200, {"count": 8})
    status, answer = await api(daemon.port, "POST", "/admin/redrive", {})
    assert (status, answer) == (200, {"count": 8})
    await eventually(lambda: statuses(db_url) == dict.fromkeys(names, "delivered"))
    assert sorted(r.json()["messageId"] for r in receiver.received[8:]) == names


# -- replay ------------------------------------------------------------------------------------


async def test_replay_sends_a_delivered_message_again_under_its_webhook_id(
    db_url: str,
    daemon_factory: DaemonFactory,
    receiver_factory: ReceiverFactory,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(dispatcher, "_IDLE_POLL", 600.0)
    receiver = await receiver_factory()
    settings = ops_settings(db_url, [receiver.url])
    settings["destinations"][0].update(
        signing=["x-signature", "standard-webhooks"],
        standard_webhooks_secrets=["whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw"],
    )
    daemon = await daemon_factory(settings)
    await send(daemon.port, "m-1")
    [first] = await receiver.wait_for(1)
    await eventually(lambda: statuses(db_url) == {"m-1": "delivered"})

    status, answer = await api(
        daemon.port, "POST", "/admin/replay", {"source": "web", "messageId": "m-1"}
    )
    assert status == 201, answer
    [created] = answer["deliveries"]
    assert created["destination"] == "hooks"
    second = (await receiver.wait_for(2))[1]
    assert second.body == first.body
    assert second.json()["messageId"] == "m-1"
    # A replay is the same message: the same webhook-id, so a receiver that dedupes sees it.
    assert second.headers["webhook-id"] == first.headers["webhook-id"]
    assert first.headers["webhook-id"].startswith("msg_")
    assert webhooks.verify(SECRET, second.body, second.headers["X-Signature"])

    await eventually(
        lambda: (
            sql(db_url, "SELECT status FROM deliveries ORDER BY id")
            == [("delivered",), ("delivered",)]
        )
    )
    _, found = await api(daemon.port, "GET", "/admin/messages/web/m-1")
    original, replay = found["deliveries"]
    assert replay["id"] == created["id"]
    assert replay["replayOf"] == original["id"]
    assert replay["status"] == "delivered"
    assert len(replay["attempts"]) == 1
    _, page = await api(daemon.port, "GET", "/admin/deliveries?message_id=m-1")
    assert [d["replayOf"] for d in page["deliveries"]] == [original["id"], None]

    for body, expected in (
        ({"source": "web", "messageId": "nope"}, (404, "not_found")),
        (
            {"source": "web", "messageId": "m-1", "destination": "gone"},
            (404, "unknown_destination"),
        ),
        ({"source": "web"}, (400, "missing_field")),
        ({"source": "web", "messageId": 5}, (400, "invalid_field")),
        ({"source": "web", "messageId": "m-1", "extra": 1}, (400, "invalid_field")),
    ):
        status, answer = await api(daemon.port, "POST", "/admin/replay", body)
        assert (status, answer["code"]) == expected, (body, answer)
    sql(db_url, "UPDATE messages SET body = NULL")
    status, answer = await api(
        daemon.port, "POST", "/admin/replay", {"source": "web", "messageId": "m-1"}
    )
    assert (status, answer["code"]) == (409, "message_purged")
    assert sql(db_url, "SELECT count(*) FROM deliveries") == [(2,)]


# -- auth and bad input ------------------------------------------------------------------------

ENDPOINTS = (
    ("GET", "/admin/messages/web/m-1", None),
    ("GET", "/admin/deliveries", None),
    ("POST", "/admin/redrive", {"dry_run": True}),
    ("POST", "/admin/replay", {"source": "web", "messageId": "m-1"}),
)


async def test_admin_endpoints_need_the_token(
    db_url: str, daemon_factory: DaemonFactory, tmp_path: Path
) -> None:
    off = await daemon_factory(ops_settings(db_url, [], token=None))
    for method, path, body in ENDPOINTS:
        status, answer = await api(off.port, method, path, body, token="anything")
        assert (status, answer["code"]) == (403, "admin_api_disabled"), path
    await off.stop()
    on = await daemon_factory(ops_settings(db_url, []))
    for token in (None, "wrong", TOKEN + "x"):
        for method, path, body in ENDPOINTS:
            status, answer = await api(on.port, method, path, body, token=token)
            assert (status, answer["code"]) == (401, "unauthorized"), (path, token)


BAD = [
    ("GET", "/admin/deliveries?since=yesterday", None, "since"),
    ("GET", "/admin/deliveries?until=5x", None, "until"),
    ("GET", "/admin/deliveries?since=", None, "since"),
    ("GET", "/admin/deliveries?destination=", None, "destination"),
    ("GET", "/admin/deliveries?status=lost", None, "status"),
    ("GET", "/admin/deliveries?limit=0", None, "limit"),
    ("GET", "/admin/deliveries?limit=501", None, "limit"),
    ("GET", "/admin/deliveries?cursor=abc", None, "cursor"),
    ("GET", "/admin/deliveries?colour=red", None, "colour"),
    ("GET", "/admin/deliveries?status=failed&status=expired", None, "status"),
    ("POST", "/admin/redrive", b"{not json", "body"),
    ("POST", "/admin/redrive", b"[1]", "body"),
    ("POST", "/admin/redrive", {"status": "pending"}, "status"),
    ("POST", "/admin/redrive", {"destination": ""}, "destination"),
    ("POST", "/admin/redrive", {"dry_run": "yes"}, "dry_run"),
    ("POST", "/admin/redrive", {"since": 5}, "since"),
    ("POST", "/admin/redrive", {"everything": True}, "everything"),
    ("POST", "/admin/replay", b"\xff\xfe", "body"),
    ("POST", "/admin/replay", {"source": "web", "messageId": ""}, "messageId"),
    ("POST", "/admin/replay", {"source": "web", "messageId": "m\ud800"}, "messageId"),
    ("POST", "/admin/replay", {"source": "web\u0000", "messageId": "m-1"}, "source"),
    ("GET", "/admin/messages/web/m%00", None, "messageId"),
    ("GET", "/admin/deliveries?user_id=%00", None, "user_id"),
]


async def test_bad_input_is_a_400_that_names_the_field(
    db_url: str, daemon_factory: DaemonFactory
) -> None:
    daemon = await daemon_factory(ops_settings(db_url, []))
    await send(daemon.port, "m-1")
    sql(db_url, "UPDATE deliveries SET status = 'failed'")
    for method, path, body, field in BAD:
        status, answer = await api(daemon.port, method, path, body)
        assert status == 400, (path, body, answer)
        assert answer["success"] is False
        assert answer["field"] == field, (path, body, answer)
    assert statuses(db_url) == {"m-1": "failed"}


async def test_names_of_nothing_are_404_and_what_the_state_refuses_409(
    db_url: str, daemon_factory: DaemonFactory
) -> None:
    """Rules that depend on what is configured or stored, which no schema can state: never
    a 400, so that a request valid by /openapi.json is never refused as malformed."""
    daemon = await daemon_factory(ops_settings(db_url, []))
    await send(daemon.port, "m-1")
    sql(db_url, "UPDATE deliveries SET status = 'failed'")
    for method, path, body, expected in (
        ("POST", "/admin/redrive", {"destination": "nowhere"}, (404, "unknown_destination")),
        (
            "POST",
            "/admin/replay",
            {"source": "web", "messageId": "m-1", "destination": "nowhere"},
            (404, "unknown_destination"),
        ),
        ("POST", "/admin/replay", {"source": "web", "messageId": "nope"}, (404, "not_found")),
        ("POST", "/admin/discard", {"destination": "hooks"}, (409, "destination_configured")),
    ):
        status, answer = await api(daemon.port, method, path, body)
        assert (status, answer["code"]) == expected, (path, body, answer)
    sql(db_url, "UPDATE deliveries SET destination = 'elsewhere'")
    status, answer = await api(
        daemon.port, "POST", "/admin/replay", {"source": "web", "messageId": "m-1"}
    )
    assert (status, answer["code"]) == (409, "not_routed")
    # A window that ends before it starts matches nothing.
    status, answer = await api(daemon.port, "GET", "/admin/deliveries?since=1h&until=2h")
    assert (status, answer["deliveries"]) == (200, [])
    status, answer = await api(
        daemon.port, "POST", "/admin/redrive", {"since": "1h", "until": "2h", "dry_run": True}
    )
    assert (status, answer) == (200, {"count": 0})
    assert sql(db_url, "SELECT status FROM deliveries") == [("failed",)]


# -- the CLI -----------------------------------------------------------------------------------


def run_cli(*args: str) -> tuple[int, str, str]:
    """`efd …` in this process (the daemon under test runs in it too, so the CLI's writes
    reach the dispatcher only through the store, as from another process)."""
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            code = cli.main(list(args))
        except SystemExit as exit_:
            code = int(exit_.code or 0)
    return code, out.getvalue(), err.getvalue()


async def test_the_cli_inspects_lists_redrives_and_replays(
    db_url: str, daemon_factory: DaemonFactory, receiver_factory: ReceiverFactory, tmp_path: Path
) -> None:
    switch = Switch(400)
    receiver = await receiver_factory(switch)
    settings = ops_settings(db_url, [receiver.url])
    daemon = await daemon_factory(settings)
    config = str(write_toml(tmp_path / "efd.toml", settings))
    await send(daemon.port, "m-1")
    await send(daemon.port, "m-2", user_id="u2")
    await eventually(lambda: statuses(db_url) == {"m-1": "failed", "m-2": "failed"})
    switch.status = 200

    async def efd(*args: str) -> tuple[int, str, str]:
        return await asyncio.to_thread(run_cli, *args, "--config", config)

    code, out, _ = await efd("inspect", "--source", "web", "--message-id", "m-1", "--json")
    assert code == 0
    shown = json.loads(out)
    assert shown["messageId"] == "m-1"
    assert shown["deliveries"][0]["status"] == "failed"
    assert shown["deliveries"][0]["attempts"][0]["statusCode"] == 400
    code, out, _ = await efd("inspect", "--source", "web", "--message-id", "m-1")
    assert code == 0
    assert "failed" in out
    assert receiver.url in out

    code, out, _ = await efd("deliveries", "--status", "failed", "--json")
    assert code == 0
    assert [d["messageId"] for d in json.loads(out)["deliveries"]] == ["m-2", "m-1"]
    code, out, _ = await efd("deliveries", "--user-id", "u2", "--since", "1h")
    assert code == 0
    assert "m-2" in out
    assert "m-1" not in out

    code, out, _ = await efd("redrive", "--dry-run", "--json")
    assert (code, json.loads(out)) == (0, {"count": 2})
    # The real redrive from another process: the daemon learns of it from the store (its
    # poll on SQLite, NOTIFY on PostgreSQL), within the receiver's wait.
    done = await asyncio.to_thread(
        subprocess.run,
        [
            *(sys.executable, "-m", "efd", "redrive", "--config", config),
            *("--status", "failed", "--destination", "hooks", "--json"),
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
    )
    assert (done.returncode, json.loads(done.stdout)) == (0, {"count": 2}), done.stderr
    await receiver.wait_for(4)
    await eventually(lambda: statuses(db_url) == {"m-1": "delivered", "m-2": "delivered"})

    code, out, _ = await efd("replay", "--source", "web", "--message-id", "m-1", "--json")
    assert code == 0
    [created] = json.loads(out)["deliveries"]
    assert created["destination"] == "hooks"
    [*_, again] = await receiver.wait_for(5)
    assert again.json()["messageId"] == "m-1"

    code, _, err = await efd("replay", "--source", "web", "--message-id", "nope")
    assert code == 1
    assert "no message" in err
    for bad in (
        ("deliveries", "--since", "soon"),
        ("deliveries", "--status", "lost"),
        ("deliveries", "--limit", "0"),
        ("redrive", "--status", "pending"),
        ("redrive", "--destination", "nowhere"),
        ("replay", "--source", "web"),
    ):
        code, _, err = await efd(*bad)
        assert code == 2, bad
        assert err.strip(), bad
