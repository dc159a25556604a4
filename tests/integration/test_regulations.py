"""Deletion requests ("regulations"): the API, delete notifications through the normal
delivery path, the purge, suppression, and resuming after a crash. Real receivers,
real daemons, SQLite and PostgreSQL."""

from __future__ import annotations

import asyncio
import json
import time
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from aiohttp import web

from efd.segment import webhooks
from efd.services.regulations import delete_notifications
from efd.store import Store, migrate
from efd.store.regulations import RegulationsStore
from efd.store.suppressions import Suppressions
from tests.conftest import (
    SECRET,
    DaemonFactory,
    DaemonProcess,
    Received,
    Receiver,
    ReceiverFactory,
    eventually,
    free_port,
    metric,
    post,
    settings_dict,
    sql,
    write_toml,
)

TOKEN = "adm-secret-0123456789"


def reg_settings(
    db_url: str, hooks: list[str], mobile: str, token: str | None = TOKEN, **extra: Any
) -> dict[str, Any]:
    """Sources web -> hooks, app -> mobile, and quiet (no destination)."""
    settings = settings_dict(db_url, hooks)
    if token is not None:
        settings["server"]["admin_token"] = token
    settings["sources"] += [
        {"name": "app", "write_key": "wk_app", "destinations": ["mobile"]},
        {"name": "quiet", "write_key": "wk_quiet", "destinations": []},
    ]
    settings["destinations"].append(
        {"name": "mobile", "type": "webhooks", "shared_secret": SECRET, "hooks": [{"url": mobile}]}
    )
    settings.update(extra)
    return settings


async def api(
    port: int, method: str, path: str, body: Any = None, token: str | None = TOKEN
) -> tuple[int, Any]:
    headers = {"Authorization": f"Bearer {token}"} if token is not None else {}
    data = body if isinstance(body, bytes) else (None if body is None else json.dumps(body))
    async with (
        aiohttp.ClientSession() as session,
        session.request(
            method, f"http://127.0.0.1:{port}{path}", data=data, headers=headers
        ) as response,
    ):
        return response.status, await response.json(content_type=None)


def request(type_: str, *ids: str) -> dict[str, Any]:
    return {"regulationType": type_, "subjectType": "USER_ID", "subjectIds": list(ids)}


async def regulate(port: int, body: dict[str, Any], path: str = "/regulations") -> str:
    status, answer = await api(port, "POST", path, body)
    assert status == 200, answer
    assert set(answer) == {"data"}
    assert set(answer["data"]) == {"regulateId"}
    reg_id: str = answer["data"]["regulateId"]
    return reg_id


async def finished(port: int, reg_id: str, timeout: float = 15) -> dict[str, Any]:
    async def check() -> dict[str, Any] | None:
        status, answer = await api(port, "GET", f"/regulations/{reg_id}")
        assert status == 200, answer
        regulation: dict[str, Any] = answer["data"]["regulation"]
        return regulation if regulation["overallStatus"] == "FINISHED" else None

    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if (found := await check()) is not None:
            return found
        await asyncio.sleep(0.05)
    raise AssertionError(f"regulation {reg_id} did not finish")


def deletes(receiver: Receiver) -> list[Received]:
    """Delete notifications a receiver got, each signature checked."""
    found: list[Received] = []
    for r in receiver.received:
        assert webhooks.verify(SECRET, r.body, r.headers["X-Signature"])
        if r.json()["type"] == "delete":
            found.append(r)
    return found


# -- the API ------------------------------------------------------------------------------------


