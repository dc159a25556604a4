"""Batched actions end to end (docs/actions.md#batches): a warehouse-style receiver on
127.0.0.1 gets JSON arrays of up to `batch_size` events, every event once and in the order efd
accepted it; a retry resends the same bytes under the same webhook-id; a partial batch goes
after `batch_wait_seconds`; `batch_max_bytes` holds; a 413 splits a batch down to single
events; a user's events keep their order; X-Signature covers the body, or the first event;
a kill -9 mid-stream loses nothing and resends only whole batches that were in flight. Real
daemons (`efd serve` for the kill), real receivers, SQLite and PostgreSQL."""

from __future__ import annotations

import asyncio
import base64
import hashlib
import hmac
import json
import time
from collections import Counter
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from aiohttp import web
from standardwebhooks.webhooks import Webhook

from tests.conftest import (
    SECRET,
    DaemonFactory,
    DaemonProcess,
    Received,
    ReceiverFactory,
    eventually,
    free_port,
    post,
    settings_dict,
    sql,
    write_toml,
)
from tests.integration.test_live import TOKEN, events
from tests.integration.test_operators import run_cli
from tests.integration.test_regulations import TOKEN as ADMIN_TOKEN
from tests.integration.test_regulations import api, finished, regulate
from tests.integration.test_regulations import request as regulation

WHSEC = "whsec_" + base64.b64encode(b"batched-secret-of-32-bytes-long!").decode()


def _settings(db_url: str, url: str, **batch: Any) -> dict[str, Any]:
    delivery = batch.pop("delivery", {})
    ordering = batch.pop("ordering", "none")
    action = {"name": "bulk", "trigger": 'type = "track"', "url": url, **batch}
    settings = settings_dict(db_url, delivery=delivery)
    settings["sources"][0]["destinations"] = ["wh"]
    settings["destinations"] = [
        {
            "name": "wh",
            "type": "actions",
            "ordering": ordering,
            "shared_secret": SECRET,
            "signing": ["x-signature", "standard-webhooks"],
            "standard_webhooks_secrets": [WHSEC],
            "actions": [action],
        }
    ]
    return settings


def _events(count: int, users: int = 0, prefix: str = "e", pad: int = 0) -> list[dict[str, Any]]:
    return [
        {
            "type": "track",
            "userId": f"u{i % users}" if users else f"u{i}",
            "event": "Row",
            "messageId": f"{prefix}{i}",
            "properties": {"n": i, **({"pad": "x" * pad} if pad else {})},
        }
        for i in range(count)
    ]


def _ids(request: Received) -> list[str]:
    body = json.loads(request.body)
    assert isinstance(body, list), body
    return [event["messageId"] for event in body]


def _accepted(received: list[Received], statuses: dict[int, int]) -> list[Received]:
    """The requests the receiver accepted, by the answer it gave each (1-based)."""
    return [r for n, r in enumerate(received, 1) if statuses.get(n, 200) == 200]


async def _settled(db_url: str, count: int, timeout: float = 30) -> None:
    await eventually(
        lambda: (
            sql(db_url, "SELECT count(*) FROM deliveries WHERE status IN ('pending', 'queued')")
            == [(0,)]
            and sql(db_url, "SELECT count(*) FROM deliveries") == [(count,)]
        ),
        timeout=timeout,
    )


