"""What is happening now: GET /admin/destinations (health, circuit) and GET /admin/stream
(server-sent events), against real daemons and receivers on 127.0.0.1."""

from __future__ import annotations

import asyncio
import json
import socket
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from aiohttp import web

from efd import config
from efd.observe.stream import MAX_SUBSCRIBERS, Hub
from efd.segment import webhooks
from tests.conftest import (
    DaemonFactory,
    ReceiverFactory,
    StartedDaemon,
    eventually,
    post,
    settings_dict,
)
from tests.integration.test_regulations import api

TOKEN = "live-secret-0123456789"


def live_settings(db_url: str, hooks: list[str], **delivery: Any) -> dict[str, Any]:
    settings = settings_dict(db_url, hooks, delivery=delivery)
    settings["server"]["admin_token"] = TOKEN
    return settings


async def fails(_request: web.Request, _n: int) -> web.StreamResponse:
    return web.Response(status=503, text="down for maintenance")


async def test_destinations_show_backlog_health_and_an_open_circuit(
    db_url: str, receiver_factory: ReceiverFactory, daemon_factory: DaemonFactory
) -> None:
    failing = await receiver_factory(fails)
    healthy = await receiver_factory()
    # No probe and no retry within the test: the failing hook's attempts are those that
    # opened its circuit (two, or three when the third round started before they ended).
    settings = live_settings(
        db_url,
        [failing.url],
        circuit_failures=2,
        circuit_probe_seconds=600,
        retry_initial_seconds=60,
        retry_max_seconds=60,
    )
    settings["destinations"].append(
        {"name": "ok", "type": "webhooks", "hooks": [{"url": healthy.url + "?key=s3cret"}]}
    )
    settings["sources"][0]["destinations"].append("ok")
    daemon = await daemon_factory(settings)
    for i in range(3):
        status, _ = await post(
            daemon.port, "/v1/track", {"userId": "u", "event": "E", "messageId": f"m{i}"}
        )
        assert status == 200
    await healthy.wait_for(3)
    await failing.wait_for(2)

    async def read() -> dict[str, Any]:
        status, answer = await api(daemon.port, "GET", "/admin/destinations", token=TOKEN)
        assert status == 200, answer
        return {d["name"]: d for d in answer["destinations"]}

    found: dict[str, Any] = {}
    for _ in range(200):  # polls the endpoint until the attempts are recorded
        found = await read()
        hook = found["hooks"]["hooks"][0]
        ok_hook = found["ok"]["hooks"][0]
        if (
            hook["circuit"] == "open"
            and hook["window"]["1h"]["attempts"] == len(failing.received)
            and ok_hook["window"]["1h"]["attempts"] == 3
            and found["ok"]["backlog"] == 0
        ):
            break
        await asyncio.sleep(0.05)
    else:
        raise AssertionError(f"circuit not shown open: {found}")
    down = found["hooks"]
    assert down["backlog"] == 3
    assert isinstance(down["oldestPendingAt"], str)
    assert down["oldestPendingAt"].endswith("Z")
    [hook] = down["hooks"]
    assert hook["url"] == failing.url
    assert hook["circuit"] == "open"
    assert hook["lastError"] == "HTTP 503"
    assert hook["lastErrorAt"].endswith("Z")
    one_hour = hook["window"]["1h"]
    assert one_hour["attempts"] == len(failing.received) in (2, 3)
    assert one_hour["successRate"] == 0.0
    assert one_hour["p50Ms"] > 0
    assert one_hour["p99Ms"] >= one_hour["p50Ms"]
    assert hook["window"]["24h"]["attempts"] == one_hour["attempts"]
    up = found["ok"]
    assert up["backlog"] == 0
    assert up["oldestPendingAt"] is None
    [ok_hook] = up["hooks"]
    # The query value stays hidden, as in the attempts table.
    assert ok_hook["url"] == webhooks.redact_url(healthy.url + "?key=s3cret")
    assert "s3cret" not in json.dumps(found)
    assert ok_hook["circuit"] == "closed"
    assert ok_hook["lastError"] is None
    assert ok_hook["window"]["1h"]["successRate"] == 1.0