async def test_without_an_admin_token_the_endpoints_are_off_and_say_so(
    db_url: str, daemon_factory: DaemonFactory, receiver_factory: ReceiverFactory
) -> None:
    receiver = await receiver_factory()
    daemon = await daemon_factory(reg_settings(db_url, [receiver.url], receiver.url, token=None))
    for method, path, body in (
        ("POST", "/regulations", request("DELETE_ONLY", "u1")),
        ("POST", "/regulations/sources/web", request("DELETE_ONLY", "u1")),
        ("GET", "/regulations/abc", None),
    ):
        status, answer = await api(daemon.port, method, path, body, token="anything")
        assert status == 403
        assert answer["code"] == "admin_api_disabled"
        assert "admin_token" in answer["message"]
    assert sql(db_url, "SELECT count(*) FROM regulations") == [(0,)]


@pytest.mark.parametrize("token", [None, "wrong", ""])
async def test_a_missing_or_wrong_token_is_401(
    db_url: str, daemon_factory: DaemonFactory, token: str | None
) -> None:
    daemon = await daemon_factory(reg_settings(db_url, [], "http://127.0.0.1:9/x"))
    status, answer = await api(
        daemon.port, "POST", "/regulations", request("DELETE_ONLY", "u1"), token=token
    )
    assert status == 401
    assert answer["code"] == "unauthorized"
    status, _ = await api(daemon.port, "GET", "/regulations/x", token=token)
    assert status == 401
    assert sql(db_url, "SELECT count(*) FROM regulations") == [(0,)]


@pytest.mark.parametrize(
    ("body", "field"),
    [
        ({"subjectType": "USER_ID", "subjectIds": ["u"]}, "regulationType"),
        ({**request("DELETE_ALL", "u")}, "regulationType"),
        ({**request("DELETE_ONLY", "u"), "subjectType": "EMAIL"}, "subjectType"),
        ({"regulationType": "DELETE_ONLY", "subjectType": "USER_ID"}, "subjectIds"),
        ({**request("DELETE_ONLY"), "subjectIds": "u1"}, "subjectIds"),
        (request("DELETE_ONLY"), "subjectIds"),
        ({**request("DELETE_ONLY"), "subjectIds": ["u1", 7]}, "subjectIds[1]"),
        (request("DELETE_ONLY", "u1", ""), "subjectIds[1]"),
        (request("DELETE_ONLY", "u1", "u\x00x"), "subjectIds[1]"),
        ({**request("DELETE_ONLY", "u1"), "subjectID": ["x"]}, "subjectID"),
    ],
)
async def test_a_bad_body_is_400_naming_the_field(
    db_url: str, daemon_factory: DaemonFactory, body: dict[str, Any], field: str
) -> None:
    daemon = await daemon_factory(reg_settings(db_url, [], "http://127.0.0.1:9/x"))
    status, answer = await api(daemon.port, "POST", "/regulations", body)
    assert status == 400, answer
    assert answer["field"] == field
    assert answer["code"] in ("missing_field", "invalid_field")
    assert answer["success"] is False


async def test_invalid_json_and_unknown_source_and_unknown_id(
    db_url: str, daemon_factory: DaemonFactory
) -> None:
    daemon = await daemon_factory(reg_settings(db_url, [], "http://127.0.0.1:9/x"))
    status, answer = await api(daemon.port, "POST", "/regulations", b"{not json")
    assert (status, answer["code"]) == (400, "invalid_json")
    status, answer = await api(daemon.port, "POST", "/regulations", b"[]")
    assert (status, answer["code"]) == (400, "invalid_body")
    status, answer = await api(
        daemon.port, "POST", "/regulations/sources/nope", request("DELETE_ONLY", "u")
    )
    assert (status, answer["field"]) == (404, "source")
    status, answer = await api(daemon.port, "GET", "/regulations/nope")
    assert (status, answer["code"]) == (404, "not_found")
    status, answer = await api(daemon.port, "GET", "/regulations/a%00b")  # not a 503
    assert (status, answer["code"]) == (404, "not_found")


