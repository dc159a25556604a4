"""efd.config for broker destinations (docs/brokers.md#keys): what loads, the targets it
gives, and every refusal named by its full key path, all in one pass."""

from __future__ import annotations

import os
import textwrap
from pathlib import Path

import pytest

from efd import config
from efd.brokers.targets import AMQP, MQTT, NATS, REDIS_STREAMS

SOURCE = '[[sources]]\nname = "web"\nwrite_key = "wk"\ndestinations = ["bus"]\n'


@pytest.fixture(autouse=True)
def _no_efd_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    for key in list(os.environ):
        if key.startswith("EFD_"):
            monkeypatch.delenv(key)


def load(tmp_path: Path, text: str) -> config.Settings:
    path = tmp_path / "efd.toml"
    path.write_text(SOURCE + textwrap.dedent(text))
    return config.load(path)


def problems_of(tmp_path: Path, text: str) -> list[str]:
    with pytest.raises(config.ConfigError) as caught:
        load(tmp_path, text)
    return caught.value.problems


def test_each_kind_loads_with_its_keys(tmp_path: Path) -> None:
    settings = load(
        tmp_path,
        """\
        [[destinations]]
        name = "bus"
        type = "amqp"
        shared_secret = "s3cret"
        [[destinations.hooks]]
        url = "amqp://guest:guest@127.0.0.1:5672/%2f"
        exchange = "events"
        routing_key = "efd.{{type}}"
        headers = { "X-Team" = "data" }
        max_per_second = 50
        [[destinations.hooks]]
        url = "amqp://127.0.0.1:5673/"
        routing_key = "efd"

        [[destinations]]
        name = "js"
        type = "nats"
        [[destinations.hooks]]
        url = "nats://127.0.0.1:4222"
        subject = "events.{{type}}"

        [[destinations]]
        name = "rs"
        type = "redis_streams"
        [[destinations.hooks]]
        url = "redis://:pw@127.0.0.1:6379/2"
        stream = "events"
        maxlen = 1000

        [[destinations]]
        name = "mq"
        type = "mqtt"
        [[destinations.hooks]]
        url = "mqtt://127.0.0.1"
        topic = "events/{{type}}"
        qos = 2
        """,
    )
    targets = settings.broker_targets()
    assert sorted(targets) == ["bus", "js", "mq", "rs"]
    amqp = targets["bus"]["amqp://guest:guest@127.0.0.1:5672/%2f"]
    assert (amqp.kind, amqp.exchange, amqp.name.source) == (AMQP, "events", "efd.{{type}}")
    assert amqp.broker.vhost == "/"
    assert targets["bus"]["amqp://127.0.0.1:5673/"].exchange == ""
    assert targets["js"]["nats://127.0.0.1:4222"].kind == NATS
    redis = targets["rs"]["redis://:pw@127.0.0.1:6379/2"]
    assert (redis.kind, redis.maxlen, redis.broker.database) == (REDIS_STREAMS, 1000, 2)
    mqtt = targets["mq"]["mqtt://127.0.0.1"]
    assert (mqtt.kind, mqtt.qos) == (MQTT, 2)
    bus = settings.destination("bus")
    route = bus.route("efd/1.0")
    assert route.hooks[0] == ("amqp://guest:guest@127.0.0.1:5672/%2f", {"X-Team": "data"})
    assert route.labels["amqp://guest:guest@127.0.0.1:5672/%2f"] == (
        "amqp://***@127.0.0.1:5672/%2f"
    )
    assert [b.url for b in bus.buckets()] == ["amqp://guest:guest@127.0.0.1:5672/%2f"]
    assert settings.destination("js").broker
    assert "guest:guest" not in repr(amqp)


def test_a_webhooks_destination_has_no_targets(tmp_path: Path) -> None:
    settings = load(
        tmp_path,
        """\
        [[destinations]]
        name = "bus"
        [[destinations.hooks]]
        url = "https://example.com/hook"
        """,
    )
    assert settings.broker_targets() == {}
    assert not settings.destination("bus").broker


