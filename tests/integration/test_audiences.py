"""Audiences and computed traits synced by real daemons to real receivers, on SQLite and
PostgreSQL (the diff, pure, is tests/unit/test_personas.py's)."""

from __future__ import annotations

import time
from datetime import UTC, datetime
from typing import Any

from efd.segment import webhooks
from tests.conftest import (
    SECRET,
    DaemonFactory,
    Receiver,
    ReceiverFactory,
    StartedDaemon,
    eventually,
    post,
    settings_dict,
    sql,
)
from tests.unit.test_personas import DAY, HIGH_VALUE, REVENUE

# -- daemons -----------------------------------------------------------------------------------


def personas_settings(db_url: str, hooks_url: str, crm_url: str, **extra: Any) -> dict[str, Any]:
    """Source web -> destination hooks; audiences and traits go to destination crm only."""
    settings = settings_dict(db_url, [hooks_url])
    settings["destinations"].append(
        {"name": "crm", "type": "webhooks", "shared_secret": SECRET, "hooks": [{"url": crm_url}]}
    )
    settings["audiences"] = [
        {
            "name": "High Value Customers",
            "destinations": ["crm"],
            "sync_interval_seconds": 3600,
            "condition": HIGH_VALUE,
        }
    ]
    settings["computed_traits"] = [
        {
            "name": "total_revenue_180_days",
            "destinations": ["crm"],
            "sync_interval_seconds": 3600,
            "expression": REVENUE,
        }
    ]
    settings.update(extra)
    return settings


def iso(t: float) -> str:
    return datetime.fromtimestamp(t, UTC).isoformat()


def orders(user: str, *revenues: float, days_ago: float = 1) -> list[dict[str, Any]]:
    at = iso(time.time() - days_ago * DAY)
    return [
        {
            "type": "track",
            "userId": user,
            "event": "Order Completed",
            "properties": {"revenue": r},
            "timestamp": at,
        }
        for r in revenues
    ]


def identify(user: str, **traits: Any) -> dict[str, Any]:
    return {"type": "identify", "userId": user, "traits": traits}


async def send(daemon: StartedDaemon, *messages: dict[str, Any]) -> None:
    status, _ = await post(daemon.port, "/v1/batch", {"batch": list(messages)})
    assert status == 200


def personas_bodies(receiver: Receiver) -> list[dict[str, Any]]:
    """The identify messages a receiver got from syncs, after checking each signature."""
    found = []
    for request in receiver.received:
        assert webhooks.verify(SECRET, request.body, request.headers["X-Signature"])
        body = request.json()
        if body["type"] == "identify" and "personas" in body.get("context", {}):
            found.append(body)
    return found


def traits_of(bodies: list[dict[str, Any]], key: str) -> dict[str, Any]:
    return {b["userId"]: b["traits"][key] for b in bodies if key in b["traits"]}


def sent_count(db_url: str) -> int:
    return int(sql(db_url, "SELECT count(*) FROM messages WHERE source = 'personas'")[0][0])


async def test_audience_first_sync_sends_every_member_then_only_changes(
    db_url: str, receiver_factory: ReceiverFactory, daemon_factory: DaemonFactory
) -> None:
    hooks, crm = await receiver_factory(), await receiver_factory()
    # Without the computed trait: its scheduled first sync (a second after start-up, later on
    # a loaded machine) would add its own messages to the counts below.
    settings = personas_settings(db_url, hooks.url, crm.url, computed_traits=[])
    daemon = await daemon_factory(settings)
    audience = daemon.computation("High Value Customers")
    await send(
        daemon,
        identify("u1", plan="pro"),
        *orders("u1", 100, 150, 200),
        identify("u2", plan="pro"),
        *orders("u2", 120, 130),
        *orders("u2", 500, days_ago=45),  # outside within(30 days)
        identify("u3", plan="free"),
        *orders("u3", 300, 300, 300),
        identify("u4", plan="pro"),
        *orders("u4", 300, 50, 300),  # one order under 100
    )
    await daemon.sync(audience)
    await eventually(lambda: len(personas_bodies(crm)) >= 1)
    bodies = personas_bodies(crm)
    assert traits_of(bodies, "high_value_customers") == {"u1": True}
    assert bodies[0]["context"]["personas"] == {
        "computation_class": "audience",
        "computation_id": audience.id,
        "computation_key": "high_value_customers",
    }
    assert sql(db_url, "SELECT destination FROM deliveries d JOIN messages m "
               "ON m.id = d.message_pk WHERE m.source = 'personas'") == [("crm",)]  # fmt: skip

    # u2 qualifies now; u1 downgrades. Only those two change.
    await send(daemon, *orders("u2", 110), identify("u1", plan="free"))
    before = sent_count(db_url)
    await daemon.sync(audience)
    await eventually(lambda: len(personas_bodies(crm)) >= 3)
    later = personas_bodies(crm)[1:]
    assert traits_of(later, "high_value_customers") == {"u2": True, "u1": False}
    assert sent_count(db_url) == before + 2

    # Nothing changed: nothing is sent.
    result = await daemon.sync(audience)
    assert result.sent == 0
    assert sent_count(db_url) == before + 2
    # Identifies from syncs never reach the source's own destination.
    assert not personas_bodies(hooks)


