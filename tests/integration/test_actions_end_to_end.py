"""An Actions destination from its TOML keys to the receivers: a message routed to every
action whose trigger matches, each request with its own method, URL, headers, auth and
mapped body, signed over the bytes sent; a mapping that cannot be applied failed at once; a
message no trigger matches recorded as filtered. Real daemons, real receivers and a real
OAuth2 token endpoint on 127.0.0.1, SQLite and PostgreSQL."""

from __future__ import annotations

import base64
import hashlib
import hmac
import json
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from aiohttp import web
from standardwebhooks.webhooks import Webhook

from tests.conftest import (
    SECRET,
    DaemonFactory,
    ReceiverFactory,
    eventually,
    post,
    settings_dict,
    sql,
)

WHSEC = "whsec_" + base64.b64encode(b"actions-secret-of-32-bytes-long!").decode()
TOKEN = "tok-from-the-endpoint"


@dataclass
class Seen:
    """What a receiver saw of each request, the method and the raw target included."""

    requests: list[tuple[str, str, dict[str, str], bytes]] = field(default_factory=list)

    async def __call__(self, request: web.Request, _n: int) -> web.StreamResponse:
        body = await request.read()
        self.requests.append((request.method, request.raw_path, dict(request.headers), body))
        return web.json_response({"ok": True})

    def by_method(self, method: str) -> tuple[str, dict[str, str], bytes]:
        [found] = [(path, h, b) for m, path, h, b in self.requests if m == method]
        return found


@dataclass
class TokenEndpoint:
    """An OAuth2 token endpoint: the client-credentials grant, one token for an hour."""

    asked: list[tuple[str, bytes]] = field(default_factory=list)

    async def handle(self, request: web.Request) -> web.StreamResponse:
        self.asked.append((request.headers.get("Authorization", ""), await request.read()))
        return web.json_response(
            {"access_token": TOKEN, "token_type": "Bearer", "expires_in": 3600}
        )


async def _token_endpoint(endpoint: TokenEndpoint) -> tuple[web.AppRunner, str]:
    app = web.Application()
    app.router.add_post("/token", endpoint.handle)
    runner = web.AppRunner(app, access_log=None, shutdown_timeout=0.5)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    return runner, f"http://127.0.0.1:{runner.addresses[0][1]}/token"


def _compact(value: Any) -> bytes:
    """JSON as JavaScript's JSON.stringify writes these values (no spaces, UTF-8)."""
    return json.dumps(value, separators=(",", ":"), ensure_ascii=False).encode()


def _settings(db_url: str, base: str, token_url: str) -> dict[str, Any]:
    settings = settings_dict(db_url)
    settings["sources"][0]["destinations"] = ["crm"]
    settings["destinations"] = [
        {
            "name": "crm",
            "type": "actions",
            "shared_secret": SECRET,
            "signing": ["x-signature", "standard-webhooks"],
            "standard_webhooks_secrets": [WHSEC],
            "actions": [
                {
                    "name": "orders",
                    "trigger": 'type = "track" and event = "Order Completed"',
                    "url": base + "/orders/{{userId}}?src=efd",
                    "method": "PUT",
                    "headers": {"X-Source": "efd"},
                    "auth": {
                        "type": "oauth2_client_credentials",
                        "token_url": token_url,
                        "client_id": "efd",
                        "client_secret": "client-s3cret",
                        "scope": "orders:write",
                    },
                    "data": {
                        "order_id": {"@path": "$.properties.order_id"},
                        "email": {
                            "@case": {
                                "operator": "lower",
                                "value": {"@path": "$.properties.email"},
                            }
                        },
                        "summary": {"@template": "{{userId}} paid {{properties.revenue}}"},
                    },
                },
                {
                    "name": "people",
                    "trigger": 'type = "identify"',
                    "url": base + "/people",
                    "method": "PATCH",
                    "content_type": "application/x-www-form-urlencoded",
                    "auth": {"type": "bearer", "token": "static-t0ken"},
                    "data": {
                        "email": {"@path": "$.traits.email"},
                        "plan": {"@path": "$.traits.plan"},
                    },
                },
                {
                    # The same messages as orders, with the default data: the whole message.
                    "name": "audit",
                    "trigger": 'event = "Order Completed"',
                    "url": base + "/audit",
                },
                {
                    # A form body is made of an object's keys: an array cannot be one.
                    "name": "tags",
                    "trigger": 'event = "Tagged"',
                    "url": base + "/tags",
                    "content_type": "application/x-www-form-urlencoded",
                    "data": {"@path": "$.properties.tags"},
                },
            ],
        }
    ]
    return settings