async def test_at_most_5000_subject_ids(db_url: str, daemon_factory: DaemonFactory) -> None:
    daemon = await daemon_factory(reg_settings(db_url, [], "http://127.0.0.1:9/x"))
    ids = [f"user-{i}" for i in range(5001)]
    status, answer = await api(daemon.port, "POST", "/regulations", request("UNSUPPRESS", *ids))
    assert status == 400
    assert answer["field"] == "subjectIds"
    assert "5000" in answer["message"]
    reg_id = await regulate(daemon.port, request("UNSUPPRESS", *ids[:5000]))
    regulation = await finished(daemon.port, reg_id)
    assert regulation["subjectCount"] == 5000


# -- delete notifications -------------------------------------------------------------------------


async def test_one_delete_notification_per_user_to_each_affected_source(
    db_url: str, daemon_factory: DaemonFactory, receiver_factory: ReceiverFactory
) -> None:
    hooks, mobile = await receiver_factory(), await receiver_factory()
    daemon = await daemon_factory(reg_settings(db_url, [hooks.url], mobile.url))
    before = time.time()
    reg_id = await regulate(daemon.port, request("DELETE_ONLY", "u1", "u2", "u1"))
    await hooks.wait_for(2)
    await mobile.wait_for(2)
    regulation = await finished(daemon.port, reg_id)
    for receiver in (hooks, mobile):
        bodies = [r.json() for r in deletes(receiver)]
        assert sorted(b["userId"] for b in bodies) == ["u1", "u2"]
        for request_, body in zip(deletes(receiver), bodies, strict=True):
            assert list(body) == ["type", "userId", "timestamp"]
            assert body["type"] == "delete"
            assert request_.body == webhooks.encode(body)  # the exact JSON.stringify bytes
            assert body["timestamp"].endswith("Z")
            assert len(body["timestamp"]) == 24
    stamp = deletes(hooks)[0].json()["timestamp"]
    assert stamp >= time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(before - 1))
    assert regulation["regulationType"] == "DELETE_ONLY"
    assert regulation["subjectCount"] == 2
    assert regulation["finishedAt"] is not None
    await eventually(lambda: sql(db_url, "SELECT count(*) FROM deliveries "
                                 "WHERE status = 'delivered'") == [(4,)])  # fmt: skip
    _, answer = await api(daemon.port, "GET", f"/regulations/{reg_id}")
    streams = {s["source"]: s for s in answer["data"]["regulation"]["streamStatus"]}
    assert streams["web"]["status"] == "FINISHED"
    assert streams["web"]["notifications"] == 2
    assert streams["web"]["destinations"] == [
        {
            "name": "hooks",
            "delivered": 2,
            "pending": 0,
            "queued": 0,
            "failed": 0,
            "expired": 0,
            "discarded": 0,
            "filtered": 0,  # destination filters never stop a delete notification
        }
    ]
    assert streams["app"]["destinations"][0]["name"] == "mobile"
    assert streams["app"]["destinations"][0]["delivered"] == 2
    assert streams["quiet"] == {
        "source": "quiet",
        "status": "SKIPPED",
        "reason": "no webhook destination",
    }


async def test_a_source_regulation_notifies_only_that_source(
    db_url: str, daemon_factory: DaemonFactory, receiver_factory: ReceiverFactory
) -> None:
    hooks, mobile = await receiver_factory(), await receiver_factory()
    daemon = await daemon_factory(reg_settings(db_url, [hooks.url], mobile.url))
    reg_id = await regulate(
        daemon.port, request("DELETE_ONLY", "u1"), path="/regulations/sources/app"
    )
    await mobile.wait_for(1)
    regulation = await finished(daemon.port, reg_id)
    assert sql(db_url, "SELECT count(*) FROM deliveries WHERE destination = 'hooks'") == [(0,)]
    assert not hooks.received
    assert [s["source"] for s in regulation["streamStatus"]] == ["app"]
    assert regulation["source"] == "app"