def test_every_problem_is_named_by_its_path_at_once(tmp_path: Path) -> None:
    problems = problems_of(
        tmp_path,
        """\
        [[destinations]]
        name = "bus"
        type = "amqp"
        [[destinations.hooks]]
        url = "amqp://127.0.0.1/%2f"
        routing_key = "efd.{{type}}"
        [[destinations.hooks]]
        url = "amqp://127.0.0.1/%2f?heartbeat=5"
        routing_key = "efd.{{type"
        subject = "events"
        exchange = "no spaces"
        [[destinations.hooks]]
        url = "https://example.com/hook"
        qos = 3

        [[destinations]]
        name = "js"
        type = "nats"
        [[destinations.hooks]]
        url = "nats://127.0.0.1:4222"
        headers = { "Nats-Msg-Id" = "mine" }

        [[destinations]]
        name = "rs"
        type = "redis_streams"
        [[destinations.hooks]]
        url = "redis://127.0.0.1/x"
        stream = "a b"
        maxlen = 0
        headers = { "Body" = "x" }

        [[destinations]]
        name = "mq"
        type = "mqtt"
        [[destinations.hooks]]
        url = "mqtt://127.0.0.1"
        topic = "events/#"
        qos = 0
        typo = 1

        [[destinations]]
        name = "none"
        type = "mqtt"
        """,
    )
    assert problems == [
        "destinations[0].hooks[1].url: takes no query or fragment; the hook's settings are "
        "its keys, and TLS follows the scheme",
        "destinations[0].hooks[1].exchange: an exchange's name is at most 127 letters, digits, "
        '-, _, . and : ("" is the default exchange)',
        "destinations[0].hooks[1].routing_key: { and } stand only in {{field}} templates "
        "(a {{ without its }})",
        "destinations[0].hooks[1].subject: not a key of a amqp hook (its keys: url, exchange, "
        "routing_key)",
        "destinations[0].hooks[2].url: must be a amqp:// or amqps:// URL",
        "destinations[0].hooks[2].routing_key: required for a amqp hook",
        "destinations[0].hooks[2].qos: not a key of a amqp hook (its keys: url, exchange, "
        "routing_key)",
        "destinations[1].hooks[0].headers: 'Nats-Msg-Id': the broker's header mechanism "
        "spends it on efd's own",
        "destinations[1].hooks[0].subject: required for a nats hook",
        "destinations[2].hooks[0].url: the path is the database's number, as in "
        "redis://host:6379/0",
        "destinations[2].hooks[0].headers: 'Body': the broker's header mechanism spends it "
        "on efd's own",
        "destinations[2].hooks[0].stream: a stream key may not hold spaces",
        "destinations[2].hooks[0].maxlen: must be at least 1 (leave it out to keep every entry)",
        "destinations[3].hooks[0].topic: # is a wildcard, which a topic published to may not hold",
        "destinations[3].hooks[0].qos: must be 1 (delivered on the broker's PUBACK) or 2 (on "
        "its PUBCOMP); 0 has no acknowledgement",
        "destinations[3].hooks[0].typo: unknown key",
        "destinations[4].hooks: a mqtt destination needs at least 1 hook",
    ]


def test_a_broker_hook_is_no_webhook_and_the_reverse(tmp_path: Path) -> None:
    problems = problems_of(
        tmp_path,
        """\
        [[destinations]]
        name = "bus"
        [[destinations.hooks]]
        url = "amqp://127.0.0.1/"
        routing_key = "efd"

        [[destinations]]
        name = "js"
        type = "nats"
        [[destinations.actions]]
        name = "a"
        trigger = 'type = "track"'
        url = "https://example.com/"
        [[destinations.hooks]]
        url = "nats://127.0.0.1"
        subject = "efd"
        """,
    )
    assert problems[0].startswith("destinations[0].hooks[0].url: ")
    assert problems[1:] == [
        "destinations[0].hooks[0].routing_key: unknown key",
        'destinations[1].actions: only a destination of type = "actions" has actions',
    ]


def test_client_certificates_go_over_the_kinds_tls_scheme(tmp_path: Path) -> None:
    cert = tmp_path / "client.pem"
    cert.write_text("not a certificate")
    problems = problems_of(
        tmp_path,
        f"""\
        [[destinations]]
        name = "bus"
        type = "redis_streams"
        [[destinations.hooks]]
        url = "redis://127.0.0.1"
        stream = "events"
        client_cert = "{cert}"
        """,
    )
    assert problems == [
        "destinations[0].hooks[0].client_cert: a client certificate is presented over "
        "rediss:// only"
    ]


def test_at_most_five_hooks(tmp_path: Path) -> None:
    hooks = '[[destinations.hooks]]\nurl = "nats://127.0.0.1"\nsubject = "efd"\n' * 6
    problems = problems_of(tmp_path, f'[[destinations]]\nname = "bus"\ntype = "nats"\n{hooks}')
    assert problems == ["destinations[0].hooks: at most 5 hooks"]


def test_the_commented_example_in_config_example_toml_loads(tmp_path: Path) -> None:
    text = (Path(__file__).resolve().parents[2] / "config.example.toml").read_text()
    start = text.index('# [[destinations]]\n# name = "bus"')
    end = text.index('# A Segment "Webhooks (Actions)" destination')
    block = "\n".join(
        line.removeprefix("#").removeprefix(" ") for line in text[start:end].splitlines()
    )
    settings = load(tmp_path, block)
    [target] = settings.broker_targets()["bus"].values()
    assert (target.kind, target.exchange, target.name.source) == (
        AMQP,
        "amq.topic",
        "efd.{{type}}",
    )
