"""Standard Webhooks beside X-Signature: what a receiver built on the stock
`standardwebhooks` library gets from efd, through a secret rotation, on retries and for
delete notifications; the webhook-id a receiver dedupes on; the Node.js verifiers. Real
daemons, real receivers, SQLite and PostgreSQL."""

from __future__ import annotations

import asyncio
import base64
import json
import re
import time
from typing import Any

import pytest
from aiohttp import web
from standardwebhooks.webhooks import Webhook

from efd.cli.listen import describe, verify
from efd.segment import webhooks
from tests.conftest import (
    SECRET,
    DaemonFactory,
    ReceiverFactory,
    basic,
    eventually,
    post,
    settings_dict,
    sql,
)
from tests.jsclients import JS, node

OLD = "whsec_" + base64.b64encode(b"old-secret-of-24-bytes!!").decode()
NEW = "whsec_" + base64.b64encode(b"the-new-secret-of-32-bytes-here!").decode()
TOKEN = "signing-admin-token-0123"
WEBHOOK_ID = re.compile(r"msg_[a-z2-7]{26}")
TRACK = {"userId": "u", "event": "E"}


def signed_settings(
    db_url: str, url: str, signing: list[str], secrets: list[str]
) -> dict[str, Any]:
    settings = settings_dict(db_url, [url])
    settings["destinations"][0].update(signing=signing, standard_webhooks_secrets=secrets)
    return settings


async def test_both_schemes_verify_through_a_rotation(
    db_url: str, receiver_factory: ReceiverFactory, daemon_factory: DaemonFactory
) -> None:
    receiver = await receiver_factory()
    daemon = await daemon_factory(
        signed_settings(db_url, receiver.url, ["x-signature", "standard-webhooks"], [NEW, OLD])
    )
    assert (await post(daemon.port, "/v1/track", {"userId": "u", "event": "E", "messageId": "m1"}))[
        0
    ] == 200
    [got] = await receiver.wait_for(1)
    body = json.loads(got.body)
    # A receiver on either secret of the rotation verifies, with the stock library.
    assert Webhook(NEW).verify(got.body, got.headers) == body
    assert Webhook(OLD).verify(got.body, got.headers) == body
    assert WEBHOOK_ID.fullmatch(got.headers["webhook-id"])
    assert body["messageId"] == "m1"  # the client's, untouched
    # ... and a Segment-style receiver its X-Signature, on the same request.
    assert webhooks.verify(SECRET, got.body, got.headers["X-Signature"])
    # efd listen says so too.
    keys = [webhooks.standard_secret(OLD)]
    verdicts = verify(got.body, got.headers, [SECRET], keys, time.time())
    assert verdicts.refused is None
    text = describe(got.body, got.headers, verdicts)
    assert "(valid)" in text.splitlines()[1]
    assert "webhook-signature: (valid)" in text.splitlines()[2]


async def test_standard_webhooks_alone_and_the_same_id_on_every_retry(
    db_url: str, receiver_factory: ReceiverFactory, daemon_factory: DaemonFactory
) -> None:
    async def fail_twice(_request: web.Request, n: int) -> web.StreamResponse:
        return web.Response(status=503 if n <= 2 else 200)

    receiver = await receiver_factory(fail_twice)
    daemon = await daemon_factory(
        signed_settings(db_url, receiver.url, ["standard-webhooks"], [NEW])
    )
    await post(daemon.port, "/v1/track", {"userId": "u", "event": "E", "messageId": "again"})
    await eventually(lambda: sql(db_url, "SELECT status FROM deliveries") == [("delivered",)])
    assert len(receiver.received) == 3
    [webhook_id] = {r.headers["webhook-id"] for r in receiver.received}
    assert WEBHOOK_ID.fullmatch(webhook_id)
    for r in receiver.received:
        Webhook(NEW).verify(r.body, r.headers)  # each attempt signed with its own time
        assert "X-Signature" not in r.headers