async def test_two_destinations_on_one_url_each_count_only_their_own_attempts(
    db_url: str, receiver_factory: ReceiverFactory, daemon_factory: DaemonFactory
) -> None:
    shared = await receiver_factory()
    settings = live_settings(db_url, [shared.url])
    settings["destinations"].append(
        {"name": "twin", "type": "webhooks", "hooks": [{"url": shared.url}]}
    )
    settings["sources"][0]["destinations"].append("twin")
    daemon = await daemon_factory(settings)
    for i in range(3):
        status, _ = await post(
            daemon.port, "/v1/track", {"userId": "u", "event": "E", "messageId": f"m{i}"}
        )
        assert status == 200
    await shared.wait_for(6)

    async def counts() -> dict[str, int]:
        status, answer = await api(daemon.port, "GET", "/admin/destinations", token=TOKEN)
        assert status == 200, answer
        return {
            d["name"]: d["hooks"][0]["window"]["1h"]["attempts"] for d in answer["destinations"]
        }

    found: dict[str, int] = {}
    for _ in range(200):  # polls the endpoint until the attempts are recorded
        found = await counts()
        if found == {"hooks": 3, "twin": 3}:
            break
        await asyncio.sleep(0.05)
    else:
        raise AssertionError(f"not counted per destination: {found}")


@pytest.mark.parametrize(("token", "status"), [(None, 401), ("wrong", 401)])
async def test_live_endpoints_need_the_token(
    tmp_path: Path, daemon_factory: DaemonFactory, token: str | None, status: int
) -> None:
    daemon = await daemon_factory(live_settings(f"sqlite:///{tmp_path}/efd.db", []))
    for path in ("/admin/destinations", "/admin/stream", "/admin/recent", "/admin/rates"):
        got, answer = await api(daemon.port, "GET", path, token=token)
        assert (got, answer["code"]) == (status, "unauthorized")


async def test_live_endpoints_and_console_are_off_without_a_token(
    tmp_path: Path, daemon_factory: DaemonFactory
) -> None:
    daemon = await daemon_factory(settings_dict(f"sqlite:///{tmp_path}/efd.db"))
    for path in ("/admin/destinations", "/admin/stream", "/console"):
        got, answer = await api(daemon.port, "GET", path, token="anything")
        assert got == 403
        assert answer["code"] == "admin_api_disabled"
        assert "admin_token" in answer["message"]


async def test_recent_lists_the_newest_messages_with_each_destinations_state(
    db_url: str, receiver_factory: ReceiverFactory, daemon_factory: DaemonFactory
) -> None:
    failing = await receiver_factory(fails)
    healthy = await receiver_factory()
    settings = live_settings(db_url, [failing.url], retry_initial_seconds=60, retry_max_seconds=60)
    settings["destinations"].append(
        {"name": "ok", "type": "webhooks", "hooks": [{"url": healthy.url}]}
    )
    settings["sources"][0]["destinations"].append("ok")
    daemon = await daemon_factory(settings)
    status, answer = await api(daemon.port, "GET", "/admin/recent", token=TOKEN)
    assert (status, answer) == (200, {"messages": []})
    for i in range(3):
        status, _ = await post(
            daemon.port, "/v1/track", {"userId": "u", "event": f"E{i}", "messageId": f"m{i}"}
        )
        assert status == 200
    await healthy.wait_for(3)

    found: Any = None
    for _ in range(200):  # polls until both destinations' outcomes are recorded
        status, found = await api(daemon.port, "GET", "/admin/recent?limit=2", token=TOKEN)
        assert status == 200, found
        if all(
            m["destinations"] == {"hooks": "failing", "ok": "delivered"} for m in found["messages"]
        ):
            break
        await asyncio.sleep(0.05)
    messages = found["messages"]
    assert [m["messageId"] for m in messages] == ["m2", "m1"]
    assert [m["event"] for m in messages] == ["E2", "E1"]
    for message in messages:
        assert message["source"] == "web"
        assert message["type"] == "track"
        assert message["receivedAt"].endswith("Z")
        # Tried once and due again: "failing", as the live stream says, not "pending".
        assert message["destinations"] == {"hooks": "failing", "ok": "delivered"}


