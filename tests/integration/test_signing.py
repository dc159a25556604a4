"""Standard Webhooks beside X-Signature: what a receiver built on the stock
`standardwebhooks` library gets from efd, through a secret rotation, on retries and for
delete notifications. Real daemons, real receivers, SQLite and PostgreSQL."""

from __future__ import annotations

import base64
import json

import pytest
from aiohttp import web
from standardwebhooks.webhooks import Webhook

from efd import webhooks
from efd.listen import describe
from tests.conftest import SECRET, eventually, post, settings_dict, sql

OLD = "whsec_" + base64.b64encode(b"old-secret-of-24-bytes!!").decode()
NEW = "whsec_" + base64.b64encode(b"the-new-secret-of-32-bytes-here!").decode()
TOKEN = "signing-admin-token-0123"
TRACK = {"userId": "u", "event": "E"}


def signed_settings(db_url: str, url: str, signing: list[str], secrets: list[str]) -> dict:  # type: ignore[type-arg]
    settings = settings_dict(db_url, [url])
    settings["destinations"][0].update(signing=signing, standard_webhooks_secrets=secrets)
    return settings


async def test_both_schemes_verify_through_a_rotation(db_url, receiver_factory, daemon_factory):
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
    assert got.headers["webhook-id"] == "m1" == body["messageId"]
    # ... and a Segment-style receiver its X-Signature, on the same request.
    assert webhooks.verify(SECRET, got.body, got.headers["X-Signature"])
    # efd listen says so too.
    text = describe(got.body, got.headers, SECRET, [webhooks.standard_secret(OLD)])
    assert "(valid)" in text.splitlines()[1]
    assert "webhook-signature: (valid)" in text.splitlines()[2]


async def test_standard_webhooks_alone_and_the_same_id_on_every_retry(
    db_url, receiver_factory, daemon_factory
):
    async def fail_twice(_request: web.Request, n: int) -> web.StreamResponse:
        return web.Response(status=503 if n <= 2 else 200)

    receiver = await receiver_factory(fail_twice)
    daemon = await daemon_factory(
        signed_settings(db_url, receiver.url, ["standard-webhooks"], [NEW])
    )
    await post(daemon.port, "/v1/track", {"userId": "u", "event": "E", "messageId": "again"})
    await eventually(lambda: sql(db_url, "SELECT status FROM deliveries") == [("delivered",)])
    assert len(receiver.received) == 3
    assert {r.headers["webhook-id"] for r in receiver.received} == {"again"}
    for r in receiver.received:
        Webhook(NEW).verify(r.body, r.headers)  # each attempt signed with its own time
        assert "X-Signature" not in r.headers


async def test_delete_notifications_are_signed_the_same_way(
    db_url, receiver_factory, daemon_factory
):
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
    assert got.headers["webhook-id"].startswith("delete:")
    assert webhooks.verify(SECRET, got.body, got.headers["X-Signature"])


# -- every acknowledged message can be delivered -------------------------------------------------


@pytest.mark.parametrize("message_id", ["m\r\nX-Injected: 1", "m\x1b[2J", "m\x7f", "é\x85"])
async def test_a_message_id_with_a_control_character_is_refused_not_stored(
    db_url, receiver_factory, daemon_factory, message_id
):
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
