"""Broker destinations end to end: the real daemon, configured with a destination of each
broker kind, takes messages over HTTP and publishes them to the real servers on this
machine (RabbitMQ, NATS with JetStream, Redis, Mosquitto), where a consumer written here
reads them back with their bodies and headers. docs/brokers.md."""

from __future__ import annotations

import asyncio
import json
import secrets
import subprocess
import sys
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import aiomqtt
import aiormq
import nats
import pytest
import redis.asyncio as aioredis

from efd import config
from efd.segment import webhooks
from tests.conftest import (
    ROOT,
    SECRET,
    DaemonFactory,
    ReceiverFactory,
    eventually,
    post,
    settings_dict,
    sql,
    write_toml,
)
from tests.integration.test_brokers import Proxy

PORTS = {"amqp": 5672, "nats": 4222, "redis_streams": 6379, "mqtt": 1883}
COUNT = 1000
BATCH = 100


async def _require(kind: str) -> None:
    port = PORTS[kind]
    try:
        _, writer = await asyncio.wait_for(asyncio.open_connection("127.0.0.1", port), 5)
    except (OSError, TimeoutError):
        pytest.fail(f"no {kind} broker answers on 127.0.0.1:{port}: start it, then run again")
    writer.close()
    await writer.wait_closed()


def _broker_settings(db_url: str, kind: str, hooks: list[dict[str, Any]]) -> dict[str, Any]:
    settings = settings_dict(db_url)
    settings["destinations"] = [
        {"name": "hooks", "type": kind, "shared_secret": SECRET, "hooks": hooks}
    ]
    return settings


async def _ingest(port: int, count: int = COUNT, first: int = 0) -> None:
    """Track messages `first` to `count` - 1 over HTTP, ten users' worth, in batches."""
    for start in range(first, count, BATCH):
        batch = [
            {
                "type": "track",
                "messageId": f"m-{i}",
                "userId": f"u-{i % 10}",
                "event": "Order Completed",
                "properties": {"n": i},
            }
            for i in range(start, min(count, start + BATCH))
        ]
        status, answer = await post(port, "/v1/batch", {"batch": batch})
        assert (status, answer) == (200, {"success": True})


def _delivered(db_url: str) -> int:
    [(count,)] = sql(db_url, "SELECT count(*) FROM deliveries WHERE status = 'delivered'")
    return int(count)


def _check(got: list[tuple[bytes, dict[str, str]]], count: int = COUNT) -> None:
    """Each message once, its body a webhook's, its headers a webhook's (in lower case),
    and its X-Signature verifying over the body bytes."""
    by_id: dict[str, tuple[bytes, dict[str, str]]] = {}
    for body, headers in got:
        webhook_id = headers["webhook-id"]
        assert webhook_id not in by_id, f"{webhook_id} arrived twice"
        by_id[webhook_id] = (body, headers)
    assert len(by_id) == count
    numbers = set()
    for body, headers in by_id.values():
        assert webhooks.verify(SECRET, body, headers["x-signature"])
        assert headers["user-agent"] == "efd/1.0"
        message = json.loads(body)
        assert message["type"] == "track"
        assert message["event"] == "Order Completed"
        assert message["messageId"] == f"m-{message['properties']['n']}"
        numbers.add(message["properties"]["n"])
    assert numbers == set(range(count))


async def _retried_with(db_url: str, error_class: str, reason: str) -> None:
    """The one message's delivery is retried (still pending after several attempts), each
    attempt naming the broker's reason, and no credentials."""

    def attempts() -> list[Any]:
        rows = sql(db_url, "SELECT error_class, error, hook_url FROM attempts ORDER BY id")
        return rows if len(rows) >= 3 else []

    rows = await eventually(attempts, timeout=30)
    for got_class, error, hook in rows:
        assert got_class == error_class, rows
        assert reason in error, rows
        assert "wrong-one" not in error, rows
        assert "wrong-one" not in hook, rows
    [(status, last_error)] = sql(db_url, "SELECT status, last_error FROM deliveries")
    assert status == "pending"
    assert reason in last_error


# -- RabbitMQ ------------------------------------------------------------------------------


@pytest.fixture
async def rabbit() -> AsyncIterator[aiormq.abc.AbstractChannel]:
    await _require("amqp")
    connection = await aiormq.connect("amqp://guest:guest@127.0.0.1:5672/")
    channel = await connection.channel()
    yield channel
    await connection.close()


