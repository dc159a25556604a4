"""Ordered delivery per user (`ordering = "per_user"`) against real receivers on 127.0.0.1,
on SQLite and PostgreSQL: each user's messages arrive in the order efd acknowledged them,
a user whose messages keep failing holds back only their own, redrive goes back into the
lane, replay does not, and operators see the blocked lanes. Crash safety (kill -9 of a real
daemon) is test_ordering_crash's."""

from __future__ import annotations

import asyncio
import json
import random
from collections import defaultdict
from pathlib import Path
from typing import Any

from aiohttp import web

from tests.conftest import DaemonFactory, ReceiverFactory, eventually, metric, post, sql, write_toml
from tests.integration.test_operators import TOKEN, ops_settings, run_cli
from tests.integration.test_regulations import api


def ordered_settings(db_url: str, hooks: list[str], **delivery: Any) -> dict[str, Any]:
    settings = ops_settings(db_url, hooks)
    settings["destinations"][0]["ordering"] = "per_user"
    settings["delivery"].update(delivery)
    return settings


class ByMessage:
    """A receiver's behaviour: the status for each messageId (`answer`, else 200); notes
    the messageIds each user's requests carried, in the order they came."""

    def __init__(self) -> None:
        self.answer: dict[str, int] = {}
        self.failing_users: set[str] = set()
        self.seen: dict[str, list[str]] = defaultdict(list)

    async def __call__(self, request: web.Request, _n: int) -> web.StreamResponse:
        body = json.loads(await request.read())
        user, message_id = body.get("userId") or body.get("anonymousId"), body["messageId"]
        self.seen[user].append(message_id)
        status = self.answer.get(message_id, 503 if user in self.failing_users else 200)
        return web.json_response({}, status=status)


async def batch(port: int, messages: list[tuple[str, str]]) -> None:
    """(userId, messageId) pairs as one batch request: acknowledged together, in this order."""
    status, answer = await post(
        port,
        "/v1/batch",
        {
            "batch": [
                {"type": "track", "userId": u, "event": "E", "messageId": m} for u, m in messages
            ]
        },
    )
    assert status == 200, answer


def statuses(db_url: str) -> dict[str, str]:
    rows = sql(
        db_url,
        "SELECT m.message_id, d.status FROM deliveries d JOIN messages m ON m.id = d.message_pk"
        " WHERE d.replay_of IS NULL",
    )
    return {message_id: status for message_id, status in rows}


async def test_a_failing_user_holds_only_their_own_lane(
    db_url: str, daemon_factory: DaemonFactory, receiver_factory: ReceiverFactory, tmp_path: Path
) -> None:
    receiver_state = ByMessage()
    receiver_state.failing_users = {"bad"}
    receiver = await receiver_factory(receiver_state)
    settings = ordered_settings(db_url, [receiver.url], circuit_failures=1000)
    daemon = await daemon_factory(settings)
    users = ["good1", "good2", "good3", "bad"]
    await batch(daemon.port, [(u, f"{u}-{i}") for i in range(5) for u in users])

    def good_done() -> bool:
        found = statuses(db_url)
        return all(found[f"{u}-{i}"] == "delivered" for u in users[:3] for i in range(5))

    await eventually(good_done, timeout=30)
    for user in users[:3]:
        assert receiver_state.seen[user] == [f"{user}-{i}" for i in range(5)]
    # The failing user's head is retried; nothing after it has been sent.
    await eventually(lambda: len(receiver_state.seen["bad"]) >= 3)
    assert set(receiver_state.seen["bad"]) == {"bad-0"}
    found = statuses(db_url)
    assert [found[f"bad-{i}"] for i in range(5)] == ["pending"] + ["queued"] * 4

    # What operators see: the admin API, the message view, the metric and the CLI.
    status, answer = await api(daemon.port, "GET", "/admin/destinations")
    assert status == 200, answer
    [hooks] = answer["destinations"]
    assert hooks["ordering"] == "per_user"
    assert hooks["lanes"]["blocked"] == 1
    assert hooks["lanes"]["oldestBlockedMessageId"] == "bad-0"
    assert hooks["lanes"]["oldestBlockedSince"] is not None
    assert hooks["backlog"] == 5  # the head and the four behind it
    status, shown = await api(daemon.port, "GET", "/admin/messages/web/bad-3")
    assert status == 200
    [delivery] = shown["deliveries"]
    assert (delivery["status"], delivery["waitingFor"]) == ("queued", "bad-0")
    assert delivery["nextAttemptAt"] is None
    status, text = await _metrics(daemon.port)
    assert metric(text, "efd_lanes_blocked", destination="hooks") == 1
    config = str(write_toml(tmp_path / "efd.toml", settings))
    code, out, _ = await asyncio.to_thread(run_cli, "lanes", "--config", config)
    assert code == 0
    assert "hooks: 1 blocked lane;" in out
    assert "bad-0" in out
    code, out, _ = await asyncio.to_thread(
        run_cli, "inspect", "--source", "web", "--message-id", "bad-2", "--config", config
    )
    assert code == 0
    assert "waits for message bad-0" in out

    # The receiver recovers: the lane drains, in order.
    receiver_state.failing_users.clear()
    await eventually(lambda: set(statuses(db_url).values()) == {"delivered"}, timeout=30)
    sent = receiver_state.seen["bad"]
    assert [m for i, m in enumerate(sent) if i == 0 or sent[i - 1] != m] == [
        f"bad-{i}" for i in range(5)
    ]
    status, answer = await api(daemon.port, "GET", "/admin/destinations")
    assert answer["destinations"][0]["lanes"]["blocked"] == 0
    assert sql(db_url, "SELECT count(*) FROM lanes") == [(0,)]


