"""The brokers' pure rules: hook URLs and keys, the templates of their names, and the headers
each broker carries."""

from __future__ import annotations

from typing import Any

import pytest

from efd.brokers import headers
from efd.brokers.links import backoff
from efd.brokers.targets import BrokerConfigError, parse_target
from efd.brokers.templates import TemplateError, compile_template


def problems(kind: str, url: Any, keys: dict[str, Any]) -> tuple[str, ...]:
    with pytest.raises(BrokerConfigError) as error:
        parse_target(kind, url, keys)
    return error.value.problems


# -- URLs and keys


def test_an_amqp_url_and_its_keys() -> None:
    target = parse_target(
        "amqp", "amqps://efd:s3cret@mq.example:5671/prod", {"routing_key": "efd.{{type}}"}
    )
    broker = target.broker
    assert (broker.tls, broker.host, broker.port, broker.vhost) == (
        True,
        "mq.example",
        5671,
        "prod",
    )
    assert (broker.username, broker.password) == ("efd", "s3cret")
    assert target.exchange == ""
    assert target.label == "amqps://***@mq.example:5671/prod"
    assert "s3cret" not in repr(target)
    assert "s3cret" not in repr(broker)
    assert parse_target("amqp", "amqp://h/%2f", {"routing_key": "k"}).broker.vhost == "/"
    assert parse_target("amqp", "amqp://h", {"routing_key": "k"}).broker.vhost == "/"
    assert parse_target("amqp", "amqp://h", {"routing_key": "k"}).broker.port == 5672


def test_default_ports_and_tls_schemes() -> None:
    cases = {
        ("nats", "nats://h", "subject"): (False, 4222),
        ("nats", "tls://h", "subject"): (True, 4222),
        ("redis_streams", "redis://h", "stream"): (False, 6379),
        ("redis_streams", "rediss://h", "stream"): (True, 6379),
        ("mqtt", "mqtt://h", "topic"): (False, 1883),
        ("mqtt", "mqtts://h", "topic"): (True, 8883),
    }
    for (kind, url, key), (tls, port) in cases.items():
        broker = parse_target(kind, url, {key: "x"}).broker
        assert (broker.tls, broker.port) == (tls, port), url


def test_every_problem_is_listed_by_key() -> None:
    assert problems("amqp", "http://h", {"exchange": 3, "subject": "x"}) == (
        "url: must be a amqp:// or amqps:// URL",
        "subject: not a key of a amqp hook (its keys: url, exchange, routing_key)",
        "routing_key: required for a amqp hook",
        "exchange: must be a string",
    )
    assert problems("redis_streams", "redis://h/x?a=1", {"stream": "s", "maxlen": 0}) == (
        "url: takes no query or fragment; the hook's settings are its keys, and TLS follows "
        "the scheme",
        "url: the path is the database's number, as in redis://host:6379/0",
        "maxlen: must be at least 1 (leave it out to keep every entry)",
    )
    assert problems("mqtt", "mqtt://h:99999", {"topic": "t", "qos": 0}) == (
        "url: has an invalid port",
        "qos: must be 1 (delivered on the broker's PUBACK) or 2 (on its PUBCOMP); 0 has no "
        "acknowledgement",
    )
    assert problems("nats", "nats://127.1", {"subject": "s"}) == (
        "url: the host 127.1 is a numeric IPv4 form other than a dotted quad, which is never "
        "connected to: write the address as four decimal numbers, a.b.c.d (no leading zeros)",
    )
    assert problems("nats", "nats://h/x", {"subject": "s"}) == ("url: a nats:// URL has no path",)
    assert problems("mqtt", "mqtt://h", {"topic": "t", "qos": True})[0].startswith("qos:")
    assert problems("amqp", "amqp://h", {"routing_key": "k", "exchange": "a b"}) == (
        'exchange: an exchange\'s name is at most 127 letters, digits, -, _, . and : ("" is '
        "the default exchange)",
    )
    assert problems("kafka", "kafka://h", {}) == (
        "type: must be one of amqp, nats, redis_streams, mqtt",
    )


def test_redis_credentials_and_database() -> None:
    broker = parse_target("redis_streams", "redis://:pw@h:6380/3", {"stream": "s"}).broker
    assert (broker.username, broker.password, broker.database) == (None, "pw", 3)
    acl = parse_target("redis_streams", "redis://u:pw@h/0", {"stream": "s"}).broker
    assert (acl.username, acl.password) == ("u", "pw")
    assert acl != broker  # connections are shared only by equal credentials


# -- templates