async def test_amqp_destination_delivers_each_message_once(
    db_url: str, daemon_factory: DaemonFactory, rabbit: aiormq.abc.AbstractChannel
) -> None:
    prefix = f"efd-test-{secrets.token_hex(6)}"
    declared = await rabbit.queue_declare(prefix, auto_delete=True)
    assert declared.queue == prefix
    await rabbit.queue_bind(prefix, "amq.topic", routing_key=f"{prefix}.track")
    daemon = await daemon_factory(
        _broker_settings(
            db_url,
            "amqp",
            [
                {
                    "url": "amqp://guest:guest@127.0.0.1:5672/%2f",
                    "exchange": "amq.topic",
                    "routing_key": f"{prefix}.{{{{type}}}}",
                    "headers": {"X-Team": "data"},
                }
            ],
        )
    )
    await _ingest(daemon.port)
    await eventually(lambda: _delivered(db_url) == COUNT, timeout=60)
    got: list[tuple[bytes, dict[str, str]]] = []
    while True:
        message = await rabbit.basic_get(prefix, no_ack=True)
        if message.delivery_tag is None:  # Basic.GetEmpty
            break
        properties = message.header.properties
        headers = {str(k): str(v) for k, v in (properties.headers or {}).items()}
        assert properties.content_type == "application/json"
        assert properties.message_id == headers["webhook-id"]
        assert headers["x-team"] == "data"
        got.append((message.body, headers))
    _check(got)
    [(answer,)] = sql(db_url, "SELECT DISTINCT response_head FROM attempts")
    assert answer == "basic.ack (publisher confirm)"


async def test_amqp_unroutable_is_retried_with_the_brokers_reason(
    sqlite_url: str, daemon_factory: DaemonFactory, rabbit: aiormq.abc.AbstractChannel
) -> None:
    prefix = f"efd-test-{secrets.token_hex(6)}"
    daemon = await daemon_factory(
        _broker_settings(
            sqlite_url,
            "amqp",
            [
                {
                    "url": "amqp://guest:guest@127.0.0.1:5672/",
                    "exchange": "amq.topic",
                    "routing_key": f"{prefix}.{{{{type}}}}",
                }
            ],
        )
    )
    await _ingest(daemon.port, 1)
    await _retried_with(sqlite_url, "refused", "312 NO_ROUTE")
    [(hook,)] = sql(sqlite_url, "SELECT DISTINCT hook_url FROM attempts")
    assert hook == "amqp://***@127.0.0.1:5672/"


async def test_a_second_broker_is_published_to_when_the_first_refuses(
    sqlite_url: str, daemon_factory: DaemonFactory, rabbit: aiormq.abc.AbstractChannel
) -> None:
    queue = f"efd-test-{secrets.token_hex(6)}"
    await rabbit.queue_declare(queue, auto_delete=True)
    daemon = await daemon_factory(
        _broker_settings(
            sqlite_url,
            "amqp",
            [
                {"url": "amqp://127.0.0.1:5672/", "exchange": "amq.topic", "routing_key": queue},
                {"url": "amqp://guest:guest@127.0.0.1:5672/%2f", "routing_key": queue},
            ],
        )
    )
    await _ingest(daemon.port, 1)
    await eventually(lambda: _delivered(sqlite_url) == 1)
    rows = sql(sqlite_url, "SELECT hook_url, outcome, error_class FROM attempts ORDER BY id")
    assert rows == [
        ("amqp://127.0.0.1:5672/", "retry", "refused"),
        ("amqp://***@127.0.0.1:5672/%2f", "success", None),
    ]
    message = await rabbit.basic_get(queue, no_ack=True)
    assert message.delivery_tag is not None
    again = await rabbit.basic_get(queue, no_ack=True)
    assert again.delivery_tag is None  # one copy: the round stopped at the first success


# -- NATS JetStream ------------------------------------------------------------------------


@pytest.fixture
async def jetstream() -> AsyncIterator[tuple[Any, str]]:
    await _require("nats")
    client = await nats.connect("nats://127.0.0.1:4222")
    js = client.jetstream()
    stream = f"EFDTEST{secrets.token_hex(4).upper()}"
    await js.add_stream(name=stream, subjects=[f"{stream.lower()}.>"])
    yield js, stream
    await js.delete_stream(stream)
    await client.close()


