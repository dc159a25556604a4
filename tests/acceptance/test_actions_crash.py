"""An Actions destination's deliveries across a kill -9: the mapped body and the rendered URL
are stored at routing, so after the crash the same bytes go to the same URL, signed alike,
even when the mapping changed meanwhile, and nothing acknowledged is lost. A real `efd serve`
killed with SIGKILL."""

from __future__ import annotations

import hashlib
import hmac
from collections import defaultdict
from pathlib import Path
from typing import Any

import pytest
from aiohttp import web

from tests.conftest import (
    SECRET,
    DaemonProcess,
    ReceiverFactory,
    eventually,
    free_port,
    post,
    settings_dict,
    sql,
    write_toml,
)

pytestmark = pytest.mark.slow


class Refusing:
    """Answers 503 until switched on, keeping what each request carried."""

    def __init__(self) -> None:
        self.up = False
        self.seen: list[tuple[str, str, bytes, str]] = []

    async def __call__(self, request: web.Request, _n: int) -> web.StreamResponse:
        body = await request.read()
        signature = request.headers.get("X-Signature", "")
        self.seen.append((request.method, request.raw_path, body, signature))
        return web.Response(status=200 if self.up else 503)


async def test_kill_9_between_routing_and_delivery_resends_the_same_bytes(
    db_url: str, receiver_factory: ReceiverFactory, tmp_path: Path
) -> None:
    refusing = Refusing()
    receiver = await receiver_factory(refusing)
    base = receiver.url.removesuffix("/hook")
    # On PostgreSQL the killed process's leases lapse before its deliveries are claimed
    # again: a short lease keeps the test short.
    settings: dict[str, Any] = settings_dict(
        db_url,
        delivery={
            "timeout_seconds": 2,
            "lease_seconds": 8,
            "retry_initial_seconds": 0.3,
            "retry_max_seconds": 0.6,
            "retry_window_seconds": 600,
        },
    )
    settings["sources"][0]["destinations"] = ["crm"]
    settings["destinations"] = [
        {
            "name": "crm",
            "type": "actions",
            "shared_secret": SECRET,
            "actions": [
                {
                    "name": "orders",
                    "trigger": 'type = "track"',
                    "url": base + "/orders/{{userId}}",
                    "method": "PUT",
                    "data": {
                        "id": {"@path": "$.messageId"},
                        "total": {"@path": "$.properties.total"},
                    },
                }
            ],
        }
    ]
    port = free_port()
    settings["server"] = {"host": "127.0.0.1", "port": port}
    settings["logging"] = {"level": "INFO"}
    daemon = DaemonProcess(write_toml(tmp_path / "efd.toml", settings), port, tmp_path / "efd.log")
    daemon.start()
    try:
        batch = [
            {
                "type": "track",
                "userId": f"user {i}",
                "event": "E",
                "messageId": f"k{i}",
                "properties": {"total": i * 1.5},
            }
            for i in range(20)
        ]
        status, _ = await post(daemon.port, "/v1/batch", {"batch": batch})
        assert status == 200
        # Each was mapped, stored and refused once: routed, and not delivered.
        await eventually(
            lambda: sql(db_url, "SELECT count(*) FROM deliveries WHERE attempts >= 1") == [(20,)],
            timeout=45,
        )
        daemon.kill()
        before: dict[str, set[tuple[str, str, bytes, str]]] = defaultdict(set)
        for seen in refusing.seen:
            before[seen[1]].add(seen)
        assert len(before) == 20

        # The restart comes with another mapping: what was routed before goes as it was
        # mapped then, since the body is stored with its delivery.
        settings["destinations"][0]["actions"][0]["data"] = {"changed": {"@path": "$.userId"}}
        write_toml(tmp_path / "efd.toml", settings)
        refusing.up = True
        refusing.seen.clear()
        daemon.start()
        await eventually(
            lambda: (
                sql(db_url, "SELECT count(*) FROM deliveries WHERE status = 'delivered'") == [(20,)]
            ),
            timeout=60,
        )
        after: dict[str, set[tuple[str, str, bytes, str]]] = defaultdict(set)
        for seen in refusing.seen:
            if seen[0] == "PUT":
                after[seen[1]].add(seen)
        # Every target got, after the restart, exactly what it was sent before: one method,
        # URL, body and signature, each signature over those bytes.
        assert after == before
        for requests in after.values():
            [(method, _, body, signature)] = requests
            assert method == "PUT"
            assert signature == hmac.new(SECRET.encode(), body, hashlib.sha1).hexdigest()
        stored = sql(db_url, "SELECT url, body FROM deliveries ORDER BY id")
        assert {url.removeprefix(base) for url, _ in stored} == set(after)
        assert sql(db_url, "SELECT count(*) FROM deliveries") == [(20,)]
    finally:
        daemon.ensure_stopped()