async def test_a_warehouse_gets_arrays_of_up_to_batch_size_each_event_once_in_order(
    db_url: str, receiver_factory: ReceiverFactory, daemon_factory: DaemonFactory
) -> None:
    receiver = await receiver_factory()
    daemon = await daemon_factory(
        _settings(db_url, receiver.url, batch_size=10, batch_wait_seconds=0.2)
    )
    sent = _events(95)
    status, _ = await post(daemon.port, "/v1/batch", {"batch": sent})
    assert status == 200
    await _settled(db_url, 95)
    requests = receiver.received
    carried = [i for r in requests for i in _ids(r)]
    assert carried == [e["messageId"] for e in sent]  # each once, in acceptance order
    assert all(1 <= len(_ids(r)) <= 10 for r in requests)
    assert len(requests) >= 10
    for r in requests:
        assert r.headers["Content-Type"] == "application/json"
        assert r.headers["webhook-id"].startswith("batch_")
        assert r.headers["X-Signature"] == hmac.new(SECRET.encode(), r.body, "sha1").hexdigest()
        Webhook(WHSEC).verify(r.body, r.headers)
    assert len({r.headers["webhook-id"] for r in requests}) == len(requests)
    # Each array is the members' stored bodies joined as they are.
    stored = dict(
        sql(
            db_url,
            "SELECT m.message_id, m.body FROM messages m",
        )
    )
    for r in requests:
        assert r.body == ("[" + ",".join(stored[i] for i in _ids(r)) + "]").encode()
    # The store: every delivery delivered in its batch, one attempt row per request.
    delivered = "SELECT count(*) FROM deliveries WHERE status = 'delivered' AND batch_id > 0"
    assert sql(db_url, delivered) == [(95,)]
    assert sql(db_url, "SELECT count(*), min(status), max(status) FROM batches") == [
        (len(requests), "delivered", "delivered")
    ]
    assert sql(db_url, "SELECT count(*) FROM attempts WHERE batch_id IS NOT NULL") == [
        (len(requests),)
    ]
    by_batch = sql(
        db_url,
        "SELECT b.webhook_id, count(*) FROM deliveries d JOIN batches b ON b.id = d.batch_id "
        "GROUP BY b.webhook_id",
    )
    assert dict(by_batch) == {r.headers["webhook-id"]: len(_ids(r)) for r in requests}


async def test_a_retry_resends_the_same_bytes_under_the_same_webhook_id(
    sqlite_url: str, receiver_factory: ReceiverFactory, daemon_factory: DaemonFactory
) -> None:
    async def refuse_first(_request: web.Request, n: int) -> web.StreamResponse:
        return web.Response(status=503 if n == 1 else 200)

    receiver = await receiver_factory(refuse_first)
    daemon = await daemon_factory(
        _settings(sqlite_url, receiver.url, batch_size=50, batch_wait_seconds=0.2)
    )
    status, _ = await post(daemon.port, "/v1/batch", {"batch": _events(7)})
    assert status == 200
    await _settled(sqlite_url, 7)
    first, second = receiver.received
    assert first.body == second.body
    assert first.headers["webhook-id"] == second.headers["webhook-id"]
    assert first.headers["X-Signature"] == second.headers["X-Signature"]
    assert _ids(first) == [f"e{i}" for i in range(7)]
    rows = sql(
        sqlite_url,
        "SELECT a.status_code, a.batch_id FROM attempts a ORDER BY a.attempted_at",
    )
    assert [code for code, _ in rows] == [503, 200]
    assert len({batch for _, batch in rows}) == 1
    assert sql(sqlite_url, "SELECT DISTINCT attempts, status FROM deliveries") == [(2, "delivered")]


async def test_batch_wait_seconds_sends_a_partial_batch(
    sqlite_url: str, receiver_factory: ReceiverFactory, daemon_factory: DaemonFactory
) -> None:
    receiver = await receiver_factory()
    daemon = await daemon_factory(
        _settings(sqlite_url, receiver.url, batch_size=100, batch_wait_seconds=0.8)
    )
    started = time.time()
    status, _ = await post(daemon.port, "/v1/batch", {"batch": _events(3)})
    assert status == 200
    [request] = await receiver.wait_for(1)
    assert _ids(request) == ["e0", "e1", "e2"]
    assert request.at - started >= 0.7  # it waited for more events
    await asyncio.sleep(0.3)
    assert len(receiver.received) == 1


async def test_batch_max_bytes_is_never_exceeded(
    sqlite_url: str, receiver_factory: ReceiverFactory, daemon_factory: DaemonFactory
) -> None:
    receiver = await receiver_factory()
    daemon = await daemon_factory(
        _settings(
            sqlite_url,
            receiver.url,
            batch_size=100,
            batch_max_bytes=1024,
            batch_wait_seconds=0.1,
        )
    )
    sent = _events(30, pad=200)
    status, _ = await post(daemon.port, "/v1/batch", {"batch": sent})
    assert status == 200
    await _settled(sqlite_url, 30)
    requests = receiver.received
    assert all(len(r.body) <= 1024 for r in requests)
    assert any(len(_ids(r)) > 1 for r in requests)
    assert [i for r in requests for i in _ids(r)] == [e["messageId"] for e in sent]


