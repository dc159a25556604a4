"""efd.segment.messages: validation and normalisation of incoming Segment messages (pure, fast)."""

from __future__ import annotations

import uuid
from datetime import UTC, datetime, timedelta, timezone
from typing import Any

import pytest

from efd import jsonjs
from efd.errors import ClientError
from efd.segment.messages import (
    MAX_BATCH_MESSAGES,
    MAX_MESSAGE_BYTES,
    MAX_MESSAGE_ID_CHARS,
    MAX_REQUEST_BYTES,
    TYPES,
    Message,
    format_timestamp,
    message_size,
    normalise,
    normalise_request,
    parse_timestamp,
)

NOW = datetime(2026, 3, 1, 12, 0, 0, tzinfo=UTC)

MINIMAL: dict[str, dict[str, Any]] = {
    "identify": {"type": "identify", "userId": "u1"},
    "track": {"type": "track", "userId": "u1", "event": "Signed Up"},
    "page": {"type": "page", "userId": "u1"},
    "screen": {"type": "screen", "userId": "u1"},
    "group": {"type": "group", "userId": "u1", "groupId": "g1"},
    "alias": {"type": "alias", "userId": "u1", "previousId": "anon-1"},
}
NEEDS_IDENTITY = ["identify", "page", "screen", "track", "group"]


def norm(raw: Any, **kwargs: Any) -> Message:
    return normalise(raw, received_at=NOW, **kwargs)


def rejected(raw: Any, **kwargs: Any) -> ClientError:
    with pytest.raises(ClientError) as caught:
        normalise(raw, received_at=NOW, **kwargs)
    return caught.value


def rejected_request(
    payload: Any, *, type_: str | None = None, body_bytes: int = 100
) -> ClientError:
    with pytest.raises(ClientError) as caught:
        normalise_request(payload, received_at=NOW, type_=type_, body_bytes=body_bytes)
    return caught.value


# Per type, the field a message without it is refused for (a batch's first message).
MISSING_FIELDS: list[tuple[dict[str, Any], str]] = [
    ({"type": "identify"}, "userId"),
    ({"type": "track", "userId": "u"}, "event"),
    ({"type": "page"}, "userId"),
    ({"type": "screen"}, "userId"),
    ({"type": "group", "userId": "u"}, "groupId"),
    ({"type": "alias", "userId": "u"}, "previousId"),
    ({"type": "alias", "previousId": "p"}, "userId"),
    ({"userId": "u"}, "type"),
]


@pytest.mark.parametrize(("message", "field"), MISSING_FIELDS)
def test_a_missing_required_field_is_named_with_its_index(
    message: dict[str, Any], field: str
) -> None:
    rejection = rejected_request({"batch": [message]})
    assert (rejection.status, rejection.code, rejection.field, rejection.index) == (
        400,
        "missing_field",
        field,
        0,
    )


def batch_of(*messages: dict[str, Any], **extra: Any) -> dict[str, Any]:
    return {"batch": list(messages), **extra}


# -- limits as the issue states them -------------------------------------------------------


def test_limits() -> None:
    assert MAX_MESSAGE_BYTES == 32 * 1024
    assert MAX_REQUEST_BYTES == 500 * 1024
    assert MAX_BATCH_MESSAGES == 2500
    assert MAX_MESSAGE_ID_CHARS == 100
    assert frozenset({"identify", "track", "page", "screen", "group", "alias"}) == TYPES


# -- the minimal valid message of each type --------------------------------------------------

EXPECTED_FIELDS = {
    "identify": {"traits": {}},
    "track": {"event": "Signed Up", "properties": {}},
    "page": {"properties": {}},
    "screen": {"name": ""},
    "group": {"groupId": "g1", "traits": {}},
    "alias": {"previousId": "anon-1"},
}


@pytest.mark.parametrize("type_", sorted(MINIMAL))
def test_minimal_message_of_each_type(type_: str) -> None:
    message = norm(MINIMAL[type_])
    assert message.type == type_
    assert message.user_id == "u1"
    assert message.anonymous_id is None
    assert message.fields == EXPECTED_FIELDS[type_]
    assert message.context is None
    assert message.integrations == {}
    assert message.timestamp == NOW


@pytest.mark.parametrize("type_", sorted(MINIMAL))
def test_endpoint_type_applies_without_a_type_key(type_: str) -> None:
    raw = {k: v for k, v in MINIMAL[type_].items() if k != "type"}
    assert norm(raw, type_=type_).type == type_


def test_endpoint_type_wins_over_the_body_type() -> None:
    message = norm({"type": "identify", "userId": "u", "event": "E"}, type_="track")
    assert message.type == "track"
    assert message.fields == {"event": "E", "properties": {}}


# -- required fields -------------------------------------------------------------------------