async def test_nats_destination_delivers_each_message_once(
    sqlite_url: str, daemon_factory: DaemonFactory, jetstream: tuple[Any, str]
) -> None:
    js, stream = jetstream
    daemon = await daemon_factory(
        _broker_settings(
            sqlite_url,
            "nats",
            [{"url": "nats://127.0.0.1:4222", "subject": f"{stream.lower()}.{{{{type}}}}"}],
        )
    )
    await _ingest(daemon.port)
    await eventually(lambda: _delivered(sqlite_url) == COUNT, timeout=60)
    subscription = await js.pull_subscribe(f"{stream.lower()}.>", durable=None, stream=stream)
    got: list[tuple[bytes, dict[str, str]]] = []
    while True:
        try:
            batch = await subscription.fetch(500, timeout=1)
        except TimeoutError:
            break
        for message in batch:
            assert message.subject == f"{stream.lower()}.track"
            assert message.headers["Nats-Msg-Id"] == message.headers["webhook-id"]
            assert message.headers["content-type"] == "application/json"
            got.append((message.data, dict(message.headers)))
            await message.ack()
    _check(got)


async def test_nats_subject_without_a_stream_is_retried_with_the_reason(
    sqlite_url: str, daemon_factory: DaemonFactory
) -> None:
    await _require("nats")
    subject = f"efd-test-{secrets.token_hex(6)}"
    daemon = await daemon_factory(
        _broker_settings(
            sqlite_url, "nats", [{"url": "nats://127.0.0.1:4222", "subject": f"{subject}.x"}]
        )
    )
    await _ingest(daemon.port, 1)
    await _retried_with(sqlite_url, "refused", f"no stream takes the subject '{subject}.x'")


# -- Redis Streams -------------------------------------------------------------------------


@pytest.fixture
async def redis_client() -> AsyncIterator[aioredis.Redis]:
    await _require("redis_streams")
    client = aioredis.Redis(host="127.0.0.1", port=6379)
    yield client
    await client.aclose()


@pytest.mark.parametrize("sender_processes", [0, 1])
async def test_redis_destination_delivers_each_message_once(
    sqlite_url: str,
    daemon_factory: DaemonFactory,
    redis_client: aioredis.Redis,
    sender_processes: int,
) -> None:
    prefix = f"efd-test-{secrets.token_hex(6)}"
    settings = _broker_settings(
        sqlite_url,
        "redis_streams",
        [{"url": "redis://127.0.0.1:6379/0", "stream": f"{prefix}:{{{{type}}}}"}],
    )
    # In a sender process too: the targets travel to it with the routes.
    settings["delivery"]["sender_processes"] = sender_processes
    daemon = await daemon_factory(settings)
    try:
        await _ingest(daemon.port)
        await eventually(lambda: _delivered(sqlite_url) == COUNT, timeout=60)
        entries: list[tuple[bytes, dict[bytes, bytes]]] = await redis_client.xrange(  # type: ignore[assignment]
            f"{prefix}:track"
        )
    finally:
        await redis_client.delete(f"{prefix}:track")
    got = []
    for _id, fields in entries:
        assert next(iter(fields)) == b"body"
        headers = {k.decode(): v.decode() for k, v in fields.items() if k != b"body"}
        assert headers["content-type"] == "application/json"
        got.append((fields[b"body"], headers))
    _check(got)
    answers = sql(sqlite_url, "SELECT response_head FROM attempts")
    assert all(answer.startswith("XADD added the entry ") for (answer,) in answers)


async def test_redis_ordering_per_user_holds_across_refusals(
    db_url: str, daemon_factory: DaemonFactory, redis_client: aioredis.Redis
) -> None:
    key = f"efd-test-{secrets.token_hex(6)}"
    # A key holding a string: every XADD is refused (WRONGTYPE) until the key is deleted.
    await redis_client.set(key, "not a stream")
    settings = _broker_settings(
        db_url, "redis_streams", [{"url": "redis://127.0.0.1:6379/0", "stream": key}]
    )
    settings["destinations"][0]["ordering"] = "per_user"
    daemon = await daemon_factory(settings)
    count = 200
    try:
        await _ingest(daemon.port, count)

        def refused() -> bool:
            query = "SELECT count(*) FROM attempts WHERE error_class = 'refused'"
            return int(sql(db_url, query)[0][0]) >= 20

        await eventually(refused, timeout=30)
        await redis_client.delete(key)
        await eventually(lambda: _delivered(db_url) == count, timeout=60)
        entries: list[tuple[bytes, dict[bytes, bytes]]] = await redis_client.xrange(key)  # type: ignore[assignment]
    finally:
        await redis_client.delete(key)
    by_user: dict[str, list[int]] = {}
    for _id, fields in entries:
        message = json.loads(fields[b"body"])
        by_user.setdefault(message["userId"], []).append(message["properties"]["n"])
    assert sorted(by_user) == [f"u-{i}" for i in range(10)]
    for user, numbers in by_user.items():
        assert numbers == list(range(int(user.removeprefix("u-")), count, 10)), user