@pytest.mark.parametrize("ordering", ["none", "per_user"])
async def test_a_413_splits_a_batch_down_to_single_events(
    sqlite_url: str,
    receiver_factory: ReceiverFactory,
    daemon_factory: DaemonFactory,
    ordering: str,
) -> None:
    async def one_at_a_time(request: web.Request, _n: int) -> web.StreamResponse:
        events = json.loads(await request.read())
        return web.Response(status=413 if len(events) > 1 else 200)

    receiver = await receiver_factory(one_at_a_time)
    daemon = await daemon_factory(
        _settings(
            sqlite_url, receiver.url, batch_size=10, batch_wait_seconds=0.2, ordering=ordering
        )
    )
    sent = _events(4, users=2)
    status, _ = await post(daemon.port, "/v1/batch", {"batch": sent})
    assert status == 200
    await _settled(sqlite_url, 4)
    sizes = [len(_ids(r)) for r in receiver.received]
    assert sizes[0] == 4
    accepted = [i for r in receiver.received if len(_ids(r)) == 1 for i in _ids(r)]
    assert sorted(accepted) == ["e0", "e1", "e2", "e3"]
    assert sql(sqlite_url, "SELECT DISTINCT status FROM deliveries") == [("delivered",)]
    if ordering == "none":
        # Halves, then quarters: every half sent, each its own batch.
        assert sorted(sizes) == [1, 1, 1, 1, 2, 2, 4]
        assert sql(sqlite_url, "SELECT status, count(*) FROM batches GROUP BY 1 ORDER BY 1") == [
            ("delivered", 4),
            ("split", 3),
        ]
    else:
        # A user's events in order, even as halves: u0's are e0 and e2, u1's e1 and e3.
        assert [i for i in accepted if i in ("e0", "e2")] == ["e0", "e2"]
        assert [i for i in accepted if i in ("e1", "e3")] == ["e1", "e3"]


async def test_a_single_event_answered_413_fails(
    sqlite_url: str, receiver_factory: ReceiverFactory, daemon_factory: DaemonFactory
) -> None:
    async def too_large(_request: web.Request, _n: int) -> web.StreamResponse:
        return web.Response(status=413)

    receiver = await receiver_factory(too_large)
    daemon = await daemon_factory(
        _settings(sqlite_url, receiver.url, batch_size=10, batch_wait_seconds=0.1)
    )
    status, _ = await post(daemon.port, "/v1/batch", {"batch": _events(2)})
    assert status == 200
    await _settled(sqlite_url, 2)
    assert sorted(len(_ids(r)) for r in receiver.received) == [1, 1, 2]
    assert sql(sqlite_url, "SELECT DISTINCT status FROM deliveries") == [("failed",)]


async def test_a_users_events_keep_their_order_across_batches_and_retries(
    db_url: str, receiver_factory: ReceiverFactory, daemon_factory: DaemonFactory
) -> None:
    statuses: dict[int, int] = {}
    in_flight: set[str] = set()
    overlapped: list[str] = []

    async def flaky(request: web.Request, n: int) -> web.StreamResponse:
        users = {e["userId"] for e in json.loads(await request.read())}
        if users & in_flight:
            overlapped.extend(users & in_flight)
        in_flight.update(users)
        await asyncio.sleep(0.05)
        in_flight.difference_update(users)
        statuses[n] = 503 if n % 3 == 1 else 200
        return web.Response(status=statuses[n])

    receiver = await receiver_factory(flaky)
    daemon = await daemon_factory(
        _settings(db_url, receiver.url, batch_size=4, batch_wait_seconds=0.05, ordering="per_user")
    )
    sent = _events(40, users=5)
    for chunk in range(0, 40, 10):
        status, _ = await post(daemon.port, "/v1/batch", {"batch": sent[chunk : chunk + 10]})
        assert status == 200
    await _settled(db_url, 40, timeout=60)
    accepted = _accepted(receiver.received, statuses)
    carried = [i for r in accepted for i in _ids(r)]
    assert sorted(carried) == sorted(e["messageId"] for e in sent)
    assert len(carried) == 40
    user_of = {e["messageId"]: e["userId"] for e in sent}
    for user in {e["userId"] for e in sent}:
        theirs = [i for i in carried if user_of[i] == user]
        assert theirs == [e["messageId"] for e in sent if e["userId"] == user]
    assert overlapped == []  # a user never had two requests under way
    assert sql(db_url, "SELECT DISTINCT status FROM deliveries") == [("delivered",)]


