"""A destination removed from the configuration with deliveries still pending: shown (marked
not configured) in /admin/destinations and efd_backlog_pending, warned of at start and at
reload, and discarded on request (POST /admin/discard, `efd discard`), kept for audit until
retention purges them. Real daemons and receivers, SQLite and PostgreSQL."""

from __future__ import annotations

import asyncio
import copy
import json
import logging
import signal
import urllib.request
from pathlib import Path
from typing import Any

import pytest
from aiohttp import web

from tests.conftest import (
    DaemonFactory,
    DaemonProcess,
    ReceiverFactory,
    eventually,
    free_port,
    metric,
    post,
    settings_dict,
    sql,
    write_toml,
)
from tests.integration.test_operators import run_cli
from tests.integration.test_regulations import api

TOKEN = "adm-secret-0123456789"  # test_regulations.api's default
WARNING = "destination 'old' is not configured but has {} pending deliveries"


async def unavailable(_request: web.Request, _n: int) -> web.StreamResponse:
    return web.json_response({"down": True}, status=503)  # retried: stays pending


def two_destinations(db_url: str, hooks_url: str, old_url: str) -> dict[str, Any]:
    """Source `web` -> `hooks` (delivers) and `old` (its receiver is down)."""
    settings = settings_dict(db_url, [hooks_url])
    settings["server"]["admin_token"] = TOKEN
    settings["destinations"].append(
        {"name": "old", "type": "webhooks", "hooks": [{"url": old_url}]}
    )
    settings["sources"][0]["destinations"] = ["hooks", "old"]
    return settings


def without_old(settings: dict[str, Any]) -> dict[str, Any]:
    changed = copy.deepcopy(settings)
    changed["destinations"] = [d for d in changed["destinations"] if d["name"] != "old"]
    changed["sources"][0]["destinations"] = ["hooks"]
    return changed


def statuses(db_url: str) -> list[tuple[str, str, str]]:
    return [
        tuple(row)
        for row in sql(
            db_url,
            "SELECT m.message_id, d.destination, d.status FROM deliveries d"
            " JOIN messages m ON m.id = d.message_pk ORDER BY m.message_id, d.destination",
        )
    ]


def metrics_text(port: int) -> str:
    request = urllib.request.Request(
        f"http://127.0.0.1:{port}/metrics", headers={"Authorization": f"Bearer {TOKEN}"}
    )
    with urllib.request.urlopen(request, timeout=10) as answer:
        return str(answer.read().decode())


async def send(port: int, *message_ids: str) -> None:
    for message_id in message_ids:
        status, answer = await post(
            port, "/v1/track", {"userId": "u", "event": "E", "messageId": message_id}
        )
        assert status == 200, answer