async def test_delete_notifications_follow_the_delivery_rules(
    db_url: str, daemon_factory: DaemonFactory, receiver_factory: ReceiverFactory
) -> None:
    async def flaky(_request: web.Request, n: int) -> web.StreamResponse:
        return web.Response(status=503 if n <= 2 else 200)

    async def broken(_request: web.Request, _n: int) -> web.StreamResponse:
        return web.Response(status=500)

    good, bad = await receiver_factory(flaky), await receiver_factory(broken)
    mobile = await receiver_factory()
    daemon = await daemon_factory(reg_settings(db_url, [good.url, bad.url], mobile.url))
    await regulate(daemon.port, request("DELETE_ONLY", "u1"))
    await eventually(
        lambda: sql(db_url, "SELECT d.status, d.attempts FROM deliveries d JOIN messages m "
                    "ON m.id = d.message_pk WHERE d.destination = 'hooks'") == [("delivered", 3)]
    )  # fmt: skip
    # Retried through two 503s; then the first success won and neither hook was tried again.
    assert len(good.received) == 3
    assert len(bad.received) == 3
    assert {r.body for r in good.received + bad.received} == {good.received[0].body}
    assert len(deletes(mobile)) == 1


# -- purge and suppression -------------------------------------------------------------------------


async def test_delete_purges_payloads_profiles_and_memberships(
    db_url: str, daemon_factory: DaemonFactory, receiver_factory: ReceiverFactory
) -> None:
    hooks, mobile = await receiver_factory(), await receiver_factory()
    settings = reg_settings(db_url, [hooks.url], mobile.url)
    settings["audiences"] = [
        {"name": "Pros", "destinations": ["mobile"], "condition": "trait('plan') = 'pro'"}
    ]
    daemon = await daemon_factory(settings)
    batch = [
        {"type": "track", "anonymousId": "a1", "event": "Browse", "messageId": "m-anon"},
        {"type": "identify", "userId": "u1", "anonymousId": "a1", "traits": {"plan": "pro"}},
        {"type": "track", "userId": "u1", "event": "Buy", "messageId": "m-u1"},
        {"type": "identify", "userId": "u2", "traits": {"plan": "pro"}, "messageId": "m-u2"},
    ]
    assert (await post(daemon.port, "/v1/batch", {"batch": batch}))[0] == 200
    await daemon.sync(daemon.computation("Pros"))
    await eventually(lambda: len(mobile.received) >= 2)
    assert sql(db_url, "SELECT count(*) FROM computed_values") == [(2,)]

    reg_id = await regulate(daemon.port, request("DELETE_ONLY", "u1"))
    regulation = await finished(daemon.port, reg_id)
    # The payloads of u1's messages are gone, including the anonymous ones before login and
    # the audience identify sent about u1; u2's are untouched; delete notifications stay.
    rows = dict(sql(db_url, "SELECT message_id, body IS NULL FROM messages WHERE type <> 'delete'"))
    assert rows.pop("m-anon")
    assert rows.pop("m-u1")
    assert not rows.pop("m-u2")
    personas = sql(
        db_url,
        "SELECT coalesce(user_id, '-'), body IS NULL FROM messages WHERE source = 'personas'",
    )
    assert sorted((user, bool(purged)) for user, purged in personas) == [
        ("-", True),
        ("u2", False),
    ]
    assert sql(db_url, "SELECT count(*) FROM messages WHERE type = 'delete' AND body IS NULL") == [
        (0,)
    ]
    # Delivery rows remain, for audit.
    assert sql(db_url, "SELECT count(*) FROM deliveries d JOIN messages m ON m.id = d.message_pk "
               "WHERE m.message_id = 'm-u1'") == [(1,)]  # fmt: skip
    assert sql(db_url, "SELECT id FROM profiles") == [("u2",)]
    assert sql(db_url, "SELECT count(*) FROM identities") == [(0,)]
    assert sql(db_url, "SELECT count(*) FROM events") == [(0,)]
    assert sql(db_url, "SELECT profile_id FROM computed_values") == [("u2",)]
    # m-anon, u1's identify, m-u1, and the audience identify about u1.
    assert regulation["purged"] == {
        "messages": 4,
        "profiles": 1,
        "identities": 1,
        "events": 2,
        "computedValues": 1,
    }
    assert sql(db_url, "SELECT count(*) FROM regulation_subjects WHERE requested = 0") == [(0,)]
    # The next sync says nothing about the deleted user.
    before = len(mobile.received)
    assert (await daemon.sync(daemon.computation("Pros"))).sent == 0
    assert len(mobile.received) == before


