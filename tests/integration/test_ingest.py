"""The ingestion API end to end: HTTP in, rows in a real database."""

from __future__ import annotations

import asyncio
import base64
import gzip
import json
from typing import Any

import aiohttp
import pytest

from efd.segment.messages import MAX_BATCH_MESSAGES, MAX_MESSAGE_BYTES, MAX_REQUEST_BYTES
from tests.conftest import (
    WRITE_KEY,
    DaemonFactory,
    ReceiverFactory,
    StartedDaemon,
    eventually,
    metric,
    post,
    settings_dict,
    sql,
)
from tests.unit.test_messages import MISSING_FIELDS

TRACK = {"type": "track", "userId": "u-1", "event": "Signed Up"}


def stored(db_url: str) -> list[tuple[str, str, str]]:
    return sql(db_url, "SELECT message_id, type, body FROM messages ORDER BY id")


@pytest.fixture
async def daemon(
    db_url: str, receiver_factory: ReceiverFactory, daemon_factory: DaemonFactory
) -> StartedDaemon:
    receiver = await receiver_factory()
    return await daemon_factory(settings_dict(db_url, [receiver.url]))


@pytest.mark.parametrize(
    ("path", "payload", "type_"),
    [
        ("/v1/identify", {"userId": "u", "traits": {"plan": "pro"}}, "identify"),
        ("/v1/track", {"userId": "u", "event": "E"}, "track"),
        ("/v1/page", {"anonymousId": "a", "properties": {"path": "/"}}, "page"),
        ("/v1/screen", {"userId": "u", "name": "Home"}, "screen"),
        ("/v1/group", {"userId": "u", "groupId": "g"}, "group"),
        ("/v1/alias", {"userId": "u", "previousId": "p"}, "alias"),
        ("/v1/t", {"userId": "u", "event": "E"}, "track"),
        ("/v1/i", {"userId": "u"}, "identify"),
    ],
)
async def test_single_endpoints_store_one_message(
    db_url: str, daemon: StartedDaemon, path: str, payload: dict[str, Any], type_: str
) -> None:
    status, answer = await post(daemon.port, path, payload)
    assert (status, answer) == (200, {"success": True})
    [(_, stored_type, body)] = stored(db_url)
    assert stored_type == type_
    assert json.loads(body)["type"] == type_


@pytest.mark.parametrize("path", ["/v1/batch", "/v1/import"])
async def test_batch_and_import(db_url: str, daemon: StartedDaemon, path: str) -> None:
    batch = [{**TRACK, "messageId": f"m{i}"} for i in range(3)]
    assert (await post(daemon.port, path, {"batch": batch}))[0] == 200
    assert [row[0] for row in stored(db_url)] == ["m0", "m1", "m2"]


async def test_write_key_in_body_and_text_plain(db_url: str, daemon: StartedDaemon) -> None:
    async with (
        aiohttp.ClientSession() as session,
        session.post(
            f"http://127.0.0.1:{daemon.port}/v1/track",
            data=json.dumps({**TRACK, "writeKey": WRITE_KEY}),
            headers={"Content-Type": "text/plain"},
        ) as response,
    ):
        assert response.status == 200
    assert len(stored(db_url)) == 1


@pytest.mark.parametrize(
    "headers",
    [
        {},  # no key at all
        {"Authorization": "Basic " + "d3Jvbmc6"},  # "wrong:"
        {"Authorization": "Bearer abc"},
        {"Authorization": "Basic !!!"},
    ],
)
async def test_missing_or_unknown_write_key_is_401(
    db_url: str, daemon: StartedDaemon, headers: dict[str, str]
) -> None:
    async with (
        aiohttp.ClientSession() as session,
        session.post(
            f"http://127.0.0.1:{daemon.port}/v1/track", json=TRACK, headers=headers
        ) as response,
    ):
        assert response.status == 401
        answer = await response.json()
    assert answer["success"] is False
    assert answer["code"] == "unauthorized"
    assert stored(db_url) == []