class Relay(Proxy):
    """A TCP relay to a broker that a test can stop (every connection aborted, none taken)
    and start again on the same port: to efd, the broker went away and came back, while the
    server itself, which other tests use, keeps running with what it stored."""

    async def start(self) -> None:
        self._server = await asyncio.start_server(self._relay, "127.0.0.1", self.port)

    async def stop(self) -> None:
        if self._server is not None:
            self._server.close()
            self._server = None
        self.cut()


async def test_redis_away_for_10_s_loses_nothing_and_holds_up_no_other_destination(
    sqlite_url: str,
    daemon_factory: DaemonFactory,
    redis_client: aioredis.Redis,
    receiver_factory: ReceiverFactory,
) -> None:
    key = f"efd-test-{secrets.token_hex(6)}"
    relay = Relay(6379)
    await relay.start()
    receiver = await receiver_factory()
    settings = _broker_settings(
        sqlite_url,
        "redis_streams",
        [{"url": f"redis://127.0.0.1:{relay.port}/0", "stream": key}],
    )
    settings["destinations"].append(
        {"name": "web", "type": "webhooks", "hooks": [{"url": receiver.url}]}
    )
    settings["sources"][0]["destinations"] = ["hooks", "web"]
    daemon = await daemon_factory(settings)

    def delivered(destination: str) -> int:
        query = "SELECT count(*) FROM deliveries WHERE status = 'delivered' AND destination = :d"
        return int(sql(sqlite_url, query, d=destination)[0][0])

    try:
        half = COUNT // 2
        await _ingest(daemon.port, half)
        await eventually(lambda: delivered("hooks") >= half // 2, timeout=60)
        await relay.stop()
        try:
            # While the broker is away, the webhook destination takes the next messages.
            await _ingest(daemon.port, COUNT, half)
            await eventually(lambda: delivered("web") == COUNT, timeout=10)
            stalled = delivered("hooks")
            assert stalled < COUNT
            await asyncio.sleep(10)
            assert delivered("hooks") == stalled
        finally:
            await relay.start()
        await eventually(lambda: delivered("hooks") == COUNT, timeout=90)
        entries: list[tuple[bytes, dict[bytes, bytes]]] = await redis_client.xrange(key)  # type: ignore[assignment]
    finally:
        await relay.stop()
        await redis_client.delete(key)
    numbers = [json.loads(fields[b"body"])["properties"]["n"] for _id, fields in entries]
    assert set(numbers) == set(range(COUNT))
    # Duplicates only of publishes in flight when the broker went away (at most the hook's
    # concurrency).
    assert len(numbers) - COUNT <= settings["delivery"].get("max_per_hook", 64)
    classes = {
        row[0]
        for row in sql(sqlite_url, "SELECT DISTINCT error_class FROM attempts")
        if row[0] is not None
    }
    assert classes, "no attempt failed while the broker was away"
    assert classes <= {"connect", "reset", "timeout"}, classes


@pytest.mark.parametrize("sender_processes", [0, 1])
async def test_a_reload_moves_a_broker_hook_to_its_new_stream(
    sqlite_url: str,
    daemon_factory: DaemonFactory,
    redis_client: aioredis.Redis,
    sender_processes: int,
) -> None:
    before, after = (f"efd-test-{secrets.token_hex(6)}" for _ in range(2))
    url = "redis://127.0.0.1:6379/0"
    settings = _broker_settings(sqlite_url, "redis_streams", [{"url": url, "stream": before}])
    settings["delivery"]["sender_processes"] = sender_processes
    daemon = await daemon_factory(settings)
    try:
        await _ingest(daemon.port, 10)
        await eventually(lambda: _delivered(sqlite_url) == 10)
        settings["destinations"][0]["hooks"][0]["stream"] = after
        await daemon.reload(config.load(None, **settings))
        await _ingest(daemon.port, 20, 10)
        await eventually(lambda: _delivered(sqlite_url) == 20)
        assert await redis_client.xlen(before) == 10
        assert await redis_client.xlen(after) == 10
    finally:
        await redis_client.delete(before, after)


async def test_redis_wrong_password_is_retried_with_the_reason(
    sqlite_url: str, daemon_factory: DaemonFactory, redis_client: aioredis.Redis
) -> None:
    user = f"efd-test-{secrets.token_hex(4)}"
    await redis_client.acl_setuser(
        user, enabled=True, passwords=["+the-right-one"], keys=["*"], commands=["+@all"]
    )
    try:
        daemon = await daemon_factory(
            _broker_settings(
                sqlite_url,
                "redis_streams",
                [{"url": f"redis://{user}:wrong-one@127.0.0.1:6379/0", "stream": user}],
            )
        )
        await _ingest(daemon.port, 1)
        await _retried_with(sqlite_url, "auth", "invalid username-password pair")
    finally:
        await redis_client.acl_deluser(user)
        await redis_client.delete(user)


# -- MQTT ----------------------------------------------------------------------------------


async def test_mqtt_destination_delivers_each_message_once(
    sqlite_url: str, daemon_factory: DaemonFactory
) -> None:
    await _require("mqtt")
    prefix = f"efd-test-{secrets.token_hex(6)}"
    got: list[tuple[bytes, dict[str, str]]] = []
    async with aiomqtt.Client("127.0.0.1", 1883, protocol=aiomqtt.ProtocolVersion.V5) as consumer:
        await consumer.subscribe(f"{prefix}/#", qos=1)

        async def consume() -> None:
            async for message in consumer.messages:
                assert message.topic.value == f"{prefix}/track"
                properties: Any = message.properties
                assert properties.ContentType == "application/json"
                headers = dict(properties.UserProperty)
                assert isinstance(message.payload, bytes)
                got.append((message.payload, headers))
                if len(got) == COUNT:
                    return

        consuming = asyncio.create_task(consume())
        daemon = await daemon_factory(
            _broker_settings(
                sqlite_url,
                "mqtt",
                [{"url": "mqtt://127.0.0.1:1883", "topic": f"{prefix}/{{{{type}}}}", "qos": 1}],
            )
        )
        await _ingest(daemon.port)
        await eventually(lambda: _delivered(sqlite_url) == COUNT, timeout=60)
        await asyncio.wait_for(consuming, 30)
    _check(got)


# -- configuration -------------------------------------------------------------------------


def test_serve_refuses_broker_hooks_naming_each_key(tmp_path: Path) -> None:
    settings = _broker_settings(
        f"sqlite:///{tmp_path / 'efd.db'}",
        "nats",
        [
            {"url": "nats://127.0.0.1:4222", "subject": "events.>"},
            {"url": "amqp://127.0.0.1/", "routing_key": "x"},
        ],
    )
    path = write_toml(tmp_path / "efd.toml", settings)
    result = subprocess.run(
        [sys.executable, "-m", "efd", "serve", "--config", str(path)],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=ROOT,
    )
    assert result.returncode == 2, result.stderr
    for problem in (
        "destinations[0].hooks[0].subject: ",
        "destinations[0].hooks[1].url: must be a nats:// or tls:// URL",
        "destinations[0].hooks[1].routing_key: not a key of a nats hook",
    ):
        assert problem in result.stderr
    with pytest.raises(config.ConfigError) as caught:
        config.load(path)
    assert len(caught.value.problems) == 4, caught.value.problems


# -- efd check-receiver --------------------------------------------------------------------


def _check_receiver(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "efd", "check-receiver", *args],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=ROOT,
    )