async def test_suppression_drops_later_messages_until_unsuppress(
    db_url: str, daemon_factory: DaemonFactory, receiver_factory: ReceiverFactory
) -> None:
    hooks, mobile = await receiver_factory(), await receiver_factory()
    daemon = await daemon_factory(reg_settings(db_url, [hooks.url], mobile.url))
    reg_id = await regulate(daemon.port, request("SUPPRESS_ONLY", "u1"))
    for user in ("u1", "u2"):
        status, answer = await post(
            daemon.port, "/v1/track", {"userId": user, "event": "E", "messageId": f"s-{user}"}
        )
        assert (status, answer) == (200, {"success": True})
    await hooks.wait_for(1)
    await finished(daemon.port, reg_id)
    assert [r.json()["userId"] for r in hooks.received] == ["u2"]
    assert sql(db_url, "SELECT message_id FROM messages") == [("s-u2",)]
    # SUPPRESS_ONLY sends no delete notification.
    assert not deletes(mobile)
    assert not deletes(hooks)
    async with (
        aiohttp.ClientSession() as session,
        session.get(
            f"http://127.0.0.1:{daemon.port}/metrics",
            headers={"Authorization": f"Bearer {TOKEN}"},
        ) as response,
    ):
        metrics = await response.text()
    assert metric(metrics, "efd_messages_suppressed_total", source="web") == 1
    assert metric(metrics, "efd_messages_received_total", source="web") == 1

    await finished(daemon.port, await regulate(daemon.port, request("UNSUPPRESS", "u1")))
    status, _ = await post(daemon.port, "/v1/track", {"userId": "u1", "event": "E"})
    assert status == 200
    await hooks.wait_for(2)
    assert hooks.received[1].json()["userId"] == "u1"


async def test_suppress_with_delete_notifies_purges_and_suppresses(
    db_url: str, daemon_factory: DaemonFactory, receiver_factory: ReceiverFactory
) -> None:
    hooks, mobile = await receiver_factory(), await receiver_factory()
    daemon = await daemon_factory(reg_settings(db_url, [hooks.url], mobile.url))
    await post(daemon.port, "/v1/track", {"userId": "u1", "event": "E", "messageId": "before"})
    await hooks.wait_for(1)
    reg_id = await regulate(daemon.port, request("SUPPRESS_WITH_DELETE", "u1"))
    await post(daemon.port, "/v1/track", {"userId": "u1", "event": "E", "messageId": "after"})
    regulation = await finished(daemon.port, reg_id)
    await hooks.wait_for(2)
    await mobile.wait_for(1)
    assert [r.json()["type"] for r in hooks.received] == ["track", "delete"]
    assert sql(db_url, "SELECT message_id, body FROM messages WHERE type = 'track'") == [
        ("before", None)
    ]
    assert regulation["purged"]["messages"] == 1


# -- resuming -------------------------------------------------------------------------------------