@pytest.mark.parametrize("type_", NEEDS_IDENTITY)
@pytest.mark.parametrize(
    "identity",
    [
        {},
        {"userId": None},
        {"userId": ""},
        {"anonymousId": ""},
        {"userId": "", "anonymousId": None},
    ],
)
def test_identity_required(type_: str, identity: dict[str, Any]) -> None:
    raw = {k: v for k, v in MINIMAL[type_].items() if k != "userId"} | identity
    rejection = rejected(raw)
    assert rejection.code == "missing_field"
    assert rejection.field == "userId"
    assert rejection.status == 400
    assert "userId or anonymousId" in rejection.message
    assert type_ in rejection.message


@pytest.mark.parametrize("type_", NEEDS_IDENTITY)
def test_anonymous_id_alone_is_enough(type_: str) -> None:
    raw = {k: v for k, v in MINIMAL[type_].items() if k != "userId"} | {"anonymousId": "a-1"}
    message = norm(raw)
    assert message.user_id is None
    assert message.anonymous_id == "a-1"


@pytest.mark.parametrize("type_", NEEDS_IDENTITY)
def test_both_identities_kept(type_: str) -> None:
    message = norm(MINIMAL[type_] | {"anonymousId": "a-1"})
    assert (message.user_id, message.anonymous_id) == ("u1", "a-1")


@pytest.mark.parametrize("event", [None, "", "__absent__"])
def test_track_needs_event(event: Any) -> None:
    raw = {"type": "track", "userId": "u"}
    if event != "__absent__":
        raw["event"] = event
    rejection = rejected(raw)
    assert (rejection.code, rejection.field) == ("missing_field", "event")
    assert rejection.message == "track needs event"


@pytest.mark.parametrize("event", [5, True, ["E"], {"name": "E"}])
def test_track_event_must_be_a_string(event: Any) -> None:
    rejection = rejected({"type": "track", "userId": "u", "event": event})
    assert (rejection.code, rejection.field) == ("invalid_field", "event")


@pytest.mark.parametrize("group_id", [None, "", "__absent__"])
def test_group_needs_group_id(group_id: Any) -> None:
    raw = {"type": "group", "userId": "u"}
    if group_id != "__absent__":
        raw["groupId"] = group_id
    rejection = rejected(raw)
    assert (rejection.code, rejection.field) == ("missing_field", "groupId")
    assert "group needs groupId" in rejection.message


@pytest.mark.parametrize(
    ("group_id", "expected"), [("g", "g"), (42, "42"), (0, "0"), (-1.5, "-1.5")]
)
def test_group_id_strings_and_numbers(group_id: Any, expected: str) -> None:
    assert norm({"type": "group", "userId": "u", "groupId": group_id}).fields["groupId"] == expected


@pytest.mark.parametrize("group_id", [True, [1], {"id": 1}])
def test_group_id_of_a_wrong_type(group_id: Any) -> None:
    rejection = rejected({"type": "group", "userId": "u", "groupId": group_id})
    assert (rejection.code, rejection.field) == ("invalid_field", "groupId")


@pytest.mark.parametrize(
    "raw",
    [
        {"type": "alias", "previousId": "p"},
        {"type": "alias", "previousId": "p", "userId": ""},
        {"type": "alias", "previousId": "p", "anonymousId": "a"},  # anonymousId is not enough
    ],
)
def test_alias_needs_user_id(raw: dict[str, Any]) -> None:
    rejection = rejected(raw)
    assert (rejection.code, rejection.field) == ("missing_field", "userId")
    assert rejection.message == "alias needs userId"


@pytest.mark.parametrize("previous_id", [None, "", "__absent__"])
def test_alias_needs_previous_id(previous_id: Any) -> None:
    raw = {"type": "alias", "userId": "u"}
    if previous_id != "__absent__":
        raw["previousId"] = previous_id
    rejection = rejected(raw)
    assert (rejection.code, rejection.field) == ("missing_field", "previousId")
    assert rejection.message == "alias needs previousId"


def test_alias_previous_id_number_becomes_a_string() -> None:
    assert norm({"type": "alias", "userId": "u", "previousId": 7}).fields == {"previousId": "7"}


# -- identities as numbers -------------------------------------------------------------------


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        ("u-1", "u-1"),
        (123, "123"),
        (0, "0"),
        (-5, "-5"),
        (12345678901234567890, "12345678901234567890"),
        (1.5, "1.5"),
        pytest.param(
            12.0,
            "12",
        ),
    ],
)
@pytest.mark.parametrize("key", ["userId", "anonymousId"])
def test_identity_numbers_become_strings(key: str, value: Any, expected: str) -> None:
    message = norm({"type": "identify", key: value})
    assert (message.user_id if key == "userId" else message.anonymous_id) == expected


@pytest.mark.parametrize("value", [True, False, [1], {"id": 1}])
@pytest.mark.parametrize("key", ["userId", "anonymousId"])
def test_identity_of_a_wrong_type(key: str, value: Any) -> None:
    rejection = rejected({"type": "identify", "userId": "u", "anonymousId": "a"} | {key: value})
    assert (rejection.code, rejection.field) == ("invalid_field", key)