async def test_first_event_signature_covers_the_first_event_only(
    sqlite_url: str, receiver_factory: ReceiverFactory, daemon_factory: DaemonFactory
) -> None:
    async def refuse_first(_request: web.Request, n: int) -> web.StreamResponse:
        return web.Response(status=503 if n == 1 else 200)

    receiver = await receiver_factory(refuse_first)
    daemon = await daemon_factory(
        _settings(
            sqlite_url,
            receiver.url,
            batch_size=5,
            batch_wait_seconds=0.1,
            batch_signature="first_event",
        )
    )
    status, _ = await post(daemon.port, "/v1/batch", {"batch": _events(5)})
    assert status == 200
    await _settled(sqlite_url, 5)
    [(first,)] = sql(sqlite_url, "SELECT body FROM messages WHERE message_id = 'e0'")
    expected = hmac.new(SECRET.encode(), first.encode(), hashlib.sha1).hexdigest()
    # The first request and its retry (claimed again from the store) sign alike.
    refused, accepted = receiver.received
    for request in (refused, accepted):
        assert request.body.startswith(b"[" + first.encode() + b",")
        assert request.headers["X-Signature"] == expected
        # Standard Webhooks' signature covers the whole body whatever batch_signature says.
        Webhook(WHSEC).verify(request.body, request.headers)
    assert refused.body == accepted.body


class Slow:
    """Accepts every request after a moment, keeping each request's body and webhook-id."""

    def __init__(self) -> None:
        self.seen: list[tuple[str, bytes]] = []

    async def __call__(self, request: web.Request, _n: int) -> web.StreamResponse:
        body = await request.read()
        await asyncio.sleep(0.2)
        self.seen.append((request.headers["webhook-id"], body))
        return web.Response(status=200)


@pytest.mark.slow
async def test_kill_9_mid_stream_loses_nothing_and_resends_only_whole_batches(
    db_url: str, receiver_factory: ReceiverFactory, tmp_path: Path
) -> None:
    slow = Slow()
    receiver = await receiver_factory(slow)
    settings = _settings(
        db_url,
        receiver.url,
        batch_size=10,
        batch_wait_seconds=0.1,
        # The killed process's leases lapse before its batches are claimed again (PostgreSQL).
        delivery={"timeout_seconds": 2, "lease_seconds": 8, "max_per_hook": 2},
    )
    port = free_port()
    settings["server"] = {"host": "127.0.0.1", "port": port, "parse_processes": 0}
    daemon = DaemonProcess(write_toml(tmp_path / "efd.toml", settings), port, tmp_path / "efd.log")
    daemon.start()
    try:
        sent = _events(300)
        for chunk in range(0, 300, 50):
            status, _ = await post(daemon.port, "/v1/batch", {"batch": sent[chunk : chunk + 50]})
            assert status == 200
        await eventually(lambda: len(receiver.received) >= 5, timeout=30)
        daemon.kill()
        before = len(receiver.received)
        daemon.start()
        await _settled(db_url, 300, timeout=90)
    finally:
        daemon.ensure_stopped()
    assert before < len(receiver.received)
    carried: Counter[str] = Counter()
    bodies: dict[str, bytes] = {}
    for request in receiver.received:
        webhook_id = request.headers["webhook-id"]
        if webhook_id in bodies:
            assert bodies[webhook_id] == request.body  # a resend is the same batch, whole
            continue
        bodies[webhook_id] = request.body
        carried.update(_ids(request))
    # Every event is in exactly one batch, whatever was sent twice.
    assert sorted(carried) == sorted(e["messageId"] for e in sent)
    assert set(carried.values()) == {1}
    assert sql(db_url, "SELECT DISTINCT status FROM deliveries") == [("delivered",)]