async def test_check_receiver_publishes_one_message_and_says_what_the_broker_answered(
    redis_client: aioredis.Redis,
) -> None:
    stream = f"efd-test-{secrets.token_hex(6)}"
    try:
        result = _check_receiver(
            "redis://127.0.0.1:6379/0", "--key", f"stream={stream}", "--secret", SECRET
        )
        entries: list[tuple[bytes, dict[bytes, bytes]]] = await redis_client.xrange(stream)  # type: ignore[assignment]
    finally:
        await redis_client.delete(stream)
    assert result.returncode == 0, result.stderr
    assert "the broker confirmed it: XADD added the entry " in result.stdout
    [(entry_id, fields)] = entries
    assert entry_id.decode() in result.stdout
    assert webhooks.verify(SECRET, fields[b"body"], fields[b"x-signature"].decode())


async def test_check_receiver_says_what_the_broker_refused(
    rabbit: aiormq.abc.AbstractChannel,
) -> None:
    result = _check_receiver(
        "amqp://guest:guest@127.0.0.1:5672/",
        "--key",
        "exchange=amq.topic",
        "--key",
        f"routing_key=efd-test-{secrets.token_hex(6)}",
    )
    assert result.returncode == 1, result.stderr
    assert "the broker did not confirm it (refused): unroutable: " in result.stdout
    assert "312 NO_ROUTE" in result.stdout
    assert "guest:guest" not in result.stdout
    missing = _check_receiver("amqp://127.0.0.1/", "--key", "subject=x")
    assert missing.returncode == 2
    assert "subject: not a key of a amqp hook" in missing.stderr
    assert "routing_key: required for a amqp hook" in missing.stderr