# -- invalid messages and types --------------------------------------------------------------


@pytest.mark.parametrize("raw", [None, [], ["type", "track"], "track", 5, True])
def test_message_must_be_an_object(raw: Any) -> None:
    rejection = rejected(raw)
    assert rejection.code == "invalid_message"
    assert rejection.field is None


@pytest.mark.parametrize("raw", [{"userId": "u"}, {"type": None, "userId": "u"}])
def test_type_missing(raw: dict[str, Any]) -> None:
    rejection = rejected(raw)
    assert (rejection.code, rejection.field) == ("missing_field", "type")


@pytest.mark.parametrize(
    "type_",
    [
        "Track",
        "TRACK",
        "delete",
        "batch",
        "import",
        "",
        5,
        True,
        pytest.param(
            ["track"],
        ),
        pytest.param(
            {"t": "track"},
        ),
    ],
)
def test_type_invalid(type_: Any) -> None:
    rejection = rejected({"type": type_, "userId": "u", "event": "E"})
    assert (rejection.code, rejection.field) == ("invalid_field", "type")
    assert "identify" in rejection.message


@pytest.mark.parametrize(
    ("type_", "key"),
    [
        ("identify", "traits"),
        ("group", "traits"),
        ("track", "properties"),
        ("page", "properties"),
        ("screen", "properties"),
        ("track", "context"),
        ("track", "integrations"),
    ],
)
@pytest.mark.parametrize("value", ["x", 1, [1, 2], True])
def test_objects_must_be_objects(type_: str, key: str, value: Any) -> None:
    rejection = rejected(MINIMAL[type_] | {key: value})
    assert (rejection.code, rejection.field) == ("invalid_field", key)


@pytest.mark.parametrize(
    ("type_", "key", "expected"),
    [
        ("identify", "traits", {}),
        ("group", "traits", {}),
        ("track", "properties", {}),
        ("page", "properties", {}),
    ],
)
def test_null_objects_are_empty(type_: str, key: str, expected: dict[str, Any]) -> None:
    assert norm(MINIMAL[type_] | {key: None}).fields[key] == expected


def test_type_specific_fields_kept() -> None:
    traits = {"email": "a@example.com", "age": 30, "nested": {"x": [1, 2]}}
    assert norm({"type": "identify", "userId": "u", "traits": traits}).fields == {"traits": traits}
    properties = {"revenue": 39.95, "currency": "EUR"}
    assert norm(
        {"type": "track", "userId": "u", "event": "E", "properties": properties}
    ).fields == {
        "event": "E",
        "properties": properties,
    }
    group_traits = {"name": "Initech", "employees": 100}
    assert norm(
        {"type": "group", "userId": "u", "groupId": "g", "traits": group_traits}
    ).fields == {
        "groupId": "g",
        "traits": group_traits,
    }


# -- page and screen -------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("raw", "expected"),
    [
        ({"name": "Home"}, {"name": "Home"}),
        ({"category": "Docs"}, {"category": "Docs"}),
        ({"name": "Home", "category": "Docs"}, {"name": "Home", "category": "Docs"}),
        (
            {"name": "Home", "properties": {"url": "https://x.test/", "title": "T"}},
            {"url": "https://x.test/", "title": "T", "name": "Home"},
        ),
        ({"name": "Outer", "properties": {"name": "Inner"}}, {"name": "Inner"}),  # properties win
        ({"category": "Outer", "properties": {"category": "Inner"}}, {"category": "Inner"}),
        ({"name": ""}, {}),
        ({"name": 5, "category": None}, {}),
        (
            {"properties": {"path": "/", "referrer": "r", "title": "t", "url": "u", "extra": 1}},
            {"path": "/", "referrer": "r", "title": "t", "url": "u", "extra": 1},
        ),
    ],
)
def test_page_name_and_category_move_into_properties(
    raw: dict[str, Any], expected: dict[str, Any]
) -> None:
    assert norm({"type": "page", "userId": "u"} | raw).fields == {"properties": expected}


def test_page_does_not_modify_the_input_properties() -> None:
    properties = {"url": "u"}
    norm({"type": "page", "userId": "u", "name": "Home", "properties": properties})
    assert properties == {"url": "u"}


@pytest.mark.parametrize(
    ("raw", "expected"),
    [
        ({}, {"name": ""}),
        ({"name": None}, {"name": ""}),
        ({"name": "Home"}, {"name": "Home"}),
        ({"name": "Home", "properties": {}}, {"name": "Home"}),
        ({"name": "Home", "properties": {"a": 1}}, {"name": "Home", "properties": {"a": 1}}),
    ],
)
def test_screen_fields(raw: dict[str, Any], expected: dict[str, Any]) -> None:
    assert norm({"type": "screen", "userId": "u"} | raw).fields == expected


@pytest.mark.parametrize("name", [5, ["Home"], {"n": 1}, True])
def test_screen_name_must_be_a_string(name: Any) -> None:
    rejection = rejected({"type": "screen", "userId": "u", "name": name})
    assert (rejection.code, rejection.field) == ("invalid_field", "name")