async def test_computed_trait_sends_each_value_once_and_then_only_changes(
    db_url: str, receiver_factory: ReceiverFactory, daemon_factory: DaemonFactory
) -> None:
    hooks, crm = await receiver_factory(), await receiver_factory()
    daemon = await daemon_factory(personas_settings(db_url, hooks.url, crm.url))
    trait = daemon.computation("total_revenue_180_days")
    await send(daemon, *orders("u1", 10, 20.5), *orders("u2", 5), identify("u3", plan="pro"))
    await daemon.sync(trait)
    await eventually(lambda: len(personas_bodies(crm)) >= 2)
    first = personas_bodies(crm)
    assert traits_of(first, "total_revenue_180_days") == {"u1": 30.5, "u2": 5}
    assert {b["context"]["personas"]["computation_class"] for b in first} == {"trait"}

    await send(daemon, *orders("u2", 7))
    await daemon.sync(trait)
    await eventually(lambda: len(personas_bodies(crm)) >= 3)
    assert traits_of(personas_bodies(crm)[2:], "total_revenue_180_days") == {"u2": 12}
    assert (await daemon.sync(trait)).sent == 0
    assert sql(db_url, "SELECT profile_id, value FROM computed_values ORDER BY profile_id") == [
        ("u1", "30.5"),
        ("u2", "12"),
    ]


async def test_restart_between_two_syncs_neither_resends_nor_misses(
    db_url: str, receiver_factory: ReceiverFactory, daemon_factory: DaemonFactory
) -> None:
    hooks, crm = await receiver_factory(), await receiver_factory()
    # Without the computed trait: its scheduled first sync, a second after each start-up,
    # would add its own identifies to the bodies counted below.
    settings = personas_settings(db_url, hooks.url, crm.url, computed_traits=[])
    first = await daemon_factory(settings)
    audience = first.computation("High Value Customers")
    await send(
        first,
        identify("u1", plan="pro"),
        *orders("u1", 100, 100, 100),
        identify("u2", plan="pro"),
        *orders("u2", 100, 100, 100),
    )
    await first.sync(audience)
    await eventually(lambda: len(personas_bodies(crm)) >= 2)
    # A change after the last sync, then the process goes away.
    await send(first, identify("u2", plan="free"), identify("u3", plan="pro"))
    await send(first, *orders("u3", 200, 200, 200))
    await first.stop()

    second = await daemon_factory(settings)
    await second.sync(second.computation("High Value Customers"))
    await eventually(lambda: len(personas_bodies(crm)) >= 4)
    await second.sync(second.computation("High Value Customers"))
    bodies = personas_bodies(crm)
    assert traits_of(bodies[:2], "high_value_customers") == {"u1": True, "u2": True}
    assert traits_of(bodies[2:], "high_value_customers") == {"u2": False, "u3": True}
    assert len(bodies) == 4  # u1 was not sent again
    assert sql(
        db_url, "SELECT profile_id FROM computed_values WHERE computation LIKE 'audience:%' "
        "ORDER BY profile_id"
    ) == [("u1",), ("u3",)]  # fmt: skip


async def test_syncs_run_by_themselves_at_their_interval(
    db_url: str, receiver_factory: ReceiverFactory, daemon_factory: DaemonFactory
) -> None:
    hooks, crm = await receiver_factory(), await receiver_factory()
    settings = personas_settings(db_url, hooks.url, crm.url)
    settings["audiences"][0]["sync_interval_seconds"] = 0.5
    settings["audiences"][0]["condition"] = "trait('plan') = 'pro'"
    daemon = await daemon_factory(settings)
    await send(daemon, identify("u1", plan="pro"))
    await eventually(lambda: len(personas_bodies(crm)) >= 1, timeout=15)
    await send(daemon, identify("u1", plan="free"))
    await eventually(lambda: len(personas_bodies(crm)) >= 2, timeout=15)
    assert traits_of(personas_bodies(crm)[1:], "high_value_customers") == {"u1": False}
    rows = sql(db_url, "SELECT last_success_at FROM computations WHERE key LIKE 'audience:%'")
    assert rows[0][0] is not None


async def test_events_beyond_every_lookback_are_purged_by_retention(
    db_url: str, receiver_factory: ReceiverFactory, daemon_factory: DaemonFactory
) -> None:
    hooks, crm = await receiver_factory(), await receiver_factory()
    daemon = await daemon_factory(personas_settings(db_url, hooks.url, crm.url))
    # The longest lookback is 180 days (the computed trait).
    await send(daemon, *orders("u1", 1, days_ago=200), *orders("u1", 2, days_ago=170))
    await daemon.retention()
    assert sql(db_url, "SELECT properties FROM events") == [('{"revenue":2}',)]


async def test_a_lookback_without_within_keeps_events(
    db_url: str, receiver_factory: ReceiverFactory, daemon_factory: DaemonFactory
) -> None:
    hooks, crm = await receiver_factory(), await receiver_factory()
    settings = personas_settings(db_url, hooks.url, crm.url)
    settings["computed_traits"][0]["expression"] = "event('Order Completed').count()"
    daemon = await daemon_factory(settings)
    await send(daemon, *orders("u1", 1, days_ago=2000))
    await daemon.retention()
    assert sql(db_url, "SELECT count(*) FROM events") == [(1,)]