async def test_a_rate_limit_counts_requests_not_events(
    sqlite_url: str, receiver_factory: ReceiverFactory, daemon_factory: DaemonFactory
) -> None:
    receiver = await receiver_factory()
    daemon = await daemon_factory(
        _settings(
            sqlite_url,
            receiver.url,
            batch_size=5,
            batch_wait_seconds=0.05,
            max_per_second=4,
            burst=1,
        )
    )
    sent = _events(30)
    status, _ = await post(daemon.port, "/v1/batch", {"batch": sent})
    assert status == 200
    await _settled(sqlite_url, 30)
    requests = receiver.received
    assert [i for r in requests for i in _ids(r)] == [e["messageId"] for e in sent]
    # 30 events in full batches of 5: six requests, a token each, four a second at most
    # (when the requests left, as the attempts table has it: arrivals lag unevenly).
    assert [len(_ids(r)) for r in requests] == [5] * 6
    sent_at = [at for (at,) in sql(sqlite_url, "SELECT attempted_at FROM attempts ORDER BY 1")]
    assert sent_at[-1] - sent_at[0] >= 5 / 4 - 0.3  # one token to start with, then 4 a second
    assert max(sum(1 for t in sent_at if s <= t < s + 1) for s in sent_at) <= 4 + 1


async def test_batches_formed_before_batching_was_turned_off_are_still_sent_whole(
    sqlite_url: str, receiver_factory: ReceiverFactory, daemon_factory: DaemonFactory
) -> None:
    up = False

    async def down_then_up(_request: web.Request, _n: int) -> web.StreamResponse:
        return web.Response(status=200 if up else 503)

    receiver = await receiver_factory(down_then_up)
    first = await daemon_factory(
        _settings(sqlite_url, receiver.url, batch_size=10, batch_wait_seconds=0.05)
    )
    status, _ = await post(first.port, "/v1/batch", {"batch": _events(3)})
    assert status == 200
    await receiver.wait_for(1)
    await first.stop()
    up = True
    second = await daemon_factory(_settings(sqlite_url, receiver.url))
    status, _ = await post(second.port, "/v1/batch", {"batch": _events(1, prefix="alone")})
    assert status == 200
    await _settled(sqlite_url, 4)
    refused = receiver.received[0]
    resent = [r for r in receiver.received[1:] if r.headers["webhook-id"].startswith("batch_")]
    assert resent
    assert all(r.body == refused.body for r in resent)
    assert resent[-1].headers["webhook-id"] == refused.headers["webhook-id"]
    [alone] = [r for r in receiver.received if not r.headers["webhook-id"].startswith("batch_")]
    assert json.loads(alone.body)["messageId"] == "alone0"  # no array: one event a request
    assert sql(sqlite_url, "SELECT DISTINCT status FROM deliveries") == [("delivered",)]


async def test_sender_processes_send_batches_as_the_daemon_does(
    sqlite_url: str, receiver_factory: ReceiverFactory, daemon_factory: DaemonFactory
) -> None:
    receiver = await receiver_factory()
    daemon = await daemon_factory(
        _settings(
            sqlite_url,
            receiver.url,
            batch_size=4,
            batch_wait_seconds=0.1,
            batch_signature="first_event",
            delivery={"sender_processes": 1},
        )
    )
    sent = _events(10)
    status, _ = await post(daemon.port, "/v1/batch", {"batch": sent})
    assert status == 200
    await _settled(sqlite_url, 10)
    requests = receiver.received
    assert [i for r in requests for i in _ids(r)] == [e["messageId"] for e in sent]
    stored = dict(sql(sqlite_url, "SELECT message_id, body FROM messages"))
    for r in requests:
        first = stored[_ids(r)[0]].encode()
        assert r.headers["X-Signature"] == hmac.new(SECRET.encode(), first, "sha1").hexdigest()
        assert r.headers["webhook-id"].startswith("batch_")
        Webhook(WHSEC).verify(r.body, r.headers)