# -- messageId -------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "message_id", ["m-1", "x" * MAX_MESSAGE_ID_CHARS, "é" * MAX_MESSAGE_ID_CHARS, " spaced "]
)
def test_message_id_kept(message_id: str) -> None:
    assert norm(MINIMAL["track"] | {"messageId": message_id}).message_id == message_id


@pytest.mark.parametrize("raw", [{}, {"messageId": None}, {"messageId": ""}])
def test_message_id_generated(raw: dict[str, Any]) -> None:
    first = norm(MINIMAL["track"] | raw).message_id
    second = norm(MINIMAL["track"] | raw).message_id
    assert first != second
    assert uuid.UUID(first).version == 4
    assert str(uuid.UUID(first)) == first


@pytest.mark.parametrize("message_id", ["x" * 101, "é" * 101, "x" * 10_000])
def test_message_id_too_long(message_id: str) -> None:
    rejection = rejected(MINIMAL["track"] | {"messageId": message_id})
    assert (rejection.code, rejection.field) == ("invalid_field", "messageId")
    assert "100" in rejection.message


@pytest.mark.parametrize("message_id", [123, 1.5, True, ["m"], {"id": "m"}])
def test_message_id_must_be_a_string(message_id: Any) -> None:
    rejection = rejected(MINIMAL["track"] | {"messageId": message_id})
    assert (rejection.code, rejection.field) == ("invalid_field", "messageId")


@pytest.mark.parametrize(
    "message_id",
    [
        "m\r\nX-Injected: 1",  # CR LF
        "m\x00",  # NUL
        "\tm",  # TAB is a C0 control too
        "m\x1b[31m",  # ESC
        "m\x7f",  # DEL
        "é\x85",  # C1 (NEL)
        "m\x9f",  # the last C1
    ],
)
def test_message_id_with_a_control_character_is_refused(message_id: str) -> None:
    rejection = rejected(MINIMAL["track"] | {"messageId": message_id})
    assert (rejection.code, rejection.field) == ("invalid_field", "messageId")
    assert "control character" in rejection.message


@pytest.mark.parametrize(
    ("type_", "field"),
    [
        ("track", "userId"),
        ("track", "anonymousId"),
        ("track", "event"),
        ("group", "groupId"),
        ("alias", "previousId"),
    ],
)
@pytest.mark.parametrize("value", ["u\x00x", "\x00", "é\x00"])
def test_a_nul_in_a_field_that_becomes_a_column_is_refused(
    type_: str, field: str, value: str
) -> None:
    rejection = rejected(MINIMAL[type_] | {"anonymousId": "a1", field: value})
    assert (rejection.code, rejection.field) == ("invalid_field", field)
    assert "U+0000" in rejection.message
    assert value not in rejection.message  # the client's value is not echoed


def test_a_nul_in_a_batch_names_the_index() -> None:
    rejection = rejected_request(batch_of(MINIMAL["track"], MINIMAL["track"] | {"event": "e\x00x"}))
    assert (rejection.code, rejection.field, rejection.index) == ("invalid_field", "event", 1)


def test_a_nul_elsewhere_in_the_message_is_kept() -> None:
    # Properties, traits and context travel in the body, stored as JSON text with the
    # character escaped: delivered as sent.
    message = norm(
        MINIMAL["track"]
        | {"properties": {"k\x00": "v\x00"}, "context": {"page": {"title": "t\x00"}}}
    )
    assert message.fields["properties"] == {"k\x00": "v\x00"}
    assert message.context == {"page": {"title": "t\x00"}}
    traits = norm(MINIMAL["identify"] | {"traits": {"name": "n\x00"}}).fields["traits"]
    assert traits == {"name": "n\x00"}


def test_message_id_control_character_in_a_batch_names_the_index() -> None:
    rejection = rejected_request(
        batch_of(MINIMAL["track"], MINIMAL["track"] | {"messageId": "a\nb"})
    )
    assert (rejection.code, rejection.field, rejection.index) == ("invalid_field", "messageId", 1)


@pytest.mark.parametrize(
    "message_id",
    [
        "m\xa0nbsp",  # no-break space: printable text, not a control character
        "line\u2028sep",  # a separator, not a control character
        "\u00a0\u00ff\u0100",  # just past C1
        "emoji-\U0001f600",
    ],
)
def test_message_id_other_unicode_is_kept(message_id: str) -> None:
    assert norm(MINIMAL["track"] | {"messageId": message_id}).message_id == message_id


# -- timestamps ------------------------------------------------------------------------------