@pytest.mark.parametrize(
    "query", ["limit=0", "limit=201", "limit=x", "limit=-1", "limit=1&limit=2", "since=1"]
)
async def test_recent_refuses_bad_parameters(
    tmp_path: Path, daemon_factory: DaemonFactory, query: str
) -> None:
    daemon = await daemon_factory(live_settings(f"sqlite:///{tmp_path}/efd.db", []))
    got, answer = await api(daemon.port, "GET", f"/admin/recent?{query}", token=TOKEN)
    assert got == 400, answer
    assert answer["code"] == "invalid_field"


async def test_rates_count_delivered_and_failed_per_destination_and_minute(
    db_url: str, receiver_factory: ReceiverFactory, daemon_factory: DaemonFactory
) -> None:
    async def refuses(_request: web.Request, _n: int) -> web.StreamResponse:
        return web.Response(status=400, text="no")

    refusing = await receiver_factory(refuses)
    healthy = await receiver_factory()
    settings = live_settings(db_url, [refusing.url])
    settings["destinations"].append(
        {"name": "ok", "type": "webhooks", "hooks": [{"url": healthy.url}]}
    )
    settings["sources"][0]["destinations"].append("ok")
    daemon = await daemon_factory(settings)
    for i in range(3):
        status, _ = await post(
            daemon.port, "/v1/track", {"userId": "u", "event": "E", "messageId": f"m{i}"}
        )
        assert status == 200
    await healthy.wait_for(3)
    await refusing.wait_for(3)

    found: Any = None
    for _ in range(200):  # polls until the deliveries are finished
        status, found = await api(daemon.port, "GET", "/admin/rates?minutes=5", token=TOKEN)
        assert status == 200, found
        totals = {
            name: {kind: sum(counts) for kind, counts in series.items()}
            for name, series in found["destinations"].items()
        }
        if totals == {
            "hooks": {"delivered": 0, "failed": 3},
            "ok": {"delivered": 3, "failed": 0},
        }:
            break
        await asyncio.sleep(0.05)
    else:
        raise AssertionError(f"rates not counted: {found}")
    assert len(found["minutes"]) == 5
    assert all(m.endswith("Z") for m in found["minutes"])
    for series in found["destinations"].values():
        assert len(series["delivered"]) == len(series["failed"]) == 5
    # The messages were sent within the last minute or two: the newest bars hold them.
    assert sum(found["destinations"]["ok"]["delivered"][-2:]) == 3
    status, default = await api(daemon.port, "GET", "/admin/rates", token=TOKEN)
    assert status == 200
    assert len(default["minutes"]) == 60


@pytest.mark.parametrize(
    "query", ["minutes=0", "minutes=61", "minutes=1.5", "minutes=5&minutes=6", "limit=3"]
)
async def test_rates_refuse_bad_parameters(
    tmp_path: Path, daemon_factory: DaemonFactory, query: str
) -> None:
    daemon = await daemon_factory(live_settings(f"sqlite:///{tmp_path}/efd.db", []))
    got, answer = await api(daemon.port, "GET", f"/admin/rates?{query}", token=TOKEN)
    assert got == 400, answer
    assert answer["code"] == "invalid_field"