async def test_a_regulation_left_running_by_a_dead_process_resumes_without_resending(
    db_url: str, daemon_factory: DaemonFactory, receiver_factory: ReceiverFactory
) -> None:
    """Deterministic: one source done, the lease lapsed; a new daemon finishes the rest."""
    hooks, mobile = await receiver_factory(), await receiver_factory()
    migrate.upgrade(db_url)
    store = Store(db_url)
    regulations = RegulationsStore(store, Suppressions(store))
    now = time.time()
    regulations.create_regulation("deadbeef", "DELETE_ONLY", None, ["u1", "u2"], now - 5)
    claim = regulations.claim_regulation("dead-process", now, now + 60)
    assert claim is not None
    rows = delete_notifications(claim, "web", ["hooks"], ["u1", "u2"], now)
    regulations.record_notifications(
        claim, "web", ["hooks"], rows, now=now, lease_until=now - 1
    )  # and then its lease lapsed
    store.dispose()
    assert sql(db_url, "SELECT status, owner FROM regulations") == [("RUNNING", "dead-process")]

    daemon = await daemon_factory(reg_settings(db_url, [hooks.url], mobile.url))
    regulation = await finished(daemon.port, "deadbeef")
    await hooks.wait_for(2)
    await mobile.wait_for(2)
    await eventually(
        lambda: sql(db_url, "SELECT count(*) FROM deliveries WHERE status = 'pending'") == [(0,)]
    )  # every notification's delivery finished: none can arrive again
    # web's notifications were committed by the dead process and are delivered, once.
    assert sorted(r.json()["userId"] for r in deletes(hooks)) == ["u1", "u2"]
    assert sorted(r.json()["userId"] for r in deletes(mobile)) == ["u1", "u2"]
    assert sql(
        db_url, "SELECT source, count(*) FROM messages WHERE type = 'delete' "
        "GROUP BY source ORDER BY source"
    ) == [("app", 2), ("web", 2)]  # fmt: skip
    assert {s["source"]: s["status"] for s in regulation["streamStatus"]} == {
        "web": "FINISHED",
        "app": "FINISHED",
        "quiet": "SKIPPED",
    }


@pytest.mark.slow
async def test_kill_9_right_after_the_request_and_the_regulation_finishes_after_restart(
    db_url: str, receiver_factory: ReceiverFactory, tmp_path: Path
) -> None:
    hooks, mobile = await receiver_factory(), await receiver_factory()
    port = free_port()
    settings = reg_settings(
        db_url,
        [hooks.url],
        mobile.url,
        delivery={"allowed_networks": ["127.0.0.0/8"], "timeout_seconds": 2, "lease_seconds": 8},
        logging={"level": "INFO"},
    )
    settings["server"] = {"host": "127.0.0.1", "port": port, "admin_token": TOKEN}
    config = write_toml(tmp_path / "efd.toml", settings)
    process = DaemonProcess(config, port, tmp_path / "efd.log").start()
    users = [f"user-{i:04d}" for i in range(5000)]
    try:
        reg_id = await regulate(port, request("SUPPRESS_WITH_DELETE", *users))
        process.kill()
        [(status,)] = sql(db_url, "SELECT status FROM regulations")
        assert status in ("INITIALIZED", "RUNNING"), "the kill came too late to test anything"

        process.start()
        await finished(port, reg_id, timeout=60)
        # Exactly one notification per user and source was ever queued, whatever was done
        # before the kill; each is delivered.
        assert sql(
            db_url, "SELECT source, count(*), count(DISTINCT user_id) FROM messages "
            "WHERE type = 'delete' GROUP BY source ORDER BY source"
        ) == [("app", 5000, 5000), ("web", 5000, 5000)]  # fmt: skip
        await eventually(
            lambda: (
                {r.json()["userId"] for r in hooks.received} == set(users)
                and {r.json()["userId"] for r in mobile.received} == set(users)
            ),
            timeout=60,
        )
        assert sql(db_url, "SELECT count(*) FROM suppressions") == [(5000,)]
    finally:
        process.ensure_stopped()


# -- a finished deletion leaves nothing of the user ------------------------------------------