T0 = datetime(2026, 2, 28, 10, 0, 0, tzinfo=UTC)


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("2026-02-28T10:00:00Z", T0),
        ("2026-02-28T10:00:00+00:00", T0),
        ("2026-02-28T10:00:00+0000", T0),
        ("2026-02-28T10:00:00-00:00", T0),
        ("2026-02-28T10:00:00.000Z", T0),
        ("2026-02-28T10:00:00.5Z", T0.replace(microsecond=500_000)),
        ("2026-02-28T10:00:00.123Z", T0.replace(microsecond=123_000)),
        ("2026-02-28T10:00:00.123+00:00", T0.replace(microsecond=123_000)),
        ("2026-02-28T10:00:00.123456Z", T0.replace(microsecond=123_456)),
        ("2026-02-28T10:00:00.123456789Z", T0.replace(microsecond=123_456)),  # Go's RFC3339Nano
        ("2026-02-28T12:00:00+02:00", T0),
        ("2026-02-28T12:00:00.250+0200", T0.replace(microsecond=250_000)),
        ("2026-02-28T04:30:00-05:30", T0),
        ("2026-02-28T10:00:00", T0),  # no offset: UTC
        ("2026-02-28T10:00:00.042", T0.replace(microsecond=42_000)),
        ("2026-02-28 10:00:00Z", T0),
    ],
)
def test_parse_timestamp_forms(text: str, expected: datetime) -> None:
    parsed = parse_timestamp(text, "timestamp")
    assert parsed == expected
    assert parsed.utcoffset() == timedelta(0)
    assert norm(MINIMAL["track"] | {"timestamp": text}).timestamp == expected


@pytest.mark.parametrize(
    "value",
    [
        "yesterday",
        "",
        "2026-13-01T00:00:00Z",
        "2026-02-30T00:00:00Z",
        "10:00",
        1772272800,
        [],
        True,
    ],
)
def test_invalid_timestamp(value: Any) -> None:
    rejection = rejected(MINIMAL["track"] | {"timestamp": value})
    assert (rejection.code, rejection.field) == ("invalid_field", "timestamp")


@pytest.mark.parametrize(
    "raw",
    [
        pytest.param(
            {"timestamp": "0001-01-01T00:00:00+01:00"},
        ),
        pytest.param(
            {"timestamp": "9999-12-31T23:59:59-01:00"},
        ),
        pytest.param(
            {"timestamp": "9999-12-31T00:00:00Z", "sentAt": "0001-01-01T00:00:00Z"},
        ),
    ],
)
def test_out_of_range_timestamps_are_rejected_not_crashing(raw: dict[str, Any]) -> None:
    rejection = rejected(MINIMAL["track"] | raw)
    assert rejection.code == "invalid_field"
    assert rejection.field in ("timestamp", "sentAt")


@pytest.mark.parametrize("raw", [{}, {"timestamp": None}, {"sentAt": "2026-03-01T11:00:00Z"}])
def test_timestamp_defaults_to_receipt_time(raw: dict[str, Any]) -> None:
    assert norm(MINIMAL["track"] | raw).timestamp == NOW


def test_timestamp_without_sent_at_is_taken_as_is() -> None:
    assert norm(MINIMAL["track"] | {"timestamp": "2020-01-01T00:00:00Z"}).timestamp == datetime(
        2020, 1, 1, tzinfo=UTC
    )


@pytest.mark.parametrize(
    ("timestamp", "sent_at", "expected"),
    [
        # The device clock is 1 hour behind: its timestamp and sentAt are both an hour early.
        ("2026-03-01T10:59:50Z", "2026-03-01T11:00:00Z", NOW - timedelta(seconds=10)),
        # 1 hour ahead.
        ("2026-03-01T12:59:00Z", "2026-03-01T13:00:00Z", NOW - timedelta(minutes=1)),
        # In sync: nothing moves.
        ("2026-03-01T11:59:58.500Z", "2026-03-01T12:00:00Z", NOW - timedelta(seconds=1.5)),
        # Offsets and naive forms combine correctly.
        ("2026-03-01T12:59:50+02:00", "2026-03-01T11:00:00", NOW - timedelta(seconds=10)),
        # A queued event from yesterday keeps its distance from the send.
        ("2026-02-28T12:00:00Z", "2026-03-01T12:00:00Z", NOW - timedelta(days=1)),
    ],
)
def test_clock_skew_corrected_with_message_sent_at(
    timestamp: str, sent_at: str, expected: datetime
) -> None:
    message = norm(MINIMAL["track"] | {"timestamp": timestamp, "sentAt": sent_at})
    assert message.timestamp == expected