async def events(response: aiohttp.ClientResponse) -> AsyncIterator[tuple[str, Any]]:
    kind = None
    async for raw in response.content:
        line = raw.decode().rstrip("\n")
        if line.startswith("event: "):
            kind = line.removeprefix("event: ")
        elif line.startswith("data: "):
            yield kind or "message", json.loads(line.removeprefix("data: "))


async def test_stream_shows_accepted_messages_and_their_attempts(
    db_url: str, receiver_factory: ReceiverFactory, daemon_factory: DaemonFactory
) -> None:
    receiver = await receiver_factory()
    daemon = await daemon_factory(live_settings(db_url, [receiver.url]))
    async with (
        aiohttp.ClientSession() as session,
        session.get(
            f"http://127.0.0.1:{daemon.port}/admin/stream",
            headers={"Authorization": f"Bearer {TOKEN}"},
        ) as response,
    ):
        assert response.status == 200
        assert response.headers["Content-Type"] == "text/event-stream"
        await eventually(lambda: daemon.hub.subscribers == 1)
        await post(
            daemon.port, "/v1/track", {"userId": "u-7", "event": "Signed Up", "messageId": "s-1"}
        )
        seen: dict[str, Any] = {}
        async with asyncio.timeout(10):
            async for kind, data in events(response):
                seen[kind] = data
                if "message" in seen and "attempt" in seen:
                    break
    message = seen["message"]
    assert message["source"] == "web"
    assert message["messageId"] == "s-1"
    assert (message["type"], message["userId"], message["event"]) == ("track", "u-7", "Signed Up")
    assert message["receivedAt"].endswith("Z")
    attempt = seen["attempt"]
    assert attempt["destination"] == "hooks"
    assert attempt["url"] == receiver.url
    assert attempt["messageId"] == "s-1"
    assert (attempt["statusCode"], attempt["error"], attempt["delivered"]) == (200, None, True)
    assert attempt["durationMs"] > 0
    await eventually(lambda: daemon.hub.subscribers == 0)


async def test_a_consumer_that_never_reads_is_dropped_and_ingestion_goes_on(tmp_path: Path) -> None:
    settings = live_settings(f"sqlite:///{tmp_path}/efd.db", ["http://127.0.0.1:9/unused"])
    settings["sources"][0]["destinations"] = []  # messages only: no delivery work
    # A small buffer: dropped after little traffic.
    daemon = StartedDaemon(config.load(None, **settings), hub=Hub(buffer=50, rate=100_000))
    await daemon.start()
    try:
        stalled = socket.socket()
        stalled.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
        stalled.connect(("127.0.0.1", daemon.port))
        request = f"GET /admin/stream HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {TOKEN}\r\n\r\n"
        stalled.sendall(request.encode())
        await eventually(lambda: daemon.hub.subscribers == 1)
        batches = 0
        while daemon.hub.dropped_subscribers == 0:
            batch = [
                {"type": "track", "event": "E" * 200, "userId": "u", "messageId": f"b{batches}-{i}"}
                for i in range(500)
            ]
            status, _ = await post(daemon.port, "/v1/batch", {"batch": batch})
            assert status == 200  # never held up by the stalled reader
            batches += 1
            assert batches < 200, "the stalled subscriber was never dropped"
        assert daemon.hub.subscribers == 0
        status, _ = await post(daemon.port, "/v1/track", {"userId": "u", "event": "After"})
        assert status == 200
        stalled.close()
    finally:
        await daemon.stop()


def stream_request(token: str) -> bytes:
    return (
        f"GET /admin/stream HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {token}\r\n\r\n"
    ).encode()


