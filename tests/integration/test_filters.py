"""Destination filters at routing time (docs/filters.md): what a receiver gets, what the store
keeps, what operators see. Real daemons, real receivers on 127.0.0.1, SQLite and PostgreSQL."""

from __future__ import annotations

import hashlib
import json
from typing import Any

from standardwebhooks.webhooks import Webhook

from efd import config
from efd.segment import webhooks
from efd.store import Store
from tests.conftest import (
    SECRET,
    DaemonFactory,
    ReceiverFactory,
    eventually,
    metric,
    metrics_text,
    post,
    settings_dict,
    sql,
)
from tests.integration.test_operators import Switch
from tests.integration.test_regulations import api, finished, regulate, request

TOKEN = "adm-secret-0123456789"
WHSEC = "whsec_" + "c2VjcmV0LW9mLWF0LWxlYXN0LTI0LWJ5dGVzLWxvbmch"

DROP_PING = {"if": 'type = "track" and event = "Debug Ping"', "action": "drop"}
DROP_PII = {
    "if": "all",
    "action": "drop_fields",
    "fields": {"properties": ["email", "phone"], "context": ["ip"]},
}


def with_filters(
    db_url: str, hooks: list[str], filters: list[dict[str, Any]], **server: Any
) -> dict[str, Any]:
    settings = settings_dict(db_url, hooks)
    settings["server"].update(admin_token=TOKEN, **server)
    settings["destinations"][0]["filters"] = filters
    return settings


def track(message_id: str, event: str = "Order Completed", **extra: Any) -> dict[str, Any]:
    return {
        "userId": "u1",
        "event": event,
        "messageId": message_id,
        "properties": {"total": 120, "email": "a@example.com", "phone": "555"},
        "context": {"ip": "10.1.2.3", "page": {"url": "https://shop.example/cart"}},
        **extra,
    }


def deliveries(db_url: str) -> dict[str, tuple[str, int, str | None]]:
    rows = sql(
        db_url,
        "SELECT m.message_id, d.status, d.attempts, d.last_error FROM deliveries d"
        " JOIN messages m ON m.id = d.message_pk WHERE d.replay_of IS NULL",
    )
    return {message_id: (status, attempts, error) for message_id, status, attempts, error in rows}


async def test_a_dropped_message_gets_a_filtered_row_and_no_request(
    db_url: str, receiver_factory: ReceiverFactory, daemon_factory: DaemonFactory
) -> None:
    receiver = await receiver_factory()
    daemon = await daemon_factory(with_filters(db_url, [receiver.url], [DROP_PING]))
    assert (await post(daemon.port, "/v1/track", track("ping", "Debug Ping")))[0] == 200
    assert (await post(daemon.port, "/v1/track", track("order")))[0] == 200
    await eventually(lambda: deliveries(db_url).get("order", ("",))[0] == "delivered")
    assert [r.json()["messageId"] for r in receiver.received] == ["order"]
    status, attempts, reason = deliveries(db_url)["ping"]
    assert (status, attempts) == ("filtered", 0)
    assert reason == 'filters[0] drop, if type = "track" and event = "Debug Ping"'
    # Auditable by SQL: finished, never due, no attempt.
    assert sql(
        db_url,
        "SELECT d.finished_at IS NOT NULL, d.next_attempt_at, count(a.id) FROM deliveries d"
        " LEFT JOIN attempts a ON a.delivery_id = d.id WHERE d.status = 'filtered'"
        " GROUP BY d.id, d.finished_at, d.next_attempt_at",
    ) == [(True, None, 0)]
    # The admin API's message view names the filter; the list finds it by status.
    status_code, view = await api(daemon.port, "GET", "/admin/messages/web/ping", token=TOKEN)
    assert status_code == 200, view
    [delivery] = view["deliveries"]
    assert delivery["status"] == "filtered"
    assert delivery["filteredBy"] == reason
    assert delivery["nextAttemptAt"] is None
    assert delivery["attempts"] == []
    _, listed = await api(daemon.port, "GET", "/admin/deliveries?status=filtered", token=TOKEN)
    assert [d["messageId"] for d in listed["deliveries"]] == ["ping"]
    _, order_view = await api(daemon.port, "GET", "/admin/messages/web/order", token=TOKEN)
    assert order_view["deliveries"][0]["filteredBy"] is None
    text = await metrics_text(daemon.port, TOKEN)
    assert metric(text, "efd_deliveries_filtered_total", destination="hooks") == 1
    assert metric(text, "efd_deliveries_delivered_total", destination="hooks") == 1


