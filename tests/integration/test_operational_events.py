"""Operational events against real daemons and real receivers on 127.0.0.1, on SQLite and
PostgreSQL: a hook whose circuit opens and closes, a delivery that fails for good, pauses
and resumes from the admin API and the CLI, a flood bounded by the per-minute cap, and an
operations destination that fails without a word about itself."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import pytest
from aiohttp import web

from efd.segment import webhooks
from tests.conftest import (
    SECRET,
    DaemonFactory,
    Received,
    Receiver,
    ReceiverFactory,
    eventually,
    metric,
    metrics_text,
    settings_dict,
    write_toml,
)
from tests.integration.test_operators import TOKEN, run_cli, send
from tests.integration.test_regulations import api


def ops_settings(
    db_url: str, hook: str, ops: str, *, operations: dict[str, Any] | None = None, **delivery: Any
) -> dict[str, Any]:
    settings = settings_dict(db_url, [hook], delivery=delivery)
    settings["server"]["admin_token"] = TOKEN
    settings["destinations"].append(
        {"name": "ops", "type": "webhooks", "shared_secret": SECRET, "hooks": [{"url": ops}]}
    )
    settings["operations"] = {"destination": "ops", **(operations or {})}
    return settings


def named(receiver: Receiver, name: str) -> list[dict[str, Any]]:
    return [b for b in (r.json() for r in receiver.received) if b.get("event") == name]


def signed(request: Received) -> dict[str, Any]:
    """The event's body, after checking its signature as a receiver would."""
    assert request.headers["X-Signature"] == webhooks.sign(SECRET, request.body)
    body: dict[str, Any] = request.json()
    return body


async def test_a_failing_hook_is_told_signed_and_so_is_its_recovery(
    db_url: str, receiver_factory: ReceiverFactory, daemon_factory: DaemonFactory
) -> None:
    up = False

    async def flaky(_request: web.Request, _n: int) -> web.StreamResponse:
        return web.Response(status=200 if up else 503)

    hook = await receiver_factory(flaky)
    ops = await receiver_factory()
    daemon = await daemon_factory(
        ops_settings(db_url, hook.url, ops.url, circuit_failures=3, circuit_probe_seconds=0.3)
    )
    for i in range(5):
        await send(daemon.port, f"m-{i}")
    await eventually(lambda: named(ops, "hook.failing"), timeout=20)
    [request] = [r for r in ops.received if r.json().get("event") == "hook.failing"]
    body = signed(request)
    assert body["type"] == "track"
    assert body["userId"] == "efd"
    assert body["properties"]["destination"] == "hooks"
    assert body["properties"]["hook"] == hook.url
    assert body["properties"]["failures"] == 3
    assert body["properties"]["probeSeconds"] == 0.3
    assert body["properties"]["lastAnswer"]["statusCode"] == 503

    up = True
    await eventually(lambda: named(ops, "hook.recovered"), timeout=20)
    [recovered] = named(ops, "hook.recovered")
    assert recovered["properties"]["destination"] == "hooks"
    assert recovered["properties"]["failingSeconds"] > 0
    assert len(named(ops, "hook.failing")) == 1  # once per crossing, not per failure
    text = await metrics_text(daemon.port, TOKEN)
    assert metric(text, "efd_operations_events_total", event="hook.failing") == 1
    assert metric(text, "efd_operations_events_total", event="hook.recovered") == 1


async def test_an_exhausted_delivery_is_told_without_its_payload(
    db_url: str, receiver_factory: ReceiverFactory, daemon_factory: DaemonFactory
) -> None:
    async def refuse(_request: web.Request, _n: int) -> web.StreamResponse:
        return web.Response(status=422, text="no such customer")

    hook = await receiver_factory(refuse)
    ops = await receiver_factory()
    daemon = await daemon_factory(ops_settings(db_url, hook.url, ops.url))
    await send(daemon.port, "m-secret")
    await eventually(lambda: named(ops, "delivery.exhausted"))
    [request] = ops.received
    body = signed(request)
    properties = body["properties"]
    assert properties["destination"] == "hooks"
    assert properties["source"] == "web"
    assert properties["messageId"] == "m-secret"
    assert properties["status"] == "failed"
    assert properties["attempts"] == 1
    assert properties["lastAnswer"] == {
        "hook": hook.url,
        "statusCode": 422,
        "error": "no such customer",
    }
    assert b"Bought" not in request.body  # the message's own event: never in the event
    assert set(body) == {
        "version",
        "type",
        "userId",
        "event",
        "properties",
        "context",
        "messageId",
        "timestamp",
    }


