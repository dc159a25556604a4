"""The operator's rules (efd/operations/selection.py): times, filters, replays, JSON shapes."""

from __future__ import annotations

import dataclasses
from datetime import UTC, datetime
from typing import Any

import pytest

from efd.errors import ClientError
from efd.operations import selection
from efd.records import DeliveryRecord, DeliveryStatus

NOW = datetime(2026, 11, 24, 12, 0, tzinfo=UTC).timestamp()


@pytest.mark.parametrize(
    ("given", "expected"),
    [
        ("2h", NOW - 7200),
        ("30m", NOW - 1800),
        ("1d", NOW - 86400),
        ("45s", NOW - 45),
        (" 0h ", NOW),
        ("2026-11-24T10:00:00Z", NOW - 7200),
        ("2026-11-24T10:00:00", NOW - 7200),  # no offset: UTC
        ("2026-11-24T12:00:00+01:00", NOW - 3600),
        ("2026-11-24", NOW - 12 * 3600),
    ],
)
def test_times_are_iso_8601_or_that_long_ago(given: str, expected: float) -> None:
    assert selection.parse_time(given, "since", NOW) == expected


@pytest.mark.parametrize("given", ["", "soon", "2 h", "2w", "-2h", "h", "1.5h", 7, None])
def test_other_times_are_refused_naming_the_field(given: object) -> None:
    with pytest.raises(ClientError) as caught:
        selection.parse_time(given, "until", NOW)
    assert caught.value.field == "until"


def test_the_list_takes_its_filters_limit_and_cursor() -> None:
    query, limit, cursor = selection.list_query(
        {"destination": "crm", "status": "failed", "since": "1h", "limit": "10", "cursor": "99"},
        NOW,
    )
    assert query.destinations == ("crm",)
    assert query.statuses == (DeliveryStatus.FAILED,)
    assert query.since == NOW - 3600
    assert (limit, cursor) == (10, 99)
    assert selection.list_query({}, NOW)[1:] == (selection.DEFAULT_LIMIT, None)
    # A window that ends before it starts is empty, not an error: the schema cannot say so.
    query, _, _ = selection.list_query({"since": "1h", "until": "2h"}, NOW)
    assert (query.since, query.until) == (NOW - 3600, NOW - 7200)


@pytest.mark.parametrize(
    ("params", "field"),
    [
        ({"limit": "0"}, "limit"),
        ({"limit": "501"}, "limit"),
        ({"limit": "ten"}, "limit"),
        ({"cursor": "-1"}, "cursor"),
        ({"status": "gone"}, "status"),
        ({"since": "", "until": "2h"}, "since"),
        ({"user_id": ""}, "user_id"),
        ({"user_id": "x" * 1001}, "user_id"),
        ({"message_id": "a\x00b"}, "message_id"),
        ({"sort": "asc"}, "sort"),
    ],
)
def test_bad_list_filters_name_their_field(params: dict[str, str], field: str) -> None:
    with pytest.raises(ClientError) as caught:
        selection.list_query(params, NOW)
    assert caught.value.field == field


def test_a_redrive_covers_failed_and_expired_of_configured_destinations() -> None:
    query, dry_run = selection.redrive_query({}, NOW, {"b", "a"})
    assert query.destinations == ("a", "b")
    assert query.statuses == (DeliveryStatus.FAILED, DeliveryStatus.EXPIRED)
    assert dry_run is False
    query, dry_run = selection.redrive_query(
        {"destination": "a", "status": "expired", "until": "1h", "dry_run": True}, NOW, {"a"}
    )
    assert (query.destinations, query.statuses, query.until) == (
        ("a",),
        (DeliveryStatus.EXPIRED,),
        NOW - 3600,
    )
    assert dry_run is True


@pytest.mark.parametrize(
    ("payload", "code"),
    [
        ([], "invalid_body"),
        ({"status": "pending"}, "invalid_field"),
        ({"destination": "gone"}, "unknown_destination"),
        ({"dry_run": 1}, "invalid_field"),
        ({"limit": 5}, "invalid_field"),
    ],
)
def test_bad_redrives_are_refused(payload: object, code: str) -> None:
    with pytest.raises(ClientError) as caught:
        selection.redrive_query(payload, NOW, {"a"})
    assert caught.value.code == code