async def test_drop_fields_changes_the_body_before_it_is_signed(
    db_url: str, receiver_factory: ReceiverFactory, daemon_factory: DaemonFactory
) -> None:
    receiver = await receiver_factory()
    other = await receiver_factory()
    settings = with_filters(db_url, [receiver.url], [DROP_PII])
    dest = settings["destinations"][0]
    dest.update(signing=["x-signature", "standard-webhooks"], standard_webhooks_secrets=[WHSEC])
    # A second destination of the same source, without filters, gets the message whole.
    settings["destinations"].append(
        {"name": "whole", "shared_secret": SECRET, "hooks": [{"url": other.url}]}
    )
    settings["sources"][0]["destinations"].append("whole")
    daemon = await daemon_factory(settings)
    assert (await post(daemon.port, "/v1/track", track("m1")))[0] == 200
    [got] = await receiver.wait_for(1)
    [whole] = await other.wait_for(1)
    body = got.json()
    assert body["properties"] == {"total": 120}
    assert body["context"] == {"page": {"url": "https://shop.example/cart"}}
    assert body["messageId"] == "m1"
    assert body["event"] == "Order Completed"
    # Both signatures cover the bytes received.
    assert webhooks.verify(SECRET, got.body, got.headers["X-Signature"])
    assert Webhook(WHSEC).verify(got.body, got.headers) == body
    assert whole.json()["properties"]["email"] == "a@example.com"
    assert whole.json()["context"]["ip"] == "10.1.2.3"
    # The message keeps its body; the delivery holds its own.
    [(message_body,)] = sql(db_url, "SELECT body FROM messages")
    assert json.loads(message_body)["properties"]["email"] == "a@example.com"
    stored = dict(sql(db_url, "SELECT destination, body FROM deliveries"))
    assert stored["whole"] is None
    assert stored["hooks"] is not None
    assert stored["hooks"].encode() == got.body


def point(message_id: str) -> float:
    return int.from_bytes(hashlib.sha256(message_id.encode()).digest()[:8], "big") / 2**64


async def test_sampling_is_deterministic_per_message_id(
    db_url: str, receiver_factory: ReceiverFactory, daemon_factory: DaemonFactory
) -> None:
    receiver = await receiver_factory()
    sample = {"if": 'event = "Page Scrolled"', "action": "sample", "percent": 40}
    daemon = await daemon_factory(with_filters(db_url, [receiver.url], [sample]))
    ids = [f"scroll-{i}" for i in range(40)]
    batch = [track(i, "Page Scrolled", type="track") for i in ids]
    assert (await post(daemon.port, "/v1/batch", {"batch": batch}))[0] == 200
    sent = {i for i in ids if point(i) * 100 < 40}
    assert 0 < len(sent) < len(ids)
    await eventually(
        lambda: sum(s == "delivered" for s, _, _ in deliveries(db_url).values()) == len(sent)
    )
    found = deliveries(db_url)
    assert {i for i, (s, _, _) in found.items() if s == "delivered"} == sent
    assert {i for i, (s, _, _) in found.items() if s == "filtered"} == set(ids) - sent
    assert {r.json()["messageId"] for r in receiver.received} == sent
    # A replay repeats routing's choice: a sampled-out message stays unsent, a sent one is
    # sent again with the same body.
    out = sorted(set(ids) - sent)[0]
    status, answer = await api(
        daemon.port, "POST", "/admin/replay", {"source": "web", "messageId": out}, token=TOKEN
    )
    assert status == 201, answer
    assert sql(db_url, "SELECT status, last_error FROM deliveries WHERE replay_of IS NOT NULL") == [
        ("filtered", 'filters[0] sample 40 %, if event = "Page Scrolled": sampled out')
    ]
    assert len(receiver.received) == len(sent)


async def test_a_large_batch_in_a_parser_process_is_filtered_as_a_small_one(
    db_url: str, receiver_factory: ReceiverFactory, daemon_factory: DaemonFactory
) -> None:
    receiver = await receiver_factory()
    filters: list[dict[str, Any]] = [
        DROP_PING,
        DROP_PII,
        {"if": 'event = "Page Scrolled"', "action": "sample", "percent": 50},
    ]
    daemon = await daemon_factory(with_filters(db_url, [receiver.url], filters, parse_processes=1))
    assert daemon.parsers is not None

    def messages(prefix: str, pad: int) -> list[dict[str, Any]]:
        events = ("Debug Ping", "Order Completed", "Page Scrolled")
        return [
            track(f"{prefix}-{i}", events[i % 3], type="track", traits={"pad": "p" * pad})
            for i in range(24)
        ]

    small = json.dumps({"batch": messages("small", 0)}).encode()
    large = json.dumps({"batch": messages("large", 400)}).encode()
    assert len(small) < 8192 < len(large)
    assert (await post(daemon.port, "/v1/batch", small))[0] == 200
    assert (await post(daemon.port, "/v1/batch", large))[0] == 200
    await eventually(
        lambda: (
            all(s != "pending" for s, _, _ in deliveries(db_url).values())
            and len(deliveries(db_url)) == 48
        )
    )
    found = deliveries(db_url)

    sampled_out = 'filters[2] sample 50 %, if event = "Page Scrolled": sampled out'

    def expected(message_id: str, i: int) -> tuple[str, str | None]:
        if i % 3 == 0:
            return "filtered", 'filters[0] drop, if type = "track" and event = "Debug Ping"'
        if i % 3 == 2 and point(message_id) >= 0.5:
            return "filtered", sampled_out
        return "delivered", None

    for prefix in ("small", "large"):
        for i in range(24):
            status, _, reason = found[f"{prefix}-{i}"]
            assert (status, reason) == expected(f"{prefix}-{i}", i), (prefix, i)
    bodies = [r.json() for r in receiver.received]
    assert bodies
    assert all("email" not in b["properties"] for b in bodies)
    assert all("ip" not in b["context"] for b in bodies)
    assert {b["event"] for b in bodies} <= {"Order Completed", "Page Scrolled"}