@pytest.mark.slow
async def test_removed_destination_is_shown_warned_of_and_discarded(
    db_url: str, receiver_factory: ReceiverFactory, tmp_path: Path
) -> None:
    hooks, old = await receiver_factory(), await receiver_factory(unavailable)
    settings = two_destinations(db_url, hooks.url, old.url)
    port = free_port()
    settings["server"]["port"] = port
    config = write_toml(tmp_path / "efd.toml", settings)
    daemon = DaemonProcess(config, port, tmp_path / "efd.log").start()
    try:
        await send(port, "m-1", "m-2", "m-3")
        await hooks.wait_for(3, timeout=30)
        await old.wait_for(3, timeout=30)  # tried, refused, retried later: pending
        await eventually(
            lambda: [s for _, d, s in statuses(db_url) if d == "hooks"] == ["delivered"] * 3,
            timeout=30,
        )
        assert WARNING.format(3) not in daemon.log()

        # Removed by a reload: warned of, with the count.
        write_toml(config, without_old(settings))
        assert daemon.proc is not None
        daemon.proc.send_signal(signal.SIGHUP)
        await eventually(lambda: WARNING.format(3) in daemon.log(), timeout=30)
        assert "efd discard --destination" in daemon.log()
        assert [(m, s) for m, d, s in statuses(db_url) if d == "old"] == [
            ("m-1", "pending"),
            ("m-2", "pending"),
            ("m-3", "pending"),
        ]

        # Shown, marked as not configured.
        status, answer = await api(port, "GET", "/admin/destinations")
        assert status == 200, answer
        by_name = {d["name"]: d for d in answer["destinations"]}
        assert list(by_name) == ["hooks", "old"]
        assert by_name["hooks"]["configured"] is True
        assert by_name["old"]["configured"] is False
        assert by_name["old"]["backlog"] == 3
        assert by_name["old"]["oldestPendingAt"].endswith("Z")
        assert by_name["old"]["hooks"] == []
        text = await asyncio.to_thread(metrics_text, port)
        assert metric(text, "efd_backlog_pending", destination="old", configured="false") == 3
        assert metric(text, "efd_backlog_pending", destination="hooks", configured="true") == 0

        # And at the next start.
        assert daemon.terminate() == 0
        daemon.start()
        await eventually(lambda: daemon.log().count(WARNING.format(3)) == 2, timeout=30)

        # Only a destination that is not configured may be discarded; a dry run counts.
        for body, expected in (
            ({"destination": "hooks"}, (409, "destination_configured")),
            ({}, (400, "missing_field")),
            ({"destination": "old", "status": "pending"}, (400, "invalid_field")),
            ({"destination": "old", "dry_run": "yes"}, (400, "invalid_field")),
        ):
            status, answer = await api(port, "POST", "/admin/discard", body)
            assert (status, answer["code"]) == expected, (body, answer)
        status, answer = await api(port, "POST", "/admin/discard", {"destination": "hooks"})
        assert "is configured" in answer["message"]
        status, answer = await api(
            port, "POST", "/admin/discard", {"destination": "old", "dry_run": True}
        )
        assert (status, answer) == (200, {"count": 3})
        status, answer = await api(
            port, "POST", "/admin/discard", {"destination": "old", "until": "2020-01-01"}
        )
        assert (status, answer) == (200, {"count": 0})
        assert {s for _, d, s in statuses(db_url) if d == "old"} == {"pending"}
        status, answer = await api(port, "POST", "/admin/discard", {"destination": "old"})
        assert (status, answer) == (200, {"count": 3})

        # Kept for audit: discarded and finished, shown by inspect; gone from the backlog.
        assert [(m, s) for m, d, s in statuses(db_url) if d == "old"] == [
            ("m-1", "discarded"),
            ("m-2", "discarded"),
            ("m-3", "discarded"),
        ]
        rows = sql(
            db_url,
            "SELECT finished_at, next_attempt_at, last_error FROM deliveries"
            " WHERE status = 'discarded'",
        )
        assert all(at is not None and due is None and "discarded" in why for at, due, why in rows)
        status, answer = await api(port, "GET", "/admin/messages/web/m-2")
        assert {d["destination"]: d["status"] for d in answer["deliveries"]} == {
            "hooks": "delivered",
            "old": "discarded",
        }
        status, answer = await api(port, "GET", "/admin/deliveries?status=discarded")
        assert sorted(d["messageId"] for d in answer["deliveries"]) == ["m-1", "m-2", "m-3"]
        status, answer = await api(port, "GET", "/admin/destinations")
        assert [d["name"] for d in answer["destinations"]] == ["hooks"]
        text = await asyncio.to_thread(metrics_text, port)
        assert metric(text, "efd_backlog_pending", destination="old", configured="false") is None
        status, answer = await api(port, "POST", "/admin/discard", {"destination": "old"})
        assert (status, answer) == (200, {"count": 0})

        # No warning at the next reload: nothing is left pending there.
        daemon.proc.send_signal(signal.SIGHUP)
        await eventually(lambda: daemon.log().count("reloaded") == 2, timeout=30)
        assert daemon.log().count("is not configured but has") == 2
    finally:
        daemon.ensure_stopped()


async def test_the_cli_discards_and_retention_purges_what_was_discarded(
    db_url: str,
    receiver_factory: ReceiverFactory,
    daemon_factory: DaemonFactory,
    tmp_path: Path,
    caplog: pytest.LogCaptureFixture,
) -> None:
    hooks, old = await receiver_factory(), await receiver_factory(unavailable)
    settings = two_destinations(db_url, hooks.url, old.url)
    first = await daemon_factory(settings)
    await send(first.port, "m-1", "m-2")
    await old.wait_for(2, timeout=30)
    await eventually(
        lambda: [s for _, d, s in statuses(db_url) if d == "hooks"] == ["delivered"] * 2
    )
    await first.stop()

    caplog.set_level(logging.WARNING)
    changed = without_old(settings)
    changed["storage"]["retention_days"] = 1
    daemon = await daemon_factory(changed)
    assert sum(WARNING.format(2) in r.getMessage() for r in caplog.records) == 1
    config = str(write_toml(tmp_path / "efd.toml", changed))

    async def efd(*args: str) -> tuple[int, str, str]:
        return await asyncio.to_thread(run_cli, *args, "--config", config)

    code, _, err = await efd("discard", "--destination", "hooks")
    assert code == 2
    assert "'hooks' is configured" in err
    code, _, err = await efd("discard")
    assert code == 2
    assert "destination is required" in err
    code, out, _ = await efd("discard", "--destination", "old", "--dry-run", "--json")
    assert (code, json.loads(out)) == (0, {"count": 2})
    code, out, _ = await efd("discard", "--destination", "old", "--dry-run")
    assert (code, out.strip()) == (
        0,
        "pending deliveries to old that would be discarded: 2 (dry run)",
    )
    assert {s for _, d, s in statuses(db_url) if d == "old"} == {"pending"}
    code, out, _ = await efd("discard", "--destination", "old")
    assert code == 0
    assert "discarded: 2" in out
    assert {s for _, d, s in statuses(db_url) if d == "old"} == {"discarded"}
    code, out, _ = await efd("inspect", "--source", "web", "--message-id", "m-1")
    assert code == 0
    assert "to old: discarded" in out

    # Retention purges them like any finished delivery, once old enough.
    await daemon.retention()
    assert len(statuses(db_url)) == 4
    sql(
        db_url,
        "UPDATE messages SET received_at = received_at - 3 * 86400",
    )
    sql(db_url, "UPDATE deliveries SET finished_at = finished_at - 3 * 86400")
    sql(db_url, "DELETE FROM jobs")  # the retention job's turn again, now
    await daemon.retention()
    assert statuses(db_url) == []