async def test_an_event_whose_payload_was_purged_before_its_batch_fails_unsent(
    sqlite_url: str, receiver_factory: ReceiverFactory, daemon_factory: DaemonFactory
) -> None:
    receiver = await receiver_factory()
    daemon = await daemon_factory(
        _settings(sqlite_url, receiver.url, batch_size=100, batch_wait_seconds=1.5)
    )
    status, _ = await post(daemon.port, "/v1/batch", {"batch": _events(3)})
    assert status == 200
    # What a deletion request's purge leaves (efd/store/regulations.py), before the batch forms.
    sql(sqlite_url, "UPDATE messages SET body = NULL WHERE message_id = 'e1'")
    sql(
        sqlite_url,
        "UPDATE deliveries SET body = NULL WHERE message_pk IN "
        "(SELECT id FROM messages WHERE message_id = 'e1')",
    )
    await _settled(sqlite_url, 3)
    [request] = receiver.received
    assert _ids(request) == ["e0", "e2"]
    rows = sql(
        sqlite_url,
        "SELECT m.message_id, d.status, d.batch_id IS NULL, d.last_error FROM deliveries d "
        "JOIN messages m ON m.id = d.message_pk ORDER BY m.message_id",
    )
    assert rows[0][:3] == ("e0", "delivered", 0)
    assert rows[1] == ("e1", "failed", 1, "message payload was purged by a deletion request")
    assert rows[2][:3] == ("e2", "delivered", 0)


async def test_two_daemons_on_one_postgresql_store_send_each_event_once(
    db_url: str, receiver_factory: ReceiverFactory, daemon_factory: DaemonFactory
) -> None:
    if db_url.startswith("sqlite"):
        pytest.skip("one daemon per SQLite file")
    receiver = await receiver_factory()
    settings = _settings(db_url, receiver.url, batch_size=10, batch_wait_seconds=0.1)
    first = await daemon_factory(settings)
    second = await daemon_factory(settings)
    sent = _events(400)
    for chunk in range(0, 400, 20):
        daemon = first if chunk % 40 else second
        status, _ = await post(daemon.port, "/v1/batch", {"batch": sent[chunk : chunk + 20]})
        assert status == 200
    await _settled(db_url, 400)
    carried = [i for r in receiver.received for i in _ids(r)]
    assert sorted(carried) == sorted(e["messageId"] for e in sent)
    assert len(carried) == 400  # forming is one daemon at a time per route: none twice
    assert all(len(_ids(r)) <= 10 for r in receiver.received)
    owners = sql(db_url, "SELECT count(DISTINCT lease_owner) FROM batches")
    assert owners == [(0,)]  # every lease given back with its outcome


async def test_a_batch_whose_members_were_deleted_by_hand_ends_without_a_request(
    sqlite_url: str, receiver_factory: ReceiverFactory, daemon_factory: DaemonFactory
) -> None:
    async def down(_request: web.Request, _n: int) -> web.StreamResponse:
        return web.Response(status=503)

    receiver = await receiver_factory(down)
    settings = _settings(sqlite_url, receiver.url, batch_size=10, batch_wait_seconds=0.05)
    settings["delivery"]["retry_initial_seconds"] = 1
    settings["delivery"]["retry_max_seconds"] = 1
    daemon = await daemon_factory(settings)
    status, _ = await post(daemon.port, "/v1/batch", {"batch": _events(2)})
    assert status == 200
    await receiver.wait_for(1)
    await eventually(lambda: sql(sqlite_url, "SELECT attempts FROM batches") == [(1,)])
    sql(sqlite_url, "DELETE FROM attempts")
    sql(sqlite_url, "DELETE FROM deliveries")
    await eventually(
        lambda: (
            sql(sqlite_url, "SELECT status, last_error FROM batches")
            == [("failed", "no member of the batch is stored any more")]
        ),
        timeout=10,
    )
    assert len(receiver.received) == 1


