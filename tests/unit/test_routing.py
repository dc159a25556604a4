"""efd.segment.routing: spec 4.3, which destinations a message reaches (pure, fast)."""

from __future__ import annotations

from typing import Any

import pytest

from efd.segment.routing import WEBHOOKS_KEY, is_enabled, route

OPTIONS = {"apiKey": "x", "sendAll": True}  # an options object, as Segment clients send


def test_webhooks_key_is_the_published_name() -> None:
    assert WEBHOOKS_KEY == "Webhooks"


@pytest.mark.parametrize(
    ("integrations", "expected"),
    [
        # By default every destination is enabled.
        ({}, True),
        ({"Other": False}, True),
        ({"Google Analytics": False, "Mixpanel": True}, True),
        # All: false disables every destination...
        ({"All": False}, False),
        ({"All": False, "Other": True}, False),
        # ...unless it is set to true by name: its own name, or the published "Webhooks".
        ({"All": False, "crm": True}, True),
        ({"All": False, "Webhooks": True}, True),
        ({"All": False, "crm": OPTIONS}, True),  # an options object counts as enabled
        ({"All": False, "Webhooks": OPTIONS}, True),
        ({"All": False, "crm": {}}, True),
        ({"All": True}, True),
        ({"All": OPTIONS}, True),
        # Turning a destination off by name.
        ({"crm": False}, False),
        ({"Webhooks": False}, False),
        ({"crm": True}, True),
        ({"Webhooks": True}, True),
        # Precedence: the destination's own name, then "Webhooks", then "All".
        ({"Webhooks": False, "crm": True}, True),
        ({"Webhooks": True, "crm": False}, False),
        ({"All": True, "Webhooks": False}, False),
        ({"All": True, "crm": False}, False),
        ({"All": False, "Webhooks": False, "crm": True}, True),
        ({"All": True, "Webhooks": True, "crm": False}, False),
        ({"All": False, "Webhooks": True, "crm": False}, False),
        ({"crm": True, "Webhooks": False, "All": False}, True),  # key order does not matter
        # Case-sensitive keys: these are other destinations, not this one.
        ({"webhooks": False}, True),
        ({"WEBHOOKS": False}, True),
        ({"all": False}, True),
        ({"ALL": False}, True),
        ({"CRM": False}, True),
        ({"All": False, "webhooks": True}, False),
        ({"All": False, "CRM": True}, False),
        ({"All": False, "Crm": True}, False),
        # Only an explicit false disables.
        ({"crm": None}, True),
        ({"All": None}, True),
        ({"crm": "false"}, True),
    ],
)
def test_is_enabled(integrations: dict[str, Any], expected: bool) -> None:
    assert is_enabled("crm", integrations) is expected


@pytest.mark.parametrize(
    ("integrations", "expected"),
    [
        ({"Webhooks": False}, False),
        ({"All": False, "Webhooks": True}, True),
        ({"All": False}, False),
        ({}, True),
    ],
)
def test_destination_named_webhooks(integrations: dict[str, Any], expected: bool) -> None:
    assert is_enabled("Webhooks", integrations) is expected


@pytest.mark.parametrize(
    ("integrations", "expected"),
    [
        ({}, ["crm", "audit", "Slack Hooks"]),
        ({"All": False}, []),
        ({"All": False, "audit": True}, ["audit"]),
        ({"All": False, "Webhooks": True}, ["crm", "audit", "Slack Hooks"]),
        ({"All": False, "Webhooks": True, "crm": False}, ["audit", "Slack Hooks"]),
        ({"Webhooks": False, "Slack Hooks": True}, ["Slack Hooks"]),
        ({"crm": False}, ["audit", "Slack Hooks"]),
        ({"slack hooks": False}, ["crm", "audit", "Slack Hooks"]),
        ({"Slack Hooks": False, "All": True}, ["crm", "audit"]),
        ({"All": False, "audit": {"opt": 1}, "crm": True}, ["crm", "audit"]),  # source order kept
    ],
)
def test_route(integrations: dict[str, Any], expected: list[str]) -> None:
    assert route(["crm", "audit", "Slack Hooks"], integrations) == expected


@pytest.mark.parametrize("integrations", [{}, {"All": False}, {"Webhooks": True}])
def test_route_with_no_destinations(integrations: dict[str, Any]) -> None:
    assert route([], integrations) == []


def test_route_returns_a_new_list() -> None:
    destinations = ["crm"]
    routed = route(destinations, {})
    routed.append("x")
    assert destinations == ["crm"]