async def test_one_users_failing_head_does_not_open_the_hooks_circuit(
    db_url: str, daemon_factory: DaemonFactory, receiver_factory: ReceiverFactory
) -> None:
    receiver_state = ByMessage()
    receiver_state.failing_users = {"bad"}
    receiver = await receiver_factory(receiver_state)
    # A probe far off: a message that had to wait for it would not arrive within the test.
    settings = ordered_settings(
        db_url, [receiver.url], circuit_failures=3, circuit_probe_seconds=3600
    )
    daemon = await daemon_factory(settings)
    await batch(daemon.port, [("bad", "bad-0")])
    # The head, retried past the threshold with no other traffic.
    await eventually(lambda: len(receiver_state.seen["bad"]) >= 5)
    status, answer = await api(daemon.port, "GET", "/admin/destinations")
    assert status == 200, answer
    assert [h["circuit"] for h in answer["destinations"][0]["hooks"]] == ["closed"]
    await batch(daemon.port, [("good", "good-0")])
    await eventually(lambda: statuses(db_url).get("good-0") == "delivered")
    assert receiver_state.seen["good"] == ["good-0"]
    assert statuses(db_url)["bad-0"] == "pending"  # still retried


async def _metrics(port: int) -> tuple[int, str]:
    import aiohttp

    async with (
        aiohttp.ClientSession() as session,
        session.get(
            f"http://127.0.0.1:{port}/metrics", headers={"Authorization": f"Bearer {TOKEN}"}
        ) as response,
    ):
        return response.status, await response.text()


async def test_each_lane_arrives_in_order_through_random_failures(
    db_url: str, daemon_factory: DaemonFactory, receiver_factory: ReceiverFactory
) -> None:
    rng = random.Random(27)

    async def flaky(request: web.Request, n: int) -> web.StreamResponse:
        body = json.loads(await request.read())
        seen[body["userId"]].append(body["messageId"])
        return web.json_response({}, status=503 if rng.random() < 0.3 else 200)

    seen: dict[str, list[str]] = defaultdict(list)
    receiver = await receiver_factory(flaky)
    daemon = await daemon_factory(ordered_settings(db_url, [receiver.url], circuit_failures=1000))
    users = [f"u{i}" for i in range(6)]
    expected = {u: [f"{u}-{i}" for i in range(8)] for u in users}
    for chunk in range(4):  # four requests, each two messages of every user
        await batch(
            daemon.port, [(u, f"{u}-{i}") for i in (2 * chunk, 2 * chunk + 1) for u in users]
        )
    await eventually(lambda: set(statuses(db_url).values()) == {"delivered"}, timeout=60)
    for user in users:
        order = [expected[user].index(m) for m in seen[user]]
        assert order == sorted(order), (user, seen[user])  # never backwards
        assert sorted(set(seen[user])) == sorted(expected[user])