async def test_each_matching_action_sends_its_own_request(
    db_url: str, receiver_factory: ReceiverFactory, daemon_factory: DaemonFactory
) -> None:
    seen = Seen()
    receiver = await receiver_factory(seen)
    base = receiver.url.removesuffix("/hook")
    endpoint = TokenEndpoint()
    runner, token_url = await _token_endpoint(endpoint)
    try:
        daemon = await daemon_factory(_settings(db_url, base, token_url))
        batch = [
            {
                "type": "track",
                "userId": "ü 1/2",
                "event": "Order Completed",
                "messageId": "m-order",
                "properties": {"order_id": "o-7", "email": "Ann@Example.COM", "revenue": 9.5},
            },
            {
                "type": "identify",
                "userId": "u2",
                "messageId": "m-person",
                "traits": {"email": "b@example.com", "plan": {"tier": "pro", "seats": 3}},
            },
            {
                "type": "track",
                "userId": "u3",
                "event": "Tagged",
                "messageId": "m-tags",
                "properties": {"tags": ["a", "b"]},
            },
            {"type": "page", "userId": "u4", "name": "Home", "messageId": "m-page"},
        ]
        status, _ = await post(daemon.port, "/v1/batch", {"batch": batch})
        assert status == 200
        await receiver.wait_for(3)

        # PUT with the message's userId in the path, percent-encoded; the token fetched.
        path, headers, body = seen.by_method("PUT")
        assert path == "/orders/%C3%BC%201%2F2?src=efd"
        assert body == _compact(
            {"order_id": "o-7", "email": "ann@example.com", "summary": "ü 1/2 paid 9.5"}
        )
        assert headers["Content-Type"] == "application/json"
        assert headers["X-Source"] == "efd"
        assert headers["Authorization"] == f"Bearer {TOKEN}"
        expected = hmac.new(SECRET.encode(), body, hashlib.sha1).hexdigest()
        assert headers["X-Signature"] == expected
        Webhook(WHSEC).verify(body, headers)
        [(client_auth, form)] = endpoint.asked
        assert client_auth == "Basic " + base64.b64encode(b"efd:client-s3cret").decode()
        assert form == b"grant_type=client_credentials&scope=orders%3Awrite"

        # PATCH as a form: a nested value as its JSON; the static bearer token.
        path, headers, body = seen.by_method("PATCH")
        assert path == "/people"
        assert body == b"email=b%40example.com&plan=%7B%22tier%22%3A%22pro%22%2C%22seats%22%3A3%7D"
        assert headers["Content-Type"] == "application/x-www-form-urlencoded"
        assert headers["Authorization"] == "Bearer static-t0ken"
        # The stock verifier reads the body as JSON once the signature holds: a form body's
        # signature is checked by signing it with the same library.
        stamp = datetime.fromtimestamp(int(headers["webhook-timestamp"]), tz=UTC)
        signed = Webhook(WHSEC).sign(headers["webhook-id"], stamp, body.decode())
        assert signed in headers["webhook-signature"].split(" ")

        # The default data is the message as a classic webhook would carry it.
        path, headers, body = seen.by_method("POST")
        assert path == "/audit"
        [(stored_body,)] = sql(db_url, "SELECT body FROM messages WHERE message_id = 'm-order'")
        assert body == stored_body.encode()
        Webhook(WHSEC).verify(body, headers)
        # One message's requests to two actions are two webhooks: each its own webhook-id,
        # so a receiver that drops repeated ids keeps both.
        order_ids = {h["webhook-id"] for m, _, h, _ in seen.requests if m in ("PUT", "POST")}
        assert len(order_ids) == 2

        def rows() -> list[Any]:
            return sql(
                db_url,
                "SELECT m.message_id, d.destination, d.status, d.url, d.body, d.last_error "
                "FROM deliveries d JOIN messages m ON m.id = d.message_pk "
                "ORDER BY m.message_id, d.destination",
            )

        def settled() -> list[Any] | None:
            found = rows()
            return found if all(r[2] != "pending" for r in found) else None

        found = await eventually(settled)
        by_key = {(r[0], r[1]): r for r in found}
        assert set(by_key) == {
            ("m-order", "crm/orders"),
            ("m-order", "crm/audit"),
            ("m-person", "crm/people"),
            ("m-tags", "crm/tags"),
            ("m-page", "crm"),
        }
        order = by_key["m-order", "crm/orders"]
        assert order[2] == "delivered"
        assert order[3] == base + "/orders/%C3%BC%201%2F2?src=efd"
        assert order[4].encode() == seen.by_method("PUT")[2]
        tags = by_key["m-tags", "crm/tags"]
        assert tags[2] == "failed"
        assert "form body" in tags[5]
        assert "array" in tags[5]
        page = by_key["m-page", "crm"]
        assert page[2] == "filtered"
        assert "trigger" in page[5]
        # The failed and filtered ones were never sent, and nothing was sent twice.
        assert len(seen.requests) == 3
        # No secret is stored with a delivery or an attempt.
        stored = repr(sql(db_url, "SELECT * FROM attempts")) + repr(found)
        for secret in ("client-s3cret", TOKEN, "static-t0ken"):
            assert secret not in stored
    finally:
        await runner.cleanup()