async def test_a_flood_of_failures_sends_a_bounded_number_of_events(
    db_url: str, receiver_factory: ReceiverFactory, daemon_factory: DaemonFactory
) -> None:
    async def refuse(_request: web.Request, _n: int) -> web.StreamResponse:
        return web.Response(status=400)

    hook = await receiver_factory(refuse)
    ops = await receiver_factory()
    cap, flood = 5, 40
    daemon = await daemon_factory(
        ops_settings(db_url, hook.url, ops.url, operations={"max_events_per_minute": cap})
    )
    for i in range(flood):
        await send(daemon.port, f"m-{i}")
    metrics = daemon.metrics
    await eventually(
        lambda: (
            metrics.operations_events["delivery.exhausted"]
            + metrics.operations_dropped["delivery.exhausted"]
            == flood
        ),
        timeout=20,
    )
    sent = metrics.operations_events["delivery.exhausted"]
    text = await metrics_text(daemon.port, TOKEN)
    dropped = metric(text, "efd_operations_events_dropped_total", event="delivery.exhausted")
    assert dropped == flood - sent
    # At most the cap in each minute of the clock: the flood may straddle one boundary.
    assert cap <= sent <= 2 * cap
    await eventually(lambda: len(named(ops, "delivery.exhausted")) == sent)
    await asyncio.sleep(0.5)
    assert len(named(ops, "delivery.exhausted")) == sent


async def test_pauses_and_resumes_are_told_from_the_admin_api_and_the_cli(
    db_url: str, tmp_path: Path, receiver_factory: ReceiverFactory, daemon_factory: DaemonFactory
) -> None:
    hook = await receiver_factory()
    ops = await receiver_factory()
    settings = ops_settings(db_url, hook.url, ops.url)
    path = write_toml(tmp_path / "efd.toml", settings)
    with path.open("a") as file:  # write_toml knows the sections it was written for
        file.write('[operations]\ndestination = "ops"\n')
    config = str(path)
    daemon = await daemon_factory(settings)
    status, answer = await api(
        daemon.port, "POST", "/admin/destinations/hooks/pause", {"reason": "upgrade"}
    )
    assert status == 200, answer
    await eventually(lambda: named(ops, "hook.paused"))
    [paused] = named(ops, "hook.paused")
    assert paused["properties"] == {
        "destination": "hooks",
        "hook": None,
        "reason": "upgrade",
        "since": paused["properties"]["since"],
        "by": "admin API",
    }
    status, answer = await api(daemon.port, "POST", "/admin/destinations/hooks/resume")
    assert status == 200, answer
    await eventually(lambda: named(ops, "hook.resumed"))
    [resumed] = named(ops, "hook.resumed")
    assert resumed["properties"]["was"] == "paused"
    assert resumed["properties"]["by"] == "admin API"

    # From the CLI, as from another process: it stores the event; the daemon delivers it.
    code, _, err = await asyncio.to_thread(
        run_cli, "pause", "hooks", "--hook", "1", "--reason", "cli", "--config", config
    )
    assert code == 0, err
    await eventually(lambda: len(named(ops, "hook.paused")) == 2)
    by_cli = named(ops, "hook.paused")[1]["properties"]
    assert (by_cli["hook"], by_cli["reason"], by_cli["by"]) == (1, "cli", "command line")
    code, _, err = await asyncio.to_thread(
        run_cli, "resume", "hooks", "--hook", "1", "--config", config
    )
    assert code == 0, err
    await eventually(lambda: len(named(ops, "hook.resumed")) == 2)
    for request in ops.received:
        signed(request)
    # A resume of what was not paused changes nothing and tells nothing.
    code, _, err = await asyncio.to_thread(run_cli, "resume", "hooks", "--config", config)
    assert code == 0, err
    await asyncio.sleep(1.5)
    assert len(named(ops, "hook.resumed")) == 2


async def test_the_operations_destination_failing_tells_nothing_about_itself(
    db_url: str, receiver_factory: ReceiverFactory, daemon_factory: DaemonFactory
) -> None:
    async def refuse(_request: web.Request, _n: int) -> web.StreamResponse:
        return web.Response(status=400)

    async def down(_request: web.Request, _n: int) -> web.StreamResponse:
        return web.Response(status=503)

    hook = await receiver_factory()
    ops = await receiver_factory(refuse)
    daemon = await daemon_factory(
        ops_settings(db_url, hook.url, ops.url, circuit_failures=1, circuit_probe_seconds=0.2)
    )
    # Pausing and resuming the operations destination is about itself too: not told.
    status, _ = await api(daemon.port, "POST", "/admin/destinations/ops/pause")
    assert status == 200
    status, _ = await api(daemon.port, "POST", "/admin/destinations/ops/resume")
    assert status == 200
    status, _ = await api(daemon.port, "POST", "/admin/destinations/hooks/pause")
    assert status == 200
    await ops.wait_for(1)  # hook.paused, refused for good by the operations receiver
    ops.behaviour = down  # and then its circuit opens on the resume's event
    status, _ = await api(daemon.port, "POST", "/admin/destinations/hooks/resume")
    assert status == 200
    await eventually(lambda: daemon.metrics.circuit_open.get(("ops", ops.url)) == 1, timeout=20)
    await asyncio.sleep(1.0)
    assert dict(daemon.metrics.operations_events) == {"hook.paused": 1, "hook.resumed": 1}
    events = [json.loads(r.body)["event"] for r in ops.received]
    assert set(events) == {"hook.paused", "hook.resumed"}
    assert daemon.metrics.failed["ops"] == 1