@pytest.mark.parametrize(
    ("raw", "batch_sent_at", "original"),
    [
        # Corrected: the client's own time is kept beside the corrected one.
        (
            {"timestamp": "2026-03-01T10:59:50.250Z", "sentAt": "2026-03-01T11:00:00Z"},
            None,
            datetime(2026, 3, 1, 10, 59, 50, 250000, tzinfo=UTC),
        ),
        (
            {"timestamp": "2026-03-01T12:59:50+02:00"},
            datetime(2026, 3, 1, 11, 0, 0, tzinfo=UTC),
            datetime(2026, 3, 1, 10, 59, 50, tzinfo=UTC),
        ),
        # In sync: corrected by nothing, and still kept.
        (
            {"timestamp": "2026-03-01T11:59:58Z", "sentAt": "2026-03-01T11:59:58Z"},
            None,
            datetime(2026, 3, 1, 11, 59, 58, tzinfo=UTC),
        ),
        # Not corrected: `timestamp` is the client's own, or receipt time.
        ({"timestamp": "2026-03-01T10:59:50Z"}, None, None),
        ({}, None, None),
        ({"sentAt": "2026-03-01T11:00:00Z"}, None, None),
        ({}, datetime(2026, 3, 1, 11, 0, 0, tzinfo=UTC), None),
    ],
)
def test_the_client_timestamp_is_kept_when_corrected(
    raw: dict[str, Any], batch_sent_at: datetime | None, original: datetime | None
) -> None:
    message = norm(MINIMAL["track"] | raw, batch_sent_at=batch_sent_at)
    assert message.original_timestamp == original


def test_clock_skew_corrected_with_batch_sent_at() -> None:
    sent_at = datetime(2026, 3, 1, 11, 0, 0, tzinfo=UTC)
    message = norm(MINIMAL["track"] | {"timestamp": "2026-03-01T10:59:50Z"}, batch_sent_at=sent_at)
    assert message.timestamp == NOW - timedelta(seconds=10)


def test_message_sent_at_wins_over_batch_sent_at() -> None:
    message = norm(
        MINIMAL["track"] | {"timestamp": "2026-03-01T10:59:50Z", "sentAt": "2026-03-01T11:59:50Z"},
        batch_sent_at=datetime(2026, 3, 1, 11, 0, 0, tzinfo=UTC),
    )
    assert message.timestamp == NOW - timedelta(hours=1)


@pytest.mark.parametrize("sent_at", ["soon", 5, ""])
def test_invalid_sent_at(sent_at: Any) -> None:
    rejection = rejected(
        MINIMAL["track"] | {"timestamp": "2026-03-01T10:00:00Z", "sentAt": sent_at}
    )
    assert (rejection.code, rejection.field) == ("invalid_field", "sentAt")


def test_batch_sent_at_through_normalise_request() -> None:
    payload = batch_of(
        MINIMAL["track"] | {"timestamp": "2026-03-01T10:59:50Z"},
        MINIMAL["track"] | {"timestamp": "2026-03-01T10:59:50Z", "sentAt": "2026-03-01T10:59:55Z"},
        MINIMAL["track"],
        sentAt="2026-03-01T11:00:00+0000",
    )
    messages = normalise_request(payload, received_at=NOW, type_=None, body_bytes=300)
    assert [m.timestamp for m in messages] == [
        NOW - timedelta(seconds=10),
        NOW - timedelta(seconds=5),
        NOW,
    ]


def test_invalid_batch_sent_at() -> None:
    rejection = rejected_request(batch_of(MINIMAL["track"], sentAt="never"))
    assert (rejection.code, rejection.field, rejection.index) == ("invalid_field", "sentAt", None)


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        (T0, "2026-02-28T10:00:00.000Z"),
        (T0.replace(microsecond=999_999), "2026-02-28T10:00:00.999Z"),  # truncated, not rounded
        (T0.replace(microsecond=1_000), "2026-02-28T10:00:00.001Z"),
        (T0.replace(microsecond=999), "2026-02-28T10:00:00.000Z"),
        (
            datetime(2026, 2, 28, 12, 0, tzinfo=timezone(timedelta(hours=2))),
            "2026-02-28T10:00:00.000Z",
        ),
        (
            datetime(2026, 1, 1, 0, 30, tzinfo=timezone(timedelta(hours=1))),
            "2025-12-31T23:30:00.000Z",
        ),
        pytest.param(
            datetime(99, 1, 1, tzinfo=UTC),
            "0099-01-01T00:00:00.000Z",
        ),
    ],
)
def test_format_timestamp(value: datetime, expected: str) -> None:
    assert format_timestamp(value) == expected


def test_parse_then_format_round_trips_milliseconds() -> None:
    text = "2012-12-02T00:30:08.276Z"
    assert format_timestamp(parse_timestamp(text, "timestamp")) == text


# -- batch context and integrations ----------------------------------------------------------


@pytest.mark.parametrize(
    ("batch", "own", "expected"),
    [
        (None, None, None),
        ({}, None, None),
        (None, {}, {}),
        ({"ip": "1.2.3.4"}, None, {"ip": "1.2.3.4"}),
        (None, {"ip": "1.2.3.4"}, {"ip": "1.2.3.4"}),
        (
            {"ip": "1.2.3.4", "library": {"name": "analytics-python"}},
            {"ip": "5.6.7.8", "locale": "fr"},
            {"ip": "5.6.7.8", "library": {"name": "analytics-python"}, "locale": "fr"},
        ),
        # The merge is by top-level key: a message's own object replaces the batch's whole.
        ({"app": {"name": "A", "version": "1"}}, {"app": {"name": "B"}}, {"app": {"name": "B"}}),
    ],
)
def test_batch_context_merges_under_message_context(
    batch: dict[str, Any] | None, own: dict[str, Any] | None, expected: dict[str, Any] | None
) -> None:
    raw = MINIMAL["track"] | ({"context": own} if own is not None else {})
    assert norm(raw, batch_context=batch).context == expected