async def test_the_live_stream_shows_a_batchs_request_for_each_of_its_events(
    sqlite_url: str, receiver_factory: ReceiverFactory, daemon_factory: DaemonFactory
) -> None:
    receiver = await receiver_factory()
    settings = _settings(sqlite_url, receiver.url, batch_size=3, batch_wait_seconds=0.05)
    settings["server"]["admin_token"] = TOKEN
    daemon = await daemon_factory(settings)
    async with (
        aiohttp.ClientSession() as session,
        session.get(
            f"http://127.0.0.1:{daemon.port}/admin/stream",
            headers={"Authorization": f"Bearer {TOKEN}"},
        ) as response,
    ):
        assert response.status == 200
        await eventually(lambda: daemon.hub.subscribers == 1)
        status, _ = await post(daemon.port, "/v1/batch", {"batch": _events(3)})
        assert status == 200
        attempts: list[dict[str, Any]] = []
        async with asyncio.timeout(10):
            async for kind, data in events(response):
                if kind == "attempt":
                    attempts.append(data)
                if len(attempts) == 3:
                    break
    assert [a["messageId"] for a in attempts] == ["e0", "e1", "e2"]
    assert {(a["destination"], a["statusCode"], a["delivered"]) for a in attempts} == {
        ("wh/bulk", 200, True)
    }
    assert len(receiver.received) == 1


async def test_redriven_events_of_a_failed_batch_go_again_in_a_new_batch(
    db_url: str, receiver_factory: ReceiverFactory, daemon_factory: DaemonFactory
) -> None:
    async def refuse_first(_request: web.Request, n: int) -> web.StreamResponse:
        return web.Response(status=400 if n == 1 else 200)

    receiver = await receiver_factory(refuse_first)
    settings = _settings(db_url, receiver.url, batch_size=10, batch_wait_seconds=0.05)
    settings["server"]["admin_token"] = ADMIN_TOKEN
    daemon = await daemon_factory(settings)
    status, _ = await post(daemon.port, "/v1/batch", {"batch": _events(3)})
    assert status == 200
    await _settled(db_url, 3)
    assert sql(db_url, "SELECT DISTINCT status FROM deliveries") == [("failed",)]
    status, answer = await api(daemon.port, "POST", "/admin/redrive", {"destination": "wh/bulk"})
    assert (status, answer) == (200, {"count": 3})
    await eventually(
        lambda: sql(db_url, "SELECT DISTINCT status FROM deliveries") == [("delivered",)],
        timeout=20,
    )
    refused, accepted = receiver.received
    assert _ids(refused) == _ids(accepted) == ["e0", "e1", "e2"]
    # A new batch row (the refused one keeps its outcome and its attempt), carrying the same
    # events: the same webhook-id, as a redriven single delivery keeps its message's.
    assert refused.headers["webhook-id"] == accepted.headers["webhook-id"]
    assert refused.body == accepted.body
    assert sql(db_url, "SELECT status FROM batches ORDER BY id") == [("failed",), ("delivered",)]


async def test_a_batch_with_an_event_discarded_leaves_the_others_to_a_new_batch(
    sqlite_url: str, receiver_factory: ReceiverFactory, daemon_factory: DaemonFactory
) -> None:
    up = False

    async def down_then_up(_request: web.Request, _n: int) -> web.StreamResponse:
        return web.Response(status=200 if up else 503)

    receiver = await receiver_factory(down_then_up)
    settings = _settings(sqlite_url, receiver.url, batch_size=10, batch_wait_seconds=0.05)
    settings["delivery"]["retry_initial_seconds"] = 1
    settings["delivery"]["retry_max_seconds"] = 1
    daemon = await daemon_factory(settings)
    status, _ = await post(daemon.port, "/v1/batch", {"batch": _events(3)})
    assert status == 200
    await eventually(lambda: sql(sqlite_url, "SELECT attempts FROM batches") == [(1,)])
    # What a discard leaves (efd/store/operations.py), done here by hand.
    sql(
        sqlite_url,
        "UPDATE deliveries SET status = 'discarded', finished_at = 0 WHERE message_pk IN "
        "(SELECT id FROM messages WHERE message_id = 'e1')",
    )
    up = True
    await _settled(sqlite_url, 3)
    first, *later = receiver.received
    assert _ids(first) == ["e0", "e1", "e2"]
    assert [_ids(r) for r in later] == [["e0", "e2"]]
    assert sql(sqlite_url, "SELECT status, last_error FROM batches ORDER BY id") == [
        ("failed", "some of its events were discarded: the others were formed into new batches"),
        ("delivered", None),
    ]