FORGET = ("user-to-forget-7c1", "anon-to-forget-9d2", "Event Only They Did", "prop-value-3e8")
KEEP = ("user-kept-4a5", "Event Others Did")
# The regulation's own records, and the delete notifications with their deliveries and
# attempts, name the user on purpose; everything else must not.
_ALLOWED_TABLES = {"regulations", "regulation_subjects", "suppressions"}


def _texts_naming(db_url: str, needles: tuple[str, ...]) -> list[tuple[str, str, str]]:
    """(table, column, value) of every stored text that contains one of `needles`, outside
    the regulation's records and the delete notifications."""
    from efd.store.schema import metadata

    found = []
    notifications = "SELECT id FROM messages WHERE type = 'delete'"
    exclude = {
        "messages": f"id NOT IN ({notifications})",
        "deliveries": f"message_pk NOT IN ({notifications})",
        "attempts": "delivery_id NOT IN (SELECT id FROM deliveries WHERE message_pk IN "
        f"({notifications}))",
    }
    for table in metadata.sorted_tables:
        if table.name in _ALLOWED_TABLES:
            continue
        where = exclude.get(table.name, "1 = 1")
        for column in table.columns:
            for (value,) in sql(db_url, f"SELECT {column.name} FROM {table.name} WHERE {where}"):
                text = str(value)
                if any(needle in text for needle in needles):
                    found.append((table.name, column.name, text[:120]))
    return found


@pytest.mark.parametrize("kind", ["DELETE_ONLY", "SUPPRESS_WITH_DELETE"])
async def test_a_finished_deletion_leaves_nothing_of_the_user(
    db_url: str, daemon_factory: DaemonFactory, receiver_factory: ReceiverFactory, kind: str
) -> None:
    async def echo(request: web.Request, _n: int) -> web.StreamResponse:
        return web.Response(body=await request.read())  # receivers often echo the body

    hooks, mobile = await receiver_factory(echo), await receiver_factory(echo)
    settings = reg_settings(db_url, [hooks.url], mobile.url)
    settings["audiences"] = [
        {
            "name": "Doers",
            "destinations": ["mobile"],
            "condition": f"event('{FORGET[2]}').count() >= 1",
        }
    ]
    daemon = await daemon_factory(settings)
    user, anonymous, event, value = FORGET
    batch = [
        {"type": "page", "anonymousId": anonymous, "properties": {"q": value}},
        {"type": "identify", "userId": user, "anonymousId": anonymous, "traits": {"t": value}},
        {"type": "track", "userId": user, "event": event, "properties": {"p": value}},
        {"type": "track", "userId": KEEP[0], "event": KEEP[1]},
    ]
    assert (await post(daemon.port, "/v1/batch", {"batch": batch}))[0] == 200
    await daemon.sync(daemon.computation("Doers"))
    await eventually(lambda: len(hooks.received) >= 4 and len(mobile.received) >= 1)
    await eventually(
        lambda: sql(db_url, "SELECT count(*) FROM deliveries WHERE status <> 'delivered'") == [(0,)]
    )
    assert {t for t, _, _ in _texts_naming(db_url, FORGET)} >= {
        "messages", "attempts", "profiles", "identities", "events", "computed_values"
    }  # fmt: skip

    reg_id = await regulate(daemon.port, request(kind, user))
    await finished(daemon.port, reg_id)
    await eventually(lambda: len(deletes(hooks)) == 1)

    assert _texts_naming(db_url, FORGET) == []
    assert _texts_naming(db_url, KEEP) != []  # the other user's data is untouched
    # What the audit keeps: every row, its ids, statuses, times and status codes.
    assert sql(db_url, "SELECT count(*) FROM messages WHERE type <> 'delete'") == [(5,)]
    assert sql(
        db_url,
        "SELECT count(*) FROM attempts a JOIN deliveries d ON d.id = a.delivery_id "
        "WHERE a.status_code = 200 AND d.status = 'delivered'",
    ) >= [(5,)]