async def test_a_high_backlog_is_told_once_per_crossing(
    db_url: str, receiver_factory: ReceiverFactory, daemon_factory: DaemonFactory
) -> None:
    hook = await receiver_factory()
    ops = await receiver_factory()
    daemon = await daemon_factory(
        ops_settings(
            db_url,
            hook.url,
            ops.url,
            operations={"backlog_high": 5, "check_interval_seconds": 0.3},
        )
    )
    status, _ = await api(daemon.port, "POST", "/admin/destinations/hooks/pause")
    assert status == 200
    for i in range(8):
        await send(daemon.port, f"m-{i}")
    await eventually(lambda: named(ops, "backlog.high"))
    await asyncio.sleep(1.5)  # several more looks, the backlog still high
    [high] = named(ops, "backlog.high")
    assert high["properties"]["destination"] == "hooks"
    assert 5 <= high["properties"]["pending"] <= 8  # told as it crossed
    assert high["properties"]["backlogHigh"] == 5


async def test_a_lane_blocked_too_long_is_told_once(
    db_url: str, receiver_factory: ReceiverFactory, daemon_factory: DaemonFactory
) -> None:
    async def down(_request: web.Request, _n: int) -> web.StreamResponse:
        return web.Response(status=503)

    hook = await receiver_factory(down)
    ops = await receiver_factory()
    settings = ops_settings(
        db_url,
        hook.url,
        ops.url,
        operations={"lane_blocked_seconds": 0.5, "check_interval_seconds": 0.3},
    )
    settings["destinations"][0]["ordering"] = "per_user"
    daemon = await daemon_factory(settings)
    for i in range(3):
        await send(daemon.port, f"m-{i}")
    await eventually(lambda: named(ops, "lane.blocked"), timeout=15)
    await asyncio.sleep(1.5)
    [blocked] = named(ops, "lane.blocked")
    properties = blocked["properties"]
    assert properties["destination"] == "hooks"
    assert properties["lanes"] == 1
    assert properties["messageId"] == "m-0"
    assert properties["blockedSeconds"] >= 0.5
    assert daemon.metrics.operations_events["lane.blocked"] == 1


async def test_a_hook_disabled_after_failing_for_hours_is_told(
    db_url: str, receiver_factory: ReceiverFactory, daemon_factory: DaemonFactory
) -> None:
    async def down(_request: web.Request, _n: int) -> web.StreamResponse:
        return web.Response(status=503)

    hook = await receiver_factory(down)
    ops = await receiver_factory()
    daemon = await daemon_factory(
        ops_settings(db_url, hook.url, ops.url, disable_after_hours=0.0005)  # 1.8 s
    )
    for i in range(5):
        await send(daemon.port, f"m-{i}")
    await eventually(lambda: named(ops, "hook.disabled"), timeout=20)
    [disabled] = named(ops, "hook.disabled")
    assert disabled["properties"]["destination"] == "hooks"
    assert disabled["properties"]["hook"] == 1
    assert "HTTP 503" in disabled["properties"]["reason"]


@pytest.mark.slow
async def test_what_the_cap_dropped_is_summarised_when_its_minute_ends(
    db_url: str, receiver_factory: ReceiverFactory, daemon_factory: DaemonFactory
) -> None:
    async def refuse(_request: web.Request, _n: int) -> web.StreamResponse:
        return web.Response(status=400)

    hook = await receiver_factory(refuse)
    ops = await receiver_factory()
    cap, flood = 2, 12
    daemon = await daemon_factory(
        ops_settings(db_url, hook.url, ops.url, operations={"max_events_per_minute": cap})
    )
    for i in range(flood):
        await send(daemon.port, f"m-{i}")

    def told() -> int:
        summaries = named(ops, "operations.dropped")
        dropped = sum(s["properties"]["events"].get("delivery.exhausted", 0) for s in summaries)
        return len(named(ops, "delivery.exhausted")) + int(dropped)

    # The summary comes once the minute of the clock is over, with no other event after it.
    await eventually(lambda: told() == flood, timeout=75, interval=0.2)
    [summary, *_] = named(ops, "operations.dropped")
    assert summary["userId"] == "efd"
    assert summary["properties"]["maxEventsPerMinute"] == cap
    assert summary["properties"]["dropped"] >= 1