@pytest.mark.parametrize(
    "credentials",
    [
        f"{WRITE_KEY}:",  # what Segment's libraries send
        f"{WRITE_KEY}:any-password",  # the password is ignored
        WRITE_KEY,  # no colon at all
    ],
)
@pytest.mark.parametrize("scheme", ["Basic ", "basic  "])
async def test_basic_auth_forms_name_the_source(
    db_url: str, daemon: StartedDaemon, scheme: str, credentials: str
) -> None:
    header = scheme + base64.b64encode(credentials.encode()).decode()
    status, _ = await post(daemon.port, "/v1/track", TRACK, {"Authorization": header})
    assert status == 200
    assert len(stored(db_url)) == 1


async def test_unknown_write_key_in_body_is_401(db_url: str, daemon: StartedDaemon) -> None:
    async with (
        aiohttp.ClientSession() as session,
        session.post(
            f"http://127.0.0.1:{daemon.port}/v1/track", json={**TRACK, "writeKey": "nope"}
        ) as response,
    ):
        assert response.status == 401
    assert stored(db_url) == []


async def test_gzip_body(db_url: str, daemon: StartedDaemon) -> None:
    body = gzip.compress(json.dumps({"batch": [TRACK, TRACK]}).encode())
    status, _ = await post(daemon.port, "/v1/batch", body, {"Content-Encoding": "gzip"})
    assert status == 200
    assert len(stored(db_url)) == 2


async def test_invalid_gzip_is_400(db_url: str, daemon: StartedDaemon) -> None:
    status, answer = await post(daemon.port, "/v1/batch", b"not gzip", {"Content-Encoding": "gzip"})
    assert (status, answer["code"]) == (400, "invalid_body")
    assert stored(db_url) == []


async def test_gzip_bomb_is_refused_without_inflating_it(
    db_url: str, daemon: StartedDaemon
) -> None:
    bomb = gzip.compress(b'{"batch": [' + b" " * (50 * 1024 * 1024) + b"]}")
    status, answer = await post(daemon.port, "/v1/batch", bomb, {"Content-Encoding": "gzip"})
    assert (status, answer["code"]) == (400, "request_too_large")


async def test_invalid_json_is_400(db_url: str, daemon: StartedDaemon) -> None:
    for payload in (b"{", b"[1,2]", b'{"batch": [NaN]}', b"\xff\xfe"):
        status, answer = await post(daemon.port, "/v1/batch", payload)
        assert status == 400, payload
        assert answer["success"] is False
    assert stored(db_url) == []


async def test_a_batch_is_all_or_nothing(db_url: str, daemon: StartedDaemon) -> None:
    batch = [TRACK, TRACK, {"type": "track", "userId": "u"}, TRACK]
    status, answer = await post(daemon.port, "/v1/batch", {"batch": batch})
    assert status == 400
    assert answer == {
        "success": False,
        "code": "missing_field",
        "message": "batch[2]: track needs event",
        "field": "event",
        "index": 2,
    }
    assert stored(db_url) == []
    assert sql(db_url, "SELECT count(*) FROM deliveries") == [(0,)]


# One case of the table end to end, on both backends; every case: tests/unit/test_messages.py.
@pytest.mark.parametrize(("message", "field"), MISSING_FIELDS[:1])
async def test_missing_required_field_is_named(
    db_url: str, daemon: StartedDaemon, message: dict[str, Any], field: str
) -> None:
    status, answer = await post(daemon.port, "/v1/batch", {"batch": [message]})
    assert (status, answer["field"], answer["index"]) == (400, field, 0)
    assert stored(db_url) == []


async def test_message_over_32_kib_is_refused_with_its_index(
    db_url: str, daemon: StartedDaemon
) -> None:
    big = {**TRACK, "properties": {"blob": "x" * MAX_MESSAGE_BYTES}}
    status, answer = await post(daemon.port, "/v1/batch", {"batch": [TRACK, big]})
    assert (status, answer["code"], answer["index"]) == (400, "message_too_large", 1)
    assert str(MAX_MESSAGE_BYTES) in answer["message"]
    assert stored(db_url) == []