async def test_delete_notifications_are_signed_the_same_way(
    db_url: str, receiver_factory: ReceiverFactory, daemon_factory: DaemonFactory
) -> None:
    receiver = await receiver_factory()
    settings = signed_settings(db_url, receiver.url, ["x-signature", "standard-webhooks"], [NEW])
    settings["server"]["admin_token"] = TOKEN
    daemon = await daemon_factory(settings)
    status, _ = await post(
        daemon.port,
        "/regulations",
        {"regulationType": "DELETE_ONLY", "subjectType": "USER_ID", "subjectIds": ["u9"]},
        headers={"Authorization": f"Bearer {TOKEN}"},
    )
    assert status == 200
    [got] = await receiver.wait_for(1)
    assert Webhook(NEW).verify(got.body, got.headers) == {
        "type": "delete",
        "userId": "u9",
        "timestamp": json.loads(got.body)["timestamp"],
    }
    # Derived from the stored notification like any message's: ASCII, unique per row.
    [(pk, source, message_id, received_at)] = sql(
        db_url, "SELECT id, source, message_id, received_at FROM messages"
    )
    assert message_id.startswith("delete:")
    assert got.headers["webhook-id"] == webhooks.webhook_id(pk, source, message_id, received_at)
    assert WEBHOOK_ID.fullmatch(got.headers["webhook-id"])
    assert webhooks.verify(SECRET, got.body, got.headers["X-Signature"])


# -- what a receiver dedupes on -----------------------------------------------------------------


async def test_the_same_message_id_from_two_sources_arrives_under_two_webhook_ids(
    db_url: str, receiver_factory: ReceiverFactory, daemon_factory: DaemonFactory
) -> None:
    receiver = await receiver_factory()
    settings = signed_settings(db_url, receiver.url, ["x-signature", "standard-webhooks"], [NEW])
    settings["sources"].append({"name": "app", "write_key": "wk_app", "destinations": ["hooks"]})
    daemon = await daemon_factory(settings)
    message = {**TRACK, "messageId": "shared-1"}
    assert (await post(daemon.port, "/v1/track", message))[0] == 200
    assert (await post(daemon.port, "/v1/track", message, headers=basic("wk_app")))[0] == 200
    first, second = await receiver.wait_for(2)
    # Two messages: a receiver that drops a repeated webhook-id keeps both.
    assert first.headers["webhook-id"] != second.headers["webhook-id"]
    for got in (first, second):
        assert WEBHOOK_ID.fullmatch(got.headers["webhook-id"])
        assert Webhook(NEW).verify(got.body, got.headers)["messageId"] == "shared-1"


async def test_x_signature_receivers_get_the_webhook_id_too(
    db_url: str, receiver_factory: ReceiverFactory, daemon_factory: DaemonFactory
) -> None:
    receiver = await receiver_factory()
    settings = settings_dict(db_url, [receiver.url])
    settings["sources"].append({"name": "app", "write_key": "wk_app", "destinations": ["hooks"]})
    daemon = await daemon_factory(settings)
    message = {**TRACK, "messageId": "shared-2"}
    assert (await post(daemon.port, "/v1/track", message))[0] == 200
    assert (await post(daemon.port, "/v1/track", message, headers=basic("wk_app")))[0] == 200
    first, second = await receiver.wait_for(2)
    assert first.headers["webhook-id"] != second.headers["webhook-id"]
    for got in (first, second):
        assert WEBHOOK_ID.fullmatch(got.headers["webhook-id"])
        assert webhooks.verify(SECRET, got.body, got.headers["X-Signature"])
        assert "webhook-signature" not in got.headers


