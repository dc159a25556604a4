"""efd.segment.routing.shape and its place in request parsing: each routed destination's filters
applied to the webhook body at routing time, the same in the daemon and in a parser process
(pure)."""

from __future__ import annotations

import hashlib
import json
import pickle
from datetime import UTC, datetime
from typing import Any

from efd.languages.filters import Condition, Filter, Filtered, FilterSet
from efd.segment.payload import ChildParser, WriteKeys, from_child, parse_request
from efd.segment.routing import shape
from efd.segment.webhooks import encode

BODY: dict[str, Any] = {
    "version": 1,
    "type": "track",
    "userId": "u1",
    "event": "Order Completed",
    "properties": {"total": 120, "email": "a@example.com"},
    "context": {"ip": "10.0.0.1", "page": {"url": "https://shop.example/cart"}},
    "messageId": "m-1",
}


def drop(when: str) -> Filter:
    return Filter(Condition(when), "drop")


def sample(when: str, percent: float) -> Filter:
    return Filter(Condition(when), "sample", percent=percent)


def drop_fields(**fields: list[str]) -> Filter:
    paths = tuple((name, tuple(tuple(p.split(".")) for p in v)) for name, v in fields.items())
    return Filter(Condition("all"), "drop_fields", fields=paths)


def point(message_id: str) -> float:
    # docs/filters.md's formula, written out again rather than imported.
    return int.from_bytes(hashlib.sha256(message_id.encode()).digest()[:8], "big") / 2**64


def test_without_filters_every_destination_takes_the_message_body() -> None:
    assert shape(BODY, ["a", "b"], {}) == (("a", "b"), (), ())


def test_a_destination_without_filters_is_left_alone() -> None:
    filters = {"b": FilterSet([drop('event = "Order Completed"')])}
    assert shape(BODY, ["a", "b"], filters) == (("a",), (("b", None, _reason(filters, "b")),), ())


def _reason(filters: dict[str, FilterSet], name: str) -> str:
    result = filters[name].apply(BODY)
    assert isinstance(result, Filtered)
    return result.reason


def test_a_drop_names_the_filter_and_its_condition() -> None:
    filters = {"crm": FilterSet([drop('type = "identify"'), drop('event = "Order Completed"')])}
    assert shape(BODY, ["crm"], filters) == (
        (),
        (("crm", None, 'filters[1] drop, if event = "Order Completed"'),),
        (),
    )


def test_a_filter_that_does_not_apply_keeps_the_message_body() -> None:
    filters = {"crm": FilterSet([drop('event = "Debug Ping"')])}
    assert shape(BODY, ["crm"], filters) == (("crm",), (), ())


def test_field_filters_give_the_destination_its_own_body_and_leave_the_message_whole() -> None:
    original = json.loads(json.dumps(BODY))
    filters = {"crm": FilterSet([drop_fields(properties=["email"], context=["ip"])])}
    plain, shaped, _ = shape(BODY, ["crm", "other"], filters)
    assert plain == ("other",)
    [(name, body, filtered)] = shaped
    assert (name, filtered) == ("crm", None)
    assert body is not None
    sent = json.loads(body)
    assert sent["properties"] == {"total": 120}
    assert sent["context"] == {"page": {"url": "https://shop.example/cart"}}
    # The body is exactly what encode writes, key order included: it is what gets signed.
    expected = dict(BODY, properties={"total": 120}, context={"page": BODY["context"]["page"]})
    assert body == encode(expected).decode()
    assert original == BODY


def test_a_field_filter_that_removes_nothing_keeps_the_message_body() -> None:
    filters = {"crm": FilterSet([drop_fields(traits=["email"])])}
    assert shape(BODY, ["crm"], filters) == (("crm",), (), ())


def test_sampling_follows_the_message_id_alone() -> None:
    filters = {"crm": FilterSet([sample("all", 30)])}
    kept = 0
    for i in range(400):
        message_id = f"id-{i}"
        body = dict(BODY, messageId=message_id)
        plain, shaped, _ = shape(body, ["crm"], filters)
        expected_sent = point(message_id) * 100 < 30
        assert (plain == ("crm",)) is expected_sent
        assert shape(body, ["crm"], filters) == (plain, shaped, ())  # the same choice again
        if not expected_sent:
            assert shaped == (("crm", None, "filters[0] sample 30 %, if all: sampled out"),)
        kept += expected_sent
    assert 0 < kept < 400


KEYS = WriteKeys({"wk": type("S", (), {"name": "web", "destinations": ("crm", "other")})()})


def _batch(n: int, pad: int) -> bytes:
    messages = []
    for i in range(n):
        event = ("Debug Ping", "Order Completed", "Page Scrolled")[i % 3]
        messages.append(
            {
                "type": "track",
                "userId": f"u{i}",
                "event": event,
                "messageId": f"m{i}",
                "properties": {"email": "x@example.com", "pad": "p" * pad},
            }
        )
    return json.dumps({"batch": messages}).encode()


FILTERS = {
    "crm": FilterSet(
        [
            drop('event = "Debug Ping"'),
            sample('event = "Page Scrolled"', 50),
            drop_fields(properties=["email"]),
        ]
    )
}
NOW = datetime(2026, 11, 25, 12, 0, tzinfo=UTC)


def test_parsing_applies_the_filters_per_destination() -> None:
    _, rows = parse_request(
        _batch(3, 1),
        source=KEYS.find("wk"),
        keys=KEYS,
        type_=None,
        received_at=NOW,
        filters=FILTERS,
    )
    assert [r.message_id for r in rows] == ["m0", "m1", "m2"]
    ping, order, scrolled = rows
    assert ping.destinations == ("other",)
    assert ping.shaped == (("crm", None, 'filters[0] drop, if event = "Debug Ping"'),)
    assert order.destinations == ("other",)
    [(name, body, filtered)] = order.shaped
    assert name == "crm"
    assert filtered is None
    assert body is not None
    assert "email" not in json.loads(body)["properties"]
    assert "email" in json.loads(order.body)["properties"]  # the message's own body
    sent = point("m2") * 100 < 50
    assert (scrolled.shaped[0][2] is None) is sent


def test_a_parser_process_shapes_exactly_as_the_daemon() -> None:
    """The filters cross to a parser process pickled (as configured) and are compiled
    again there; a large batch comes out the same as parsed in the daemon."""
    data = _batch(60, 200)
    assert len(data) > 8192
    # What the pool sends a parser process: the set-up, pickled.
    setup = pickle.loads(pickle.dumps({"filters": FILTERS}))  # noqa: S301
    child = ChildParser([("wk", "web", ("crm", "other"))], setup["filters"])
    answer = pickle.loads(pickle.dumps(child(data, "web", None, NOW.timestamp())))  # noqa: S301
    _, from_process = from_child(answer)
    source = KEYS.find("wk")
    _, here = parse_request(
        data, source=source, keys=KEYS, type_=None, received_at=NOW, filters=FILTERS
    )
    assert from_process == here
    assert {r.shaped[0][2] is None for r in here if r.event == "Order Completed"} == {True}
    assert all(r.shaped[0][2] is not None for r in here if r.event == "Debug Ping")