async def test_redrive_rejoins_the_lane_and_replay_is_out_of_order(
    db_url: str, daemon_factory: DaemonFactory, receiver_factory: ReceiverFactory
) -> None:
    state = ByMessage()
    state.answer = {"r-1": 400, "r-3": 503}  # r-1 fails for good, r-3 keeps retrying
    receiver = await receiver_factory(state)
    daemon = await daemon_factory(ordered_settings(db_url, [receiver.url], circuit_failures=1000))
    await batch(daemon.port, [("u", f"r-{i}") for i in range(1, 4)])
    await eventually(lambda: statuses(db_url).get("r-2") == "delivered")
    await eventually(lambda: state.seen["u"].count("r-3") >= 2)
    assert statuses(db_url)["r-1"] == "failed"
    # r-3 is the lane's head, retrying. A redriven r-1 waits behind it, and goes before r-4,
    # which arrives after the redrive.
    state.answer.pop("r-1")
    status, answer = await api(daemon.port, "POST", "/admin/redrive", {"destination": "hooks"})
    assert (status, answer) == (200, {"count": 1})
    assert statuses(db_url)["r-1"] == "queued"
    await batch(daemon.port, [("u", "r-4")])
    state.answer.pop("r-3")
    await eventually(lambda: set(statuses(db_url).values()) == {"delivered"}, timeout=30)
    tail = state.seen["u"][state.seen["u"].index("r-2") + 1 :]
    assert [m for m in tail if m != "r-3"] == ["r-1", "r-4"]
    assert tail[-2:] == ["r-1", "r-4"]

    # A replay goes at once, outside the lane, and says so.
    status, answer = await api(
        daemon.port, "POST", "/admin/replay", {"source": "web", "messageId": "r-2"}
    )
    assert status == 201, answer
    assert answer["deliveries"][0]["outOfOrder"] is True
    await eventually(lambda: state.seen["u"][-1] == "r-2")


async def test_an_unordered_destination_says_so_and_replays_in_no_lane(
    db_url: str, daemon_factory: DaemonFactory, receiver_factory: ReceiverFactory
) -> None:
    receiver = await receiver_factory()
    daemon = await daemon_factory(ops_settings(db_url, [receiver.url]))
    await batch(daemon.port, [("u", "m-1"), ("u", "m-2")])
    await receiver.wait_for(2)  # both at once: no lane
    assert sql(db_url, "SELECT count(*) FROM lanes") == [(0,)]
    await eventually(lambda: set(statuses(db_url).values()) == {"delivered"})
    status, answer = await api(daemon.port, "GET", "/admin/destinations")
    assert (answer["destinations"][0]["ordering"], answer["destinations"][0]["lanes"]) == (
        "none",
        None,
    )
    status, answer = await api(
        daemon.port, "POST", "/admin/replay", {"source": "web", "messageId": "m-1"}
    )
    assert status == 201, answer
    assert answer["deliveries"][0]["outOfOrder"] is False


async def test_turning_ordering_off_by_reload_sends_what_waited(
    db_url: str, daemon_factory: DaemonFactory, receiver_factory: ReceiverFactory
) -> None:
    state = ByMessage()
    state.failing_users = {"u"}
    receiver = await receiver_factory(state)
    settings = ordered_settings(db_url, [receiver.url], circuit_failures=1000)
    daemon = await daemon_factory(settings)
    await batch(daemon.port, [("u", f"m-{i}") for i in range(3)])
    await eventually(lambda: len(state.seen["u"]) >= 2)
    assert set(state.seen["u"]) == {"m-0"}
    state.failing_users.clear()
    settings["destinations"][0]["ordering"] = "none"
    from efd import config

    await daemon.reload(config.load(None, **settings))
    await eventually(lambda: set(statuses(db_url).values()) == {"delivered"}, timeout=30)
    assert sql(db_url, "SELECT count(*) FROM lanes") == [(0,)]