def test_literal_text_is_checked_at_load() -> None:
    def refused(kind: str, text: str) -> tuple[str, ...]:
        with pytest.raises(TemplateError) as error:
            compile_template(kind, text)
        return error.value.problems

    assert refused("nats", "events.*") == (
        "subject: * is a wildcard, which a subject published to may not hold",
    )
    assert refused("nats", "a..b") == (
        "subject: every token between '.'s must hold something (no '.' at either end or "
        "twice in a row)",
    )
    assert refused("nats", "a b") == ("subject: a subject may not hold spaces",)
    assert refused("nats", "$JS.API.x") == (
        "subject: a subject starting with $ is the broker's own",
    )
    assert refused("mqtt", "a/+/b") == (
        "topic: + is a wildcard, which a topic published to may not hold",
    )
    assert refused("mqtt", "a/\x00") == ("topic: may not hold control characters",)
    assert refused("amqp", "k" * 256) == ("routing_key: a routing key holds at most 255 bytes",)
    assert refused("redis_streams", "") == ("stream: must not be empty",)
    assert refused("amqp", "{{}}.x") == (
        "routing_key: {{}} names no field; write its path, as in {{type}}",
    )
    assert refused("amqp", "{{$.type}}") == (
        "routing_key: {{$.type}}: a template's path starts at the message, without $ (as in "
        "@template): {{type}}",
    )
    assert refused("amqp", "a{b") == (
        "routing_key: { and } stand only in {{field}} templates (a {{ without its }})",
    )
    # A template is a token: "a.{{type}}" has no empty token, whatever the value.
    assert compile_template("nats", "a.{{type}}").fields == ("{{type}}",)
    # Spaces are allowed in AMQP and MQTT literals.
    compile_template("mqtt", "home/living room/{{type}}")


@pytest.mark.parametrize(
    ("kind", "source", "value", "name"),
    [
        ("nats", "ev.{{event}}", "Order Completed", "ev.Order_Completed"),
        ("nats", "ev.{{event}}", "a.b*c>d\te", "ev.a_b_c_d_e"),
        ("mqtt", "ev/{{event}}", "a/b+c#d\x00e", "ev/a_b_c_d_e"),
        ("mqtt", "ev/{{event}}", "living room", "ev/living_room"),
        ("amqp", "ev.{{event}}", "a.b*c#d", "ev.a_b_c_d"),
        ("redis_streams", "ev:{{event}}", "a b:c", "ev:a_b:c"),
        ("nats", "ev.{{event}}", None, "ev._"),
        ("nats", "ev.{{event}}", "", "ev._"),
        ("nats", "ev.{{event}}", 19.5, "ev.19_5"),
        ("amqp", "ev.{{event}}", "é\ud800", "ev.é\ufffd"),
        ("mqtt", "ev/{{event}}", ["a", "b"], "ev/a,b"),
    ],
)
def test_values_are_made_safe_when_rendered(kind: str, source: str, value: Any, name: str) -> None:
    template = compile_template(kind, source)
    assert template.render({"event": value}) == name


def test_fields_are_read_as_templates_read_them() -> None:
    template = compile_template("nats", "{{type}}.{{properties.plan}}.{{userId}}")
    message = {"type": "track", "properties": {"plan": "pro"}, "userId": "u-1"}
    assert template.render(message) == "track.pro.u-1"
    assert template.render({"type": "identify"}) == "identify._._"


def test_a_rendered_name_too_long_is_refused() -> None:
    template = compile_template("amqp", "k.{{userId}}")
    assert len(template.render({"userId": "u" * 253})) == 255
    with pytest.raises(TemplateError) as error:
        template.render({"userId": "é" * 200})
    assert error.value.problems == (
        "routing_key: the routing key made for this message has 402 bytes, more than the 255 "
        "the broker takes",
    )


# -- headers

WEBHOOK = {
    "User-Agent": "efd/1.0",
    "Content-Type": "application/json",
    "webhook-id": "msg_abc",
    "X-Signature": "deadbeef",
}


def test_amqp_properties() -> None:
    properties = headers.amqp(WEBHOOK)
    assert properties.content_type == "application/json"
    assert properties.message_id == "msg_abc"
    assert properties.headers == {
        "user-agent": "efd/1.0",
        "webhook-id": "msg_abc",
        "x-signature": "deadbeef",
    }


def test_nats_headers_carry_the_msg_id() -> None:
    assert headers.nats(WEBHOOK) == {
        "user-agent": "efd/1.0",
        "content-type": "application/json",
        "webhook-id": "msg_abc",
        "x-signature": "deadbeef",
        "Nats-Msg-Id": "msg_abc",
    }
    with pytest.raises(headers.HeaderError):
        headers.nats({"nats-msg-id": "x"})
    with pytest.raises(headers.HeaderError):
        headers.nats({"X-A": "a\r\nb"})


def test_redis_fields_byte_by_byte() -> None:
    fields = headers.redis_fields(b'{"a":1}', WEBHOOK)
    assert list(fields.items()) == [
        (b"body", b'{"a":1}'),
        (b"user-agent", b"efd/1.0"),
        (b"content-type", b"application/json"),
        (b"webhook-id", b"msg_abc"),
        (b"x-signature", b"deadbeef"),
    ]
    with pytest.raises(headers.HeaderError):
        headers.redis_fields(b"", {"Body": "x"})
    with pytest.raises(headers.HeaderError):
        headers.redis_fields(b"", {"X-A": "1", "x-a": "2"})


def test_mqtt_properties() -> None:
    properties = headers.mqtt(WEBHOOK)
    assert properties.content_type == "application/json"
    assert properties.user_properties == (
        ("user-agent", "efd/1.0"),
        ("webhook-id", "msg_abc"),
        ("x-signature", "deadbeef"),
    )
    assert headers.reserved_names("redis_streams") == frozenset({"body"})


def test_reconnect_backoff_doubles_to_its_ceiling() -> None:
    assert [backoff(n) for n in (1, 2, 3, 7, 8, 100)] == [0.5, 1.0, 2.0, 30.0, 30.0, 30.0]