async def test_open_streams_end_when_the_admin_token_changes_or_is_removed(tmp_path: Path) -> None:
    settings = live_settings(f"sqlite:///{tmp_path}/efd.db", ["http://127.0.0.1:9/unused"])
    settings["sources"][0]["destinations"] = []  # messages only: no delivery work
    daemon = StartedDaemon(config.load(None, **settings))
    await daemon.start()
    try:
        async with aiohttp.ClientSession() as session:

            async def subscribe(token: str) -> aiohttp.ClientResponse:
                response = await session.get(
                    f"http://127.0.0.1:{daemon.port}/admin/stream",
                    headers={"Authorization": f"Bearer {token}"},
                )
                assert response.status == 200
                return response

            async def rest(response: aiohttp.ClientResponse) -> list[tuple[str, Any]]:
                async with asyncio.timeout(10):
                    return [event async for event in events(response)]

            first = await subscribe(TOKEN)
            # A stream that never reads (beyond its request), on its own socket.
            stalled = socket.socket()
            stalled.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
            stalled.connect(("127.0.0.1", daemon.port))
            stalled.sendall(stream_request(TOKEN))
            await eventually(lambda: daemon.hub.subscribers == 2)
            # A reload that keeps the token keeps the streams.
            settings["sources"].append({"name": "app", "write_key": "wk_app", "destinations": []})
            await daemon.reload(config.load(None, **settings))
            await post(daemon.port, "/v1/track", {"userId": "u", "event": "Kept", "messageId": "k"})
            async with asyncio.timeout(10):
                async for kind, data in events(first):
                    if kind == "message":
                        assert data["messageId"] == "k"
                        break
            assert daemon.hub.subscribers == 2

            settings["server"]["admin_token"] = "live-secret-rotated-0123"
            await daemon.reload(config.load(None, **settings))
            assert await rest(first) == []  # ended, with nothing more
            await eventually(lambda: daemon.hub.subscribers == 0)
            stalled.settimeout(10)
            while stalled.recv(65536):  # what was sent before, then the end
                pass
            stalled.close()
            got, answer = await api(daemon.port, "GET", "/admin/stream", token=TOKEN)
            assert (got, answer["code"]) == (401, "unauthorized")

            second = await subscribe("live-secret-rotated-0123")
            await eventually(lambda: daemon.hub.subscribers == 1)
            settings["server"].pop("admin_token")
            await daemon.reload(config.load(None, **settings))
            assert await rest(second) == []
            await eventually(lambda: daemon.hub.subscribers == 0)
            got, answer = await api(daemon.port, "GET", "/admin/stream", token=TOKEN)
            assert (got, answer["code"]) == (403, "admin_api_disabled")
    finally:
        await daemon.stop()


async def test_streams_beyond_the_bound_are_refused_with_503(
    tmp_path: Path, daemon_factory: DaemonFactory
) -> None:
    daemon = await daemon_factory(live_settings(f"sqlite:///{tmp_path}/efd.db", []))
    streams = []
    for _ in range(MAX_SUBSCRIBERS):
        reader, writer = await asyncio.open_connection("127.0.0.1", daemon.port)
        writer.write(stream_request(TOKEN))
        assert (await reader.readuntil(b"\r\n")).startswith(b"HTTP/1.1 200")
        streams.append(writer)
    assert daemon.hub.subscribers == MAX_SUBSCRIBERS
    got, answer = await api(daemon.port, "GET", "/admin/stream", token=TOKEN)
    assert (got, answer["code"]) == (503, "too_many_streams")
    assert str(MAX_SUBSCRIBERS) in answer["message"]
    # Other admin endpoints are not affected.
    assert (await api(daemon.port, "GET", "/admin/destinations", token=TOKEN))[0] == 200
    streams.pop().close()
    await eventually(lambda: daemon.hub.subscribers == MAX_SUBSCRIBERS - 1)
    reader, writer = await asyncio.open_connection("127.0.0.1", daemon.port)
    writer.write(stream_request(TOKEN))
    assert (await reader.readuntil(b"\r\n")).startswith(b"HTTP/1.1 200")
    streams.append(writer)
    for writer in streams:
        writer.close()
    await eventually(lambda: daemon.hub.subscribers == 0)