async def test_request_over_500_kib_is_refused(db_url: str, daemon: StartedDaemon) -> None:
    batch = [{**TRACK, "properties": {"blob": "x" * 30000}} for _ in range(20)]
    status, answer = await post(daemon.port, "/v1/batch", {"batch": batch})
    assert (status, answer["code"]) == (400, "request_too_large")
    assert str(MAX_REQUEST_BYTES) in answer["message"]
    assert stored(db_url) == []


async def test_batch_over_2500_messages_is_refused(db_url: str, daemon: StartedDaemon) -> None:
    batch = [{"type": "track", "userId": "u", "event": "E"}] * (MAX_BATCH_MESSAGES + 1)
    status, answer = await post(daemon.port, "/v1/batch", {"batch": batch})
    assert (status, answer["code"]) == (400, "batch_too_large")
    assert stored(db_url) == []


async def test_batch_context_integrations_and_sent_at_apply_to_each_message(
    db_url: str, daemon: StartedDaemon
) -> None:
    payload = {
        "batch": [
            {**TRACK, "messageId": "a", "timestamp": "2026-01-01T00:00:10Z"},
            {**TRACK, "messageId": "b", "context": {"ip": "1.2.3.4"}},
        ],
        "context": {"ip": "9.9.9.9", "library": {"name": "x"}},
        "sentAt": "2026-01-01T00:00:20Z",
    }
    assert (await post(daemon.port, "/v1/batch", payload))[0] == 200
    first, second = (json.loads(row[2]) for row in stored(db_url))
    assert first["context"] == {"ip": "9.9.9.9", "library": {"name": "x"}}
    assert second["context"] == {"ip": "1.2.3.4", "library": {"name": "x"}}
    # Client clock 10 s behind sentAt: the event happened 10 s before receipt.
    [(timestamp, received_at)] = sql(
        db_url, "SELECT timestamp, received_at FROM messages WHERE message_id = 'a'"
    )
    assert received_at - timestamp == pytest.approx(10, abs=0.01)


async def test_repeated_message_id_is_acknowledged_but_not_delivered_again(
    db_url: str, receiver_factory: ReceiverFactory, daemon_factory: DaemonFactory
) -> None:
    receiver = await receiver_factory()
    daemon = await daemon_factory(settings_dict(db_url, [receiver.url]))
    message = {**TRACK, "messageId": "once"}
    assert (await post(daemon.port, "/v1/track", message))[0] == 200
    await receiver.wait_for(1)
    assert (await post(daemon.port, "/v1/track", message))[0] == 200
    assert (await post(daemon.port, "/v1/batch", {"batch": [message, message]}))[0] == 200
    # Acknowledged, not stored: no delivery exists that could send them again.
    assert len(stored(db_url)) == 1
    assert sql(db_url, "SELECT count(*) FROM deliveries") == [(1,)]
    assert len(receiver.received) == 1
    # A different source may use the same messageId.
    assert sql(db_url, "SELECT count(*) FROM deliveries") == [(1,)]


async def test_integrations_map_routes(
    db_url: str, receiver_factory: ReceiverFactory, daemon_factory: DaemonFactory
) -> None:
    receiver = await receiver_factory()
    daemon = await daemon_factory(settings_dict(db_url, [receiver.url]))
    messages = [
        {**TRACK, "messageId": "default"},
        {**TRACK, "messageId": "all-off", "integrations": {"All": False}},
        {
            **TRACK,
            "messageId": "all-off-webhooks-on",
            "integrations": {"All": False, "Webhooks": True},
        },
        {**TRACK, "messageId": "webhooks-off", "integrations": {"Webhooks": False}},
        {**TRACK, "messageId": "case", "integrations": {"webhooks": False}},
    ]
    assert (await post(daemon.port, "/v1/batch", {"batch": messages}))[0] == 200
    await receiver.wait_for(3)
    await eventually(
        lambda: sql(db_url, "SELECT count(*) FROM deliveries WHERE status = 'pending'") == [(0,)]
    )  # every delivery finished: nothing more can arrive
    got = sorted(r.json()["messageId"] for r in receiver.received)
    assert got == ["all-off-webhooks-on", "case", "default"]
    # Every message is stored, routed or not.
    assert len(stored(db_url)) == 5