async def test_a_reload_leaves_queued_messages_as_routed(
    db_url: str, receiver_factory: ReceiverFactory, daemon_factory: DaemonFactory
) -> None:
    switch = Switch(503)
    receiver = await receiver_factory(switch)
    settings = with_filters(db_url, [receiver.url], [DROP_PII, DROP_PING])
    daemon = await daemon_factory(settings)
    assert (await post(daemon.port, "/v1/track", track("before")))[0] == 200
    await receiver.wait_for(1)  # refused: it waits, queued with its filtered body
    settings["destinations"][0]["filters"] = []
    await daemon.reload(config.load(None, **settings))
    assert (await post(daemon.port, "/v1/track", track("after")))[0] == 200
    assert (await post(daemon.port, "/v1/track", track("ping", "Debug Ping")))[0] == 200
    switch.status = 200
    await eventually(lambda: [s for s, _, _ in deliveries(db_url).values()] == ["delivered"] * 3)
    last = {r.json()["messageId"]: r.json() for r in receiver.received}
    assert "email" not in last["before"]["properties"]  # as routed before the reload
    assert last["after"]["properties"]["email"] == "a@example.com"
    assert "ping" in last  # no filter drops it any more


async def test_a_deletion_request_purges_a_delivery_body_and_retention_filtered_rows(
    db_url: str, receiver_factory: ReceiverFactory, daemon_factory: DaemonFactory
) -> None:
    receiver = await receiver_factory()
    daemon = await daemon_factory(with_filters(db_url, [receiver.url], [DROP_PII, DROP_PING]))
    assert (await post(daemon.port, "/v1/track", track("m1")))[0] == 200
    assert (await post(daemon.port, "/v1/track", track("ping", "Debug Ping")))[0] == 200
    await receiver.wait_for(1)
    await eventually(
        lambda: sorted(s for s, _, _ in deliveries(db_url).values()) == ["delivered", "filtered"]
    )
    assert sql(db_url, "SELECT count(*) FROM deliveries WHERE body IS NOT NULL") == [(1,)]
    await finished(daemon.port, await regulate(daemon.port, request("DELETE_ONLY", "u1")))
    assert sql(
        db_url,
        "SELECT count(*) FROM deliveries d JOIN messages m ON m.id = d.message_pk"
        " WHERE m.type <> 'delete' AND d.body IS NOT NULL",
    ) == [(0,)]
    # Retention takes a filtered delivery's message like a delivered one's.
    pks = [
        pk for (pk,) in sql(db_url, "SELECT message_pk FROM deliveries WHERE status = 'filtered'")
    ]
    assert len(pks) == 1
    store = Store(db_url)
    try:
        [(last,)] = sql(db_url, "SELECT max(finished_at) FROM deliveries")
        assert store.jobs.purge_finished(last + 1, 100) >= 1
    finally:
        store.dispose()
    assert sql(db_url, f"SELECT count(*) FROM messages WHERE id = {pks[0]}") == [(0,)]
    assert sql(db_url, "SELECT count(*) FROM deliveries WHERE status = 'filtered'") == [(0,)]


async def test_a_pattern_from_the_message_gets_its_documented_answer(
    db_url: str, receiver_factory: ReceiverFactory, daemon_factory: DaemonFactory
) -> None:
    # docs/filters.md, "The work of a message": no backtracking, false beyond the step budget,
    # the same in the daemon and in a parser process (the body over 8 KiB).
    receiver = await receiver_factory()
    drop = {"if": "match(properties.s, properties.p)", "action": "drop"}
    daemon = await daemon_factory(with_filters(db_url, [receiver.url], [drop], parse_processes=1))
    hostile = "*a*a*a*a*a*a*a*a*b"
    cases = {
        "backtracking": ({"s": "a" * 70, "p": hostile}, "delivered"),
        "matched": ({"s": "a" * 70 + "b", "p": hostile}, "filtered"),
        "dash": ({"s": "x", "p": "[x-]"}, "delivered"),
        "budget": ({"s": "a" * 30_000, "p": "*" + "?a" * 498 + "b*"}, "delivered"),
        "within": ({"s": "a" * 30_000 + "b", "p": "*a?a?b"}, "filtered"),
    }
    for message_id, (properties, _) in cases.items():
        body = {"userId": "u1", "event": "E", "messageId": message_id, "properties": properties}
        assert (await post(daemon.port, "/v1/track", body))[0] == 200
    expected = {message_id: status for message_id, (_, status) in cases.items()}
    await eventually(lambda: {m: d[0] for m, d in deliveries(db_url).items()} == expected)
    assert sorted(r.json()["messageId"] for r in receiver.received) == [
        "backtracking",
        "budget",
        "dash",
    ]