async def test_a_retry_keeps_its_webhook_id_across_a_restart(
    db_url: str, receiver_factory: ReceiverFactory, daemon_factory: DaemonFactory
) -> None:
    answer = {"status": 503}

    async def behaviour(_request: web.Request, _n: int) -> web.StreamResponse:
        return web.Response(status=answer["status"])

    receiver = await receiver_factory(behaviour)
    settings = signed_settings(db_url, receiver.url, ["standard-webhooks"], [NEW])
    daemon = await daemon_factory(settings)
    assert (await post(daemon.port, "/v1/track", {**TRACK, "messageId": "r-1"}))[0] == 200
    [first] = await receiver.wait_for(1)
    await daemon.stop()
    answer["status"] = 200
    daemon = await daemon_factory(settings)
    await eventually(lambda: sql(db_url, "SELECT status FROM deliveries") == [("delivered",)])
    later = receiver.received[1:]
    assert later
    assert {r.headers["webhook-id"] for r in later} == {first.headers["webhook-id"]}
    for got in receiver.received:
        Webhook(NEW).verify(got.body, got.headers)


# -- every acknowledged message can be delivered -------------------------------------------------


@pytest.mark.parametrize("message_id", ["m\r\nX-Injected: 1", "m\x1b[2J", "m\x7f", "é\x85"])
async def test_a_message_id_with_a_control_character_is_refused_not_stored(
    db_url: str, receiver_factory: ReceiverFactory, daemon_factory: DaemonFactory, message_id: str
) -> None:
    receiver = await receiver_factory()
    daemon = await daemon_factory(
        signed_settings(db_url, receiver.url, ["x-signature", "standard-webhooks"], [NEW])
    )
    status, answer = await post(daemon.port, "/v1/track", {**TRACK, "messageId": message_id})
    assert (status, answer["code"], answer["field"]) == (400, "invalid_field", "messageId")
    batch = {
        "batch": [{"type": "track", **TRACK}, {"type": "track", **TRACK, "messageId": message_id}]
    }
    status, answer = await post(daemon.port, "/v1/batch", batch)
    assert (status, answer["field"], answer["index"]) == (400, "messageId", 1)
    assert sql(db_url, "SELECT count(*) FROM messages") == [(0,)]


@pytest.fixture
def node_program() -> str:
    """node, checked before any database is made for a test that would skip."""
    return node()


async def test_node_verifiers_accept_every_delivery_whatever_the_message_id(
    node_program: str, db_url: str, daemon_factory: DaemonFactory
) -> None:
    """The npm `standardwebhooks` and `svix` verifiers, behind Node's own HTTP server, which
    reads header bytes as Latin-1: a webhook-id that was not ASCII would never verify."""
    proc = await asyncio.create_subprocess_exec(
        node_program,
        "verify-receiver.mjs",
        NEW,
        cwd=JS,
        stdin=asyncio.subprocess.PIPE,
        stdout=asyncio.subprocess.PIPE,
    )
    assert proc.stdin is not None
    assert proc.stdout is not None
    try:
        port = json.loads(await asyncio.wait_for(proc.stdout.readline(), 30))["port"]
        daemon = await daemon_factory(
            signed_settings(
                db_url,
                f"http://127.0.0.1:{port}/hook",
                ["x-signature", "standard-webhooks"],
                [NEW, OLD],
            )
        )
        message_ids = ["zoë-✓-\U0001f600", "ascii-1", "\u00e9" * 100]
        for message_id in message_ids:
            status, _ = await post(daemon.port, "/v1/track", {**TRACK, "messageId": message_id})
            assert status == 200
        reports = [
            json.loads(await asyncio.wait_for(proc.stdout.readline(), 30)) for _ in message_ids
        ]
        for report in reports:
            assert (report["standardwebhooks"], report["svix"]) == ("ok", "ok"), report
            assert WEBHOOK_ID.fullmatch(report["webhookId"])
        assert sorted(r["messageId"] for r in reports) == sorted(message_ids)
        await eventually(
            lambda: sql(db_url, "SELECT status FROM deliveries") == [("delivered",)] * 3
        )
    finally:
        proc.stdin.close()
        await asyncio.wait_for(proc.wait(), 10)