@pytest.mark.parametrize(
    ("batch", "own", "expected"),
    [
        (None, None, {}),
        ({}, {}, {}),
        ({"All": False}, None, {"All": False}),
        (None, {"Webhooks": True}, {"Webhooks": True}),
        ({"All": False, "Webhooks": True}, {"Webhooks": False}, {"All": False, "Webhooks": False}),
        ({"A": True}, {"B": {"opt": 1}}, {"A": True, "B": {"opt": 1}}),
    ],
)
def test_batch_integrations_merge_under_message_integrations(
    batch: dict[str, Any] | None, own: dict[str, Any] | None, expected: dict[str, Any]
) -> None:
    raw = MINIMAL["track"] | ({"integrations": own} if own is not None else {})
    assert norm(raw, batch_integrations=batch).integrations == expected


def test_merge_does_not_modify_inputs() -> None:
    batch_context = {"ip": "1.2.3.4"}
    own = {"locale": "fr"}
    norm(MINIMAL["track"] | {"context": own}, batch_context=batch_context)
    assert batch_context == {"ip": "1.2.3.4"}
    assert own == {"locale": "fr"}


def test_batch_context_and_integrations_through_normalise_request() -> None:
    payload = batch_of(
        MINIMAL["track"],
        MINIMAL["identify"] | {"context": {"ip": "9.9.9.9"}, "integrations": {"Webhooks": False}},
        context={"ip": "1.1.1.1", "library": {"name": "l"}},
        integrations={"All": False, "Webhooks": True},
    )
    first, second = normalise_request(payload, received_at=NOW, type_=None, body_bytes=300)
    assert first.context == {"ip": "1.1.1.1", "library": {"name": "l"}}
    assert first.integrations == {"All": False, "Webhooks": True}
    assert second.context == {"ip": "9.9.9.9", "library": {"name": "l"}}
    assert second.integrations == {"All": False, "Webhooks": False}


@pytest.mark.parametrize("key", ["context", "integrations"])
def test_batch_level_objects_must_be_objects(key: str) -> None:
    rejection = rejected_request(batch_of(MINIMAL["track"], **{key: "x"}))
    assert (rejection.code, rejection.field, rejection.index) == ("invalid_field", key, None)


# -- whole requests --------------------------------------------------------------------------


@pytest.mark.parametrize("payload", [None, [], [MINIMAL["track"]], "x", 1])
@pytest.mark.parametrize("type_", [None, "track"])
def test_request_body_must_be_an_object(payload: Any, type_: str | None) -> None:
    rejection = rejected_request(payload, type_=type_)
    assert rejection.code == "invalid_body"


def test_single_message_request() -> None:
    payload = {"userId": "u", "event": "E", "writeKey": "wk"}
    (message,) = normalise_request(payload, received_at=NOW, type_="track", body_bytes=60)
    assert message.type == "track"
    assert message.fields == {"event": "E", "properties": {}}


def test_single_message_rejection_has_no_index() -> None:
    rejection = rejected_request({"userId": "u"}, type_="track")
    assert (rejection.code, rejection.field, rejection.index) == ("missing_field", "event", None)
    assert "index" not in rejection.as_json()


def test_batch_request_keeps_order() -> None:
    payload = batch_of(*(MINIMAL[t] | {"messageId": f"m-{t}"} for t in sorted(MINIMAL)))
    messages = normalise_request(payload, received_at=NOW, type_=None, body_bytes=500)
    assert [m.type for m in messages] == sorted(MINIMAL)
    assert [m.message_id for m in messages] == [f"m-{t}" for t in sorted(MINIMAL)]


@pytest.mark.parametrize(
    ("payload", "code"),
    [
        ({}, "missing_field"),
        ({"batch": None}, "missing_field"),
        ({"batch": {}}, "invalid_field"),
        ({"batch": "x"}, "invalid_field"),
        ({"batch": []}, "invalid_field"),
    ],
)
def test_batch_array_required(payload: dict[str, Any], code: str) -> None:
    rejection = rejected_request(payload)
    assert (rejection.code, rejection.field) == (code, "batch")


def test_batch_of_the_maximum_size() -> None:
    payload = batch_of(*([MINIMAL["track"]] * MAX_BATCH_MESSAGES))
    messages = normalise_request(payload, received_at=NOW, type_=None, body_bytes=200_000)
    assert len(messages) == 2500
    assert len({m.message_id for m in messages}) == 2500  # each gets its own generated id


