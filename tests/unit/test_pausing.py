"""Pauses as the dispatcher applies them, and the operator's pause requests (pure)."""

from __future__ import annotations

import pytest

from efd.delivery.pausing import (
    Pause,
    Targets,
    apply,
    disabled_reason,
    target_name,
    window_start,
)
from efd.errors import ClientError
from efd.operations.pauses import pause_json, target
from efd.segment.webhooks import Route


def _route(name: str, *urls: str) -> Route:
    return Route(name=name, hooks=tuple((u, {}) for u in urls), secret=None, user_agent="efd/1.0")


TARGETS = Targets.of(
    [
        ("crm", [_route("crm", "http://a/1", "http://a/2")]),
        ("acts", [_route("acts/one", "http://b/1"), _route("acts/two", "http://b/2")]),
    ]
)


def test_hooks_are_numbered_from_one_in_the_configurations_order() -> None:
    assert TARGETS.number("crm", "http://a/2") == ("crm", 2)
    assert TARGETS.number("acts/two", "http://b/2") == ("acts", 2)
    assert TARGETS.number("acts/two", "http://b/1") is None
    assert TARGETS.number("gone", "http://a/1") is None
    assert TARGETS.routes_of("acts") == ("acts/one", "acts/two")


def test_a_whole_destination_holds_every_route() -> None:
    held = apply(TARGETS, [Pause("acts", None, "paused", None, 10.0)])
    assert held.held == {"acts/one", "acts/two"}
    assert held.paused == {"acts/one": {"http://b/1"}, "acts/two": {"http://b/2"}}
    assert held.since == {"acts/one": 10.0, "acts/two": 10.0}


def test_one_hook_holds_only_it_and_every_hook_holds_the_route() -> None:
    one = apply(TARGETS, [Pause("crm", 2, "disabled", "x", 5.0)])
    assert one.held == frozenset()
    assert one.paused == {"crm": {"http://a/2"}}
    both = apply(
        TARGETS, [Pause("crm", 2, "disabled", "x", 5.0), Pause("crm", 1, "paused", None, 3.0)]
    )
    assert both.held == {"crm"}
    assert both.since == {"crm": 3.0}


def test_a_pause_of_nothing_configured_and_a_run_of_failures_hold_nothing() -> None:
    held = apply(
        TARGETS,
        [
            Pause("gone", None, "paused", None, 1.0),
            Pause("crm", 3, "paused", None, 1.0),
            Pause("crm", 1, "failing", None, 1.0),
        ],
    )
    assert (held.paused, held.held, held.since) == ({}, frozenset(), {})


def test_the_paused_time_does_not_count_against_the_window() -> None:
    assert window_start(100.0, since=150.0, now=200.0) == 150.0  # 50 s of it paused
    assert window_start(170.0, since=150.0, now=200.0) == 200.0  # first sent while paused
    assert window_start(100.0, since=250.0, now=200.0) == 100.0  # not yet paused


def test_a_disabled_hooks_reason_and_a_targets_name() -> None:
    reason = disabled_reason(0.0, "https://x/hook: HTTP 503")
    assert reason == "failing since 1970-01-01T00:00:00Z (last: https://x/hook: HTTP 503)"
    assert target_name("crm", None) == "crm"
    assert target_name("crm", 2) == "hook 2 of crm"


def test_a_pause_request_names_a_configured_destination_and_one_of_its_hooks() -> None:
    hooks = {"crm": 2}
    assert target("crm", None, hooks) == ("crm", None, None)
    assert target("crm", {"hook": 2, "reason": "upgrade"}, hooks) == ("crm", 2, "upgrade")
    assert target("crm", {"reason": ""}, hooks) == ("crm", None, None)
    cases = [
        ("nope", {}, 404, "unknown_destination", "destination"),
        ("crm", {"hook": 3}, 404, "unknown_hook", "hook"),
        ("crm", {"hook": 0}, 400, "invalid_field", "hook"),
        ("crm", {"hook": True}, 400, "invalid_field", "hook"),
        ("crm", {"hook": "1"}, 400, "invalid_field", "hook"),
        ("crm", {"reason": 1}, 400, "invalid_field", "reason"),
        ("crm", {"reason": "x" * 501}, 400, "invalid_field", "reason"),
        ("crm", {"other": 1}, 400, "invalid_field", "other"),
        ("crm", [1], 400, "invalid_body", "body"),
    ]
    for name, body, status, code, field in cases:
        with pytest.raises(ClientError) as caught:
            target(name, body, hooks)
        assert (caught.value.status, caught.value.code, caught.value.field) == (
            status,
            code,
            field,
        ), body
    with pytest.raises(ClientError):
        target("crm", {"reason": "x"}, hooks, resume=True)  # a resume takes no reason


def test_a_pause_as_json() -> None:
    shown = pause_json(Pause("crm", 2, "paused", "why", 0.0))
    assert shown == {
        "destination": "crm",
        "hook": 2,
        "kind": "paused",
        "reason": "why",
        "since": "1970-01-01T00:00:00.000Z",
    }
