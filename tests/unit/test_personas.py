"""Audiences and computed traits, the pure part: keys, the diff of a sync chunk against what
was sent, and the identify message a change becomes. tests/integration/test_audiences.py
runs the syncs in real daemons against real receivers."""

from __future__ import annotations

import json
from typing import Any

import pytest

from efd.languages.audiences import Event
from efd.personas.keys import snake_case
from efd.personas.sync import AUDIENCE, TRAIT, Computation, diff, identify_message
from efd.store.computations import SyncChunk

HIGH_VALUE = (
    "event('Order Completed').where(property('revenue') >= 100).within(30 days).count() >= 3"
    " and trait('plan') = 'pro'"
)
REVENUE = "event('Order Completed').within(180 days).sum('revenue')"
DAY = 86400.0


@pytest.mark.parametrize(
    ("name", "key"),
    [
        ("High Value Customers", "high_value_customers"),
        ("total_revenue_180_days", "total_revenue_180_days"),
        ("highValueCustomers", "high_value_customers"),
        ("VIP-Users (EU)", "vip_users_eu"),
        ("HTMLReaders", "html_readers"),
        ("top10", "top_10"),
        ("  Über Fans ", "über_fans"),
    ],
)
def test_audience_key_is_the_snake_case_name(name: str, key: str) -> None:
    assert snake_case(name) == key


def chunk(
    profiles: dict[str, dict[str, Any]],
    events: dict[str, list[Event]] | None = None,
    stored: dict[str, str] | None = None,
    suppressed: frozenset[str] = frozenset(),
) -> SyncChunk:
    return SyncChunk(
        profiles=[(pid, json.dumps(traits)) for pid, traits in profiles.items()],
        events=events or {},
        stored=stored or {},
        suppressed=suppressed,
        rows_read=0,
        next_after=None,
    )


def test_first_diff_of_an_audience_is_every_member_with_true() -> None:
    audience = Computation(AUDIENCE, "Pros", "trait('plan') = 'pro'")
    changes = diff(audience, chunk({"a": {"plan": "pro"}, "b": {}, "c": {"plan": "pro"}}), 0)
    assert [(c.profile_id, c.value, c.stored, c.send) for c in changes] == [
        ("a", True, "true", True),
        ("c", True, "true", True),
    ]


def test_later_diffs_send_only_entries_and_exits() -> None:
    audience = Computation(AUDIENCE, "Pros", "trait('plan') = 'pro'")
    state = chunk(
        {
            "stays": {"plan": "pro"},
            "leaves": {"plan": "free"},
            "enters": {"plan": "pro"},
            "out": {},
        },
        stored={"stays": "true", "leaves": "true", "gone": "true"},
    )
    changes = {c.profile_id: c for c in diff(audience, state, 0)}
    assert {pid: (c.value, c.send) for pid, c in changes.items()} == {
        "leaves": (False, True),
        "enters": (True, True),
        "gone": (None, False),  # the profile no longer exists (deleted): forgotten silently
    }
    assert changes["leaves"].stored is None


def test_suppressed_profiles_are_left_alone() -> None:
    audience = Computation(AUDIENCE, "Pros", "trait('plan') = 'pro'")
    state = chunk({"a": {"plan": "pro"}, "b": {}}, stored={"b": "true"}, suppressed=frozenset("ab"))
    assert diff(audience, state, 0) == []


def test_a_computed_trait_sends_only_changed_values() -> None:
    trait = Computation(TRAIT, "Revenue", REVENUE)
    now = 1000 * DAY
    orders = {
        "same": [Event("Order Completed", now - DAY, {"revenue": 10})],
        "more": [Event("Order Completed", now - DAY, {"revenue": 10.0})] * 2,
        "new": [Event("Order Completed", now - DAY, {"revenue": 5})],
        "float": [Event("Order Completed", now - DAY, {"revenue": 2.0})],
    }
    state = chunk(
        {"same": {}, "more": {}, "new": {}, "float": {}, "idle": {}, "lapsed": {}},
        events=orders,
        stored={"same": "10", "more": "10", "float": "2", "lapsed": "7"},
    )
    changes = {c.profile_id: (c.value, c.stored) for c in diff(trait, state, now)}
    # 2.0 is 2 in JSON: no change. "idle" never had an order: nothing to send.
    # "lapsed" had orders that fell out of the window: its value is now 0.
    assert changes == {"more": (20.0, "20"), "new": (5, "5"), "lapsed": (0, "0")}


def test_identify_message_carries_the_trait_and_context_personas_to_its_destinations() -> None:
    audience = Computation(AUDIENCE, "High Value Customers", HIGH_VALUE, ("crm", "other"))
    row = identify_message(audience, "u1", True, 1_700_000_000.5)
    body = json.loads(row.body)
    assert body == {
        "version": 1,
        "type": "identify",
        "userId": "u1",
        "traits": {"high_value_customers": True},
        "context": {
            "personas": {
                "computation_class": "audience",
                "computation_id": audience.id,
                "computation_key": "high_value_customers",
            }
        },
        "messageId": row.message_id,
        "timestamp": "2023-11-14T22:13:20.500Z",
    }
    assert audience.id.startswith("aud_")
    assert row.destinations == ("crm", "other")
    assert row.source == "personas"


@pytest.mark.parametrize(
    ("aggregate", "value"),
    [
        ("count()", 4),
        ("sum('revenue')", 100),
        ("avg('revenue')", 25.0),
        ("min('revenue')", 10),
        ("max('revenue')", 40),
        ("first('coupon')", "A"),
        ("last('coupon')", "B"),
        ("mode('coupon')", "A"),
        ("unique('coupon')", ["A", "B"]),
        ("unique('coupon').count()", 2),
    ],
)
def test_every_aggregate_works_as_a_computed_trait(aggregate: str, value: object) -> None:
    trait = Computation(TRAIT, "Orders", f"event('Order Completed').{aggregate}")
    events = [
        Event("Order Completed", 1.0, {"revenue": 10, "coupon": "A"}),
        Event("Order Completed", 2.0, {"revenue": 20, "coupon": "A"}),
        Event("Order Completed", 3.0, {"revenue": 30}),
        Event("Order Completed", 4.0, {"revenue": 40, "coupon": "B"}),
        Event("Other", 5.0, {"revenue": 1000, "coupon": "C"}),
    ]
    [change] = diff(trait, chunk({"u": {}}, events={"u": events}), 10.0)
    assert change.value == value
    assert json.loads(identify_message(trait, "u", change.value, 10.0).body)["traits"] == {
        "orders": value
    }