def test_batch_over_the_maximum_size() -> None:
    payload = batch_of(*([MINIMAL["track"]] * (MAX_BATCH_MESSAGES + 1)))
    rejection = rejected_request(payload, body_bytes=200_000)
    assert (rejection.code, rejection.field) == ("batch_too_large", "batch")
    assert "2500" in rejection.message
    assert "2501" in rejection.message


@pytest.mark.parametrize("index", [0, 1, 4])
@pytest.mark.parametrize(
    ("bad", "code", "field"),
    [
        ({"type": "track", "userId": "u"}, "missing_field", "event"),
        ({"type": "group", "anonymousId": "a"}, "missing_field", "groupId"),
        ({"type": "alias", "userId": "u"}, "missing_field", "previousId"),
        ({"type": "identify"}, "missing_field", "userId"),
        ({"type": "nope", "userId": "u"}, "invalid_field", "type"),
        (
            {"type": "track", "userId": "u", "event": "E", "messageId": "m" * 101},
            "invalid_field",
            "messageId",
        ),
        ("not an object", "invalid_message", None),
    ],
)
def test_batch_rejection_names_the_index(
    index: int, bad: Any, code: str, field: str | None
) -> None:
    batch: list[Any] = [MINIMAL["track"]] * 5
    batch[index] = bad
    rejection = rejected_request({"batch": batch})
    assert (rejection.code, rejection.field, rejection.index) == (code, field, index)
    assert rejection.message.startswith(f"batch[{index}]: ")
    assert rejection.as_json()["index"] == index


def test_first_invalid_message_is_reported() -> None:
    batch = [MINIMAL["track"], {"type": "track"}, {"type": "group", "userId": "u"}]
    rejection = rejected_request({"batch": batch})
    assert (rejection.index, rejection.field) == (1, "userId")


# -- the 32 KiB per-message limit ------------------------------------------------------------


def sized(size: int, base: dict[str, Any] | None = None) -> dict[str, Any]:
    """A track message whose compact UTF-8 JSON is exactly `size` bytes."""
    message = dict(base or MINIMAL["track"]) | {"properties": {"pad": ""}}
    message["properties"] = {"pad": "x" * (size - message_size(message))}
    assert message_size(message) == size
    return message


@pytest.mark.parametrize(
    ("value", "size"),
    [
        ({}, 2),
        ({"a": 1}, 7),
        ({"a": "é"}, 10),  # bytes, not characters
        ({"a": "\U0001f680"}, 12),
        ({"a": [1, 2]}, 11),
    ],
)
def test_message_size_is_compact_utf8_bytes(value: Any, size: int) -> None:
    assert message_size(value) == size


def test_single_message_at_the_limit() -> None:
    payload = sized(MAX_MESSAGE_BYTES)
    (message,) = normalise_request(
        payload, received_at=NOW, type_="track", body_bytes=MAX_MESSAGE_BYTES
    )
    assert len(message.fields["properties"]["pad"]) > 30_000


def test_single_message_over_the_limit() -> None:
    payload = sized(MAX_MESSAGE_BYTES + 1)
    rejection = rejected_request(payload, type_="track", body_bytes=MAX_MESSAGE_BYTES + 1)
    assert rejection.code == "message_too_large"
    assert str(MAX_MESSAGE_BYTES) in rejection.message
    assert rejection.index is None


def test_single_message_over_the_limit_by_multibyte_characters() -> None:
    payload = dict(MINIMAL["track"]) | {"properties": {"pad": "é" * (MAX_MESSAGE_BYTES // 2)}}
    body = jsonjs.dumps(payload)
    rejection = rejected_request(payload, type_="track", body_bytes=len(body))
    assert rejection.code == "message_too_large"


@pytest.mark.parametrize("index", [0, 2])
def test_batch_message_over_the_limit_names_the_index(index: int) -> None:
    batch = [sized(MAX_MESSAGE_BYTES) for _ in range(3)]
    batch[index] = sized(MAX_MESSAGE_BYTES + 1)
    payload = {"batch": batch}
    rejection = rejected_request(payload, body_bytes=len(jsonjs.dumps(payload)))
    assert (rejection.code, rejection.index) == ("message_too_large", index)
    assert rejection.message.startswith(f"batch[{index}]: ")


def test_batch_messages_at_the_limit_pass() -> None:
    payload = {"batch": [sized(MAX_MESSAGE_BYTES) for _ in range(3)]}
    messages = normalise_request(
        payload, received_at=NOW, type_=None, body_bytes=len(jsonjs.dumps(payload))
    )
    assert len(messages) == 3


def test_size_check_survives_lone_surrogates() -> None:
    batch = [
        sized(MAX_MESSAGE_BYTES - 100),
        MINIMAL["track"] | {"properties": {"s": jsonjs.loads('"\\ud800"')}},
    ]
    messages = normalise_request(
        {"batch": batch}, received_at=NOW, type_=None, body_bytes=MAX_MESSAGE_BYTES + 200
    )
    assert messages[1].fields["properties"] == {"s": "\ud800"}