def test_a_discard_covers_the_pending_deliveries_of_one_unconfigured_destination() -> None:
    query, dry_run = selection.discard_query({"destination": "old"}, NOW, {"a", "b"})
    assert (query.destinations, query.statuses) == (("old",), (DeliveryStatus.PENDING,))
    assert (query.since, query.until, dry_run) == (None, None, False)
    query, dry_run = selection.discard_query(
        {"destination": "old", "since": "2h", "until": "1h", "dry_run": True}, NOW, {"a"}
    )
    assert (query.since, query.until, dry_run) == (NOW - 7200, NOW - 3600, True)


@pytest.mark.parametrize(
    ("payload", "field", "code"),
    [
        ([], "body", "invalid_body"),
        ({}, "destination", "missing_field"),
        ({"destination": None}, "destination", "missing_field"),
        ({"destination": ""}, "destination", "invalid_field"),
        ({"destination": "a"}, "destination", "destination_configured"),
        ({"destination": "old", "status": "pending"}, "status", "invalid_field"),
        ({"destination": "old", "dry_run": "yes"}, "dry_run", "invalid_field"),
        ({"destination": "old", "since": ""}, "since", "invalid_field"),
        ({"destination": "old", "until": "2 h"}, "until", "invalid_field"),
    ],
)
def test_bad_discards_are_refused_naming_the_field(payload: object, field: str, code: str) -> None:
    with pytest.raises(ClientError) as caught:
        selection.discard_query(payload, NOW, {"a"})
    assert (caught.value.field, caught.value.code) == (field, code)


def test_unconfigured_destinations_are_those_with_pending_deliveries_left() -> None:
    backlog = {"crm": 4, "old": 3, "gone": 0, "older": 1}
    assert selection.unconfigured(backlog, {"crm", "mail"}) == {"old": 3, "older": 1}
    assert selection.unconfigured(backlog, {"crm", "old", "older"}) == {}


def test_a_replay_goes_where_the_message_went_and_is_configured() -> None:
    originals = {"crm": 1, "old": 2, "mail": 3}
    configured = {"crm", "mail", "new"}
    assert selection.replay_targets(originals, None, configured) == [(1, "crm"), (3, "mail")]
    assert selection.replay_targets(originals, "mail", configured) == [(3, "mail")]
    for destination, code in (("new", "not_routed"), ("old", "unknown_destination")):
        with pytest.raises(ClientError) as caught:
            selection.replay_targets(originals, destination, configured)
        assert caught.value.code == code
    with pytest.raises(ClientError):
        selection.replay_targets({"old": 2}, None, configured)


def delivery(n: int, **changes: Any) -> DeliveryRecord:
    record = DeliveryRecord(
        id=n,
        destination="crm",
        status="pending",
        attempts=0,
        created_at=NOW,
        first_attempt_at=None,
        next_attempt_at=NOW,
        finished_at=None,
        last_error=None,
        replay_of=None,
        source="web",
        message_id=f"m-{n}",
        type="track",
        user_id="u",
        event="E",
        received_at=NOW,
    )
    return dataclasses.replace(record, **changes)


def test_a_page_tells_whether_another_follows_and_the_window_its_end() -> None:
    found = [delivery(9), delivery(8, status="failed", first_attempt_at=NOW - 60), delivery(7)]
    page = selection.page_json(found, 2, window=3600)
    assert [d["id"] for d in page["deliveries"]] == [9, 8]
    assert page["nextCursor"] == "8"
    first, failed = page["deliveries"]
    assert first["windowEndsAt"] == "2026-11-24T13:00:00.000Z"  # from its creation
    assert failed["windowEndsAt"] == "2026-11-24T12:59:00.000Z"  # from its first attempt
    assert failed["nextAttemptAt"] is None
    assert selection.page_json(found, 3, window=3600)["nextCursor"] is None