async def test_healthz_and_metrics(db_url: str, daemon: StartedDaemon) -> None:
    await post(daemon.port, "/v1/track", TRACK)
    await post(daemon.port, "/v1/track", {"userId": "u"})
    await eventually(lambda: sql(db_url, "SELECT status FROM deliveries") == [("delivered",)])
    async with aiohttp.ClientSession() as session:
        async with session.get(f"http://127.0.0.1:{daemon.port}/healthz") as response:
            assert response.status == 200
        async with session.get(f"http://127.0.0.1:{daemon.port}/metrics") as response:
            assert response.status == 200
            text = await response.text()
    assert metric(text, "efd_messages_received_total", source="web") == 1
    assert metric(text, "efd_messages_rejected_total", reason="missing_field") == 1
    assert metric(text, "efd_deliveries_delivered_total", destination="hooks") == 1
    assert metric(text, "efd_backlog_pending", destination="hooks", configured="true") == 0
    assert metric(text, "efd_attempt_duration_seconds_count", destination="hooks") == 1


async def test_metrics_need_the_admin_token_when_one_is_set(
    db_url: str, daemon_factory: DaemonFactory
) -> None:
    daemon = await daemon_factory(
        settings_dict(
            db_url, server={"host": "127.0.0.1", "port": 0, "admin_token": "s3cret-metrics-token"}
        )
    )
    async with aiohttp.ClientSession() as session:
        async with session.get(f"http://127.0.0.1:{daemon.port}/metrics") as response:
            assert response.status == 401
        async with session.get(
            f"http://127.0.0.1:{daemon.port}/metrics",
            headers={"Authorization": "Bearer s3cret-metrics-token"},
        ) as response:
            assert response.status == 200


async def test_concurrent_requests_are_all_stored(db_url: str, daemon: StartedDaemon) -> None:
    async def one(i: int) -> int:
        batch = [{**TRACK, "messageId": f"c{i}-{j}"} for j in range(10)]
        return (await post(daemon.port, "/v1/batch", {"batch": batch}))[0]

    results = await asyncio.gather(*(one(i) for i in range(50)))
    assert set(results) == {200}
    assert sql(db_url, "SELECT count(*) FROM messages") == [(500,)]
    assert sql(db_url, "SELECT count(DISTINCT message_pk) FROM deliveries") == [(500,)]


async def test_retention_purges_old_finished_messages_once_per_cluster(
    db_url: str, daemon: StartedDaemon
) -> None:
    await post(daemon.port, "/v1/track", {**TRACK, "messageId": "old"})
    await eventually(lambda: sql(db_url, "SELECT status FROM deliveries") == [("delivered",)])
    long_ago = 30 * 86400
    sql(db_url, "UPDATE messages SET received_at = received_at - :d", d=long_ago)
    sql(db_url, "UPDATE deliveries SET finished_at = finished_at - :d", d=long_ago)
    await post(daemon.port, "/v1/track", {**TRACK, "messageId": "new"})
    await daemon.retention()
    assert [row[0] for row in stored(db_url)] == ["new"]
    assert sql(
        db_url, "SELECT count(*) FROM attempts WHERE delivery_id NOT IN (SELECT id FROM deliveries)"
    ) == [(0,)]
    # The turn is taken: a second run in the same interval does nothing.
    sql(db_url, "UPDATE messages SET received_at = received_at - :d", d=long_ago)
    sql(
        db_url,
        "UPDATE deliveries SET finished_at = finished_at - :d WHERE finished_at IS NOT NULL",
        d=long_ago,
    )
    await daemon.retention()
    assert len(stored(db_url)) == 1
