"""Routing to an actions destination (docs/actions.md#how-actions-are-delivered): which
actions get a delivery, its body bytes and URL, the failed and filtered rows (pure: what
ingestion hands the store)."""

from __future__ import annotations

import json
import pickle
from datetime import UTC, datetime
from typing import Any

from efd import config
from efd.records import failed_at_routing
from efd.segment.payload import ChildParser, WriteKeys, from_child, parse_request
from efd.segment.routing import NO_TRIGGER_MATCHED

ORDERS = {
    "name": "orders",
    "trigger": 'type = "track" and event = "Order Completed"',
    "url": "https://crm.example.com/orders/{{properties.order_id}}?u={{userId}}",
    "method": "PUT",
    "data": {
        "order_id": {"@path": "$.properties.order_id"},
        "email": {"@case": {"operator": "lower", "value": {"@path": "$.properties.email"}}},
    },
}
FORM = {
    "name": "form",
    "trigger": 'type = "track"',
    "url": "https://crm.example.com/f",
    "content_type": "application/x-www-form-urlencoded",
    "data": {"name": {"@path": "$.properties.name"}, "n": {"@path": "$.properties.n"}},
}
IDENTIFY = {"name": "people", "trigger": 'type = "identify"', "url": "https://crm.example.com/p"}


def settings(*actions: dict[str, Any], **destination: Any) -> config.Settings:
    return config.load(
        None,
        sources=[{"name": "web", "write_key": "wk", "destinations": ["crm", "plain"]}],
        destinations=[
            {"name": "crm", "type": "actions", "actions": list(actions), **destination},
            {"name": "plain", "hooks": [{"url": "https://h.example/"}]},
        ],
    )


class Source:
    name = "web"
    destinations = ("crm", "plain")


def route(conf: config.Settings, message: dict[str, Any], type_: str = "track") -> Any:
    _, [row] = parse_request(
        json.dumps(message).encode(),
        source=Source(),
        keys=WriteKeys({}),
        type_=type_,
        received_at=datetime(2026, 12, 3, tzinfo=UTC),
        filters=conf.filter_sets(),
        actions=conf.action_sets(),
    )
    return row


ORDER = {
    "userId": "u 1",
    "event": "Order Completed",
    "messageId": "m1",
    "properties": {"order_id": "o/17", "email": "Ann@X.COM", "name": "Ann Lee", "n": 19.5},
}


def test_each_matching_action_gets_its_own_delivery_with_body_bytes_and_url() -> None:
    row = route(settings(ORDERS, FORM, IDENTIFY), ORDER)
    assert row.destinations == ("plain",)  # the webhooks destination beside it is untouched
    assert row.shaped == ()
    assert row.mapped == (
        (
            "crm/orders",
            '{"order_id":"o/17","email":"ann@x.com"}',
            "https://crm.example.com/orders/o%2F17?u=u%201",
            None,
        ),
        # A URL without templates is the route's hook: not stored again.
        ("crm/form", "name=Ann+Lee&n=19.5", None, None),
    )


def test_the_default_data_is_the_whole_message_as_stored() -> None:
    row = route(settings({**IDENTIFY, "trigger": 'type = "track"'}), ORDER)
    [(name, body, url, error)] = row.mapped
    assert (name, url, error) == ("crm/people", None, None)
    assert body == row.body  # the classic webhook body, byte for byte


def test_a_message_no_trigger_matches_gets_one_filtered_row_under_the_destination() -> None:
    row = route(settings(ORDERS, IDENTIFY), {**ORDER, "event": "Viewed"})
    assert row.mapped == ()
    assert row.shaped == (("crm", None, NO_TRIGGER_MATCHED),)


def test_a_mapping_that_fails_fails_that_action_alone() -> None:
    broken = {**FORM, "name": "broken", "data": {"x": {"@path": {"@path": "$.properties.n"}}}}
    row = route(settings(broken, ORDERS), ORDER)
    [(name, body, url, error), ok] = row.mapped
    assert (name, body, url) == ("crm/broken", None, None)
    assert error is not None
    assert error.startswith("mapping: data.x.@path")
    assert failed_at_routing("failed", 0, error)
    assert ok[0] == "crm/orders"
    assert ok[3] is None


def test_a_form_body_of_a_non_object_fails_with_the_reason() -> None:
    array = {**FORM, "data": {"@path": "$.properties.list"}}
    row = route(settings(array), {**ORDER, "properties": {"list": [1]}})
    [(_, _, _, error)] = row.mapped
    assert error == (
        "request: data: a form body is made of an object's keys, and the mapped value is an array"
    )


def test_a_url_segment_a_value_makes_dot_dot_fails() -> None:
    row = route(settings(ORDERS), {**ORDER, "properties": {"order_id": ".."}})
    [(_, _, _, error)] = row.mapped
    assert error is not None
    assert error.startswith("request: url: ")


def test_destination_filters_run_first() -> None:
    drop = [{"if": 'event = "Order Completed"', "action": "drop"}]
    row = route(settings(ORDERS, filters=drop), ORDER)
    assert row.mapped == ()
    assert row.shaped == (("crm", None, 'filters[0] drop, if event = "Order Completed"'),)
    strip = [{"if": "all", "action": "drop_fields", "fields": {"properties": ["email"]}}]
    [(_, body, _, _)] = route(settings(ORDERS, filters=strip), ORDER).mapped
    assert json.loads(body) == {"order_id": "o/17"}  # the mapping saw the filtered message


def test_the_integrations_map_decides_by_the_destinations_name() -> None:
    row = route(settings(ORDERS), {**ORDER, "integrations": {"crm": False}})
    assert (row.mapped, row.shaped, row.destinations) == ((), (), ("plain",))
    row = route(settings(ORDERS), {**ORDER, "integrations": {"All": False, "crm": True}})
    assert [m[0] for m in row.mapped] == ["crm/orders"]


def test_a_parser_process_routes_the_same() -> None:
    conf = settings(ORDERS, FORM)
    child = ChildParser(
        [("wk", "web", ("crm", "plain"))],
        conf.filter_sets(),
        pickle.loads(pickle.dumps(conf.action_sets())),  # noqa: S301 (its own bytes)
    )
    answer = child(json.dumps(ORDER).encode(), "web", "track", 1_796_256_000.0)
    _, [row] = from_child(answer)
    assert row.mapped == route(conf, ORDER).mapped