async def test_efd_inspect_shows_the_batch_that_carried_a_message(
    db_url: str, receiver_factory: ReceiverFactory, daemon_factory: DaemonFactory, tmp_path: Path
) -> None:
    receiver = await receiver_factory()
    settings = _settings(db_url, receiver.url, batch_size=5, batch_wait_seconds=0.05)
    daemon = await daemon_factory(settings)
    config = str(write_toml(tmp_path / "efd.toml", settings))
    status, _ = await post(daemon.port, "/v1/batch", {"batch": _events(3)})
    assert status == 200
    await _settled(db_url, 3)
    [request] = receiver.received
    code, out, err = await asyncio.to_thread(
        run_cli, "inspect", "--source", "web", "--message-id", "e1", "--config", config
    )
    assert (code, err) == (0, "")
    [(batch_id,)] = sql(db_url, "SELECT id FROM batches")
    webhook_id = request.headers["webhook-id"]
    assert f"in batch {batch_id} (webhook-id {webhook_id}): 3 events, delivered" in out
    # The batch's request is shown for e1 too, whose delivery no attempt row names.
    assert f"{receiver.url}  200" in out
    assert "no attempts yet" not in out


async def test_a_paused_batched_action_is_sent_nothing_until_resumed(
    db_url: str, receiver_factory: ReceiverFactory, daemon_factory: DaemonFactory
) -> None:
    receiver = await receiver_factory()
    settings = _settings(db_url, receiver.url, batch_size=10, batch_wait_seconds=0.1)
    settings["server"]["admin_token"] = ADMIN_TOKEN
    daemon = await daemon_factory(settings)
    status, answer = await api(daemon.port, "POST", "/admin/destinations/wh/pause", {})
    assert status == 200, answer
    sent = _events(25)
    status, _ = await post(daemon.port, "/v1/batch", {"batch": sent})
    assert status == 200
    await asyncio.sleep(1.5)  # many formation turns: a paused action forms and sends nothing
    assert receiver.received == []
    assert sql(db_url, "SELECT count(*) FROM attempts") == [(0,)]
    status, answer = await api(daemon.port, "POST", "/admin/destinations/wh/resume", {})
    assert status == 200, answer
    await _settled(db_url, 25)
    assert [i for r in receiver.received for i in _ids(r)] == [e["messageId"] for e in sent]


async def test_a_deletion_request_empties_a_waiting_batch_and_its_retry_leaves_the_user_out(
    db_url: str, receiver_factory: ReceiverFactory, daemon_factory: DaemonFactory
) -> None:
    async def refuse_first(_request: web.Request, n: int) -> web.StreamResponse:
        return web.Response(status=503 if n == 1 else 200)

    receiver = await receiver_factory(refuse_first)
    settings = _settings(
        db_url,
        receiver.url,
        batch_size=10,
        batch_wait_seconds=0.2,
        delivery={"retry_initial_seconds": 3, "retry_max_seconds": 3},
    )
    settings["server"]["admin_token"] = ADMIN_TOKEN
    daemon = await daemon_factory(settings)
    status, _ = await post(daemon.port, "/v1/batch", {"batch": _events(4)})
    assert status == 200
    await receiver.wait_for(1)  # refused: the batch waits for its retry
    assert _ids(receiver.received[0]) == ["e0", "e1", "e2", "e3"]
    reg_id = await regulate(daemon.port, regulation("DELETE_ONLY", "u1"))
    await finished(daemon.port, reg_id)
    # Nothing of u1 is left in any batch's body.
    assert sql(db_url, "SELECT count(*) FROM batches WHERE body LIKE '%u1%'") == [(0,)]
    await _settled(db_url, 4)
    last = receiver.received[-1]
    assert _ids(last) == ["e0", "e2", "e3"]
    assert b"u1" not in last.body
    assert b'"e1"' not in b"".join(r.body for r in receiver.received[1:])
    rows = sql(
        db_url,
        "SELECT m.message_id, d.status, d.last_error FROM deliveries d "
        "JOIN messages m ON m.id = d.message_pk ORDER BY m.message_id",
    )
    assert [(mid, status) for mid, status, _ in rows] == [
        ("e0", "delivered"),
        ("e1", "failed"),
        ("e2", "delivered"),
        ("e3", "delivered"),
    ]
    assert rows[1][2] == "message payload was purged by a deletion request"
