"""The brokers' publishers against the real servers on this machine: RabbitMQ, NATS with
JetStream, Redis and Mosquitto, each read back by a consumer written here. A server that is
not running fails its tests with a message saying so (scripts/test starts them)."""

from __future__ import annotations

import asyncio
import json
import secrets
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import aiomqtt
import aiormq
import nats
import pytest
import redis.asyncio as aioredis

from efd.brokers.failures import PublishFailed
from efd.brokers.jetstream import JetStream
from efd.brokers.mqtt import Mqtt
from efd.brokers.publisher import Publisher, name_for
from efd.brokers.rabbitmq import RabbitMQ
from efd.brokers.redis_streams import RedisStreams
from efd.brokers.targets import Target, parse_target
from efd.delivery import netguard
from tests.conftest import free_port

LOOPBACK = netguard.parse_networks(["127.0.0.0/8"])
PORTS = {"amqp": 5672, "nats": 4222, "redis_streams": 6379, "mqtt": 1883}
COUNT = 1000


async def _require(kind: str) -> None:
    port = PORTS[kind]
    try:
        _, writer = await asyncio.wait_for(asyncio.open_connection("127.0.0.1", port), 5)
    except (OSError, TimeoutError):
        pytest.fail(f"no {kind} broker answers on 127.0.0.1:{port}: start it, then run again")
    writer.close()
    await writer.wait_closed()


def _headers(i: int) -> dict[str, str]:
    return {
        "User-Agent": "efd/1.0",
        "Content-Type": "application/json",
        "webhook-id": f"msg_{i:026d}",
        "X-Signature": f"sig{i}",
    }


def _body(i: int) -> bytes:
    return json.dumps({"type": "track", "event": "Order", "n": i}).encode()


def _check(got: list[tuple[bytes, dict[str, str]]]) -> None:
    """Every message once, with its body and its headers in lower case."""
    by_id: dict[str, tuple[bytes, dict[str, str]]] = {}
    for body, headers in got:
        webhook_id = headers["webhook-id"]
        assert webhook_id not in by_id, f"{webhook_id} arrived twice"
        by_id[webhook_id] = (body, headers)
    assert len(by_id) == COUNT
    for i in range(COUNT):
        body, headers = by_id[f"msg_{i:026d}"]
        assert body == _body(i)
        assert headers["x-signature"] == f"sig{i}"
        assert headers["user-agent"] == "efd/1.0"


async def _publish_all(
    publisher: Publisher[Any], target: Target, message: dict[str, Any], count: int = COUNT
) -> None:
    name = name_for(target, message)
    limit = asyncio.Semaphore(64)

    async def one(i: int) -> None:
        async with limit:
            await publisher.publish(target, name, _body(i), _headers(i))

    await asyncio.gather(*(one(i) for i in range(count)))


class Proxy:
    """A TCP relay to a broker whose connections a test can cut, as a lost network would."""

    def __init__(self, port: int) -> None:
        self.port = free_port()
        self._upstream = port
        self._writers: set[asyncio.StreamWriter] = set()
        self.accepted = 0
        self._server: asyncio.Server | None = None

    async def __aenter__(self) -> Proxy:
        self._server = await asyncio.start_server(self._relay, "127.0.0.1", self.port)
        return self

    async def __aexit__(self, *_: object) -> None:
        self.cut()
        assert self._server is not None
        self._server.close()
        await self._server.wait_closed()

    async def _relay(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.accepted += 1
        up_reader, up_writer = await asyncio.open_connection("127.0.0.1", self._upstream)
        self._writers |= {writer, up_writer}

        async def pipe(source: asyncio.StreamReader, sink: asyncio.StreamWriter) -> None:
            try:
                while data := await source.read(65536):
                    sink.write(data)
                    await sink.drain()
            except OSError:
                pass
            finally:
                sink.close()

        await asyncio.gather(pipe(reader, up_writer), pipe(up_reader, writer))

    def cut(self) -> None:
        for writer in self._writers:
            transport = writer.transport
            transport.abort()
        self._writers.clear()


async def _until_published(
    publisher: Publisher[Any], target: Target, name: str, i: int
) -> list[str]:
    """Publish message `i`, again after each failure as the dispatcher would; the failures'
    classes."""
    failures: list[str] = []
    for _ in range(40):
        try:
            await publisher.publish(target, name, _body(i), _headers(i))
            return failures
        except PublishFailed as failure:
            failures.append(failure.error_class)
            await asyncio.sleep(0.25)
    raise AssertionError(f"message {i} never published: {failures}")


async def _reconnects(
    publisher: Publisher[Any],
    target_for: Callable[[int], Target],
    name: str,
    consumed: Callable[[], Awaitable[set[str]]],
    upstream: int,
) -> None:
    """Messages published through a relay whose connections are cut midway all arrive
    (duplicates only for a publish in flight at the cut), over a second connection."""
    async with Proxy(upstream) as proxy:
        target = target_for(proxy.port)
        seen_failures: list[str] = []
        for i in range(40):
            if i == 20:
                proxy.cut()
            seen_failures += await _until_published(publisher, target, name, i)
        assert set(seen_failures) <= {"reset", "connect", "timeout"}, seen_failures
        # A second connection, opened after the cut (Redis' pool opens it itself, the
        # other publishers through their link).
        assert proxy.accepted == 2
    ids = await consumed()
    assert {f"msg_{i:026d}" for i in range(40)} <= ids


@pytest.fixture
async def rabbit() -> AsyncIterator[aiormq.abc.AbstractChannel]:
    await _require("amqp")
    connection = await aiormq.connect("amqp://guest:guest@127.0.0.1:5672/")
    channel = await connection.channel()
    yield channel
    await connection.close()


async def _amqp_queue(channel: aiormq.abc.AbstractChannel) -> str:
    declared = await channel.queue_declare(f"efd-test-{secrets.token_hex(6)}", auto_delete=True)
    assert declared.queue is not None
    return declared.queue


async def _amqp_drain(
    channel: aiormq.abc.AbstractChannel, queue: str
) -> list[tuple[bytes, dict[str, str]]]:
    got: list[tuple[bytes, dict[str, str]]] = []
    while True:
        message = await channel.basic_get(queue, no_ack=True)
        if message.delivery_tag is None:  # Basic.GetEmpty
            return got
        properties = message.header.properties
        headers = {str(k): str(v) for k, v in (properties.headers or {}).items()}
        assert properties.content_type == "application/json"
        assert properties.message_id == headers["webhook-id"]
        assert properties.delivery_mode == 2
        got.append((message.body, headers))


async def test_amqp_delivers_each_message_once(rabbit: aiormq.abc.AbstractChannel) -> None:
    queue = await _amqp_queue(rabbit)
    target = parse_target("amqp", "amqp://guest:guest@127.0.0.1:5672/%2f", {"routing_key": queue})
    publisher = RabbitMQ(timeout=10, allowed=LOOPBACK)
    try:
        await _publish_all(publisher, target, {"type": "track"})
    finally:
        await publisher.close()
    _check(await _amqp_drain(rabbit, queue))


async def test_amqp_refusals(rabbit: aiormq.abc.AbstractChannel) -> None:
    publisher = RabbitMQ(timeout=10, allowed=LOOPBACK)
    url = "amqp://guest:guest@127.0.0.1:5672/"
    try:
        nowhere = parse_target(
            "amqp", url, {"routing_key": "efd.{{type}}", "exchange": "amq.topic"}
        )
        with pytest.raises(PublishFailed) as unroutable:
            await publisher.publish(nowhere, "efd.nobody-binds-this", b"{}", _headers(0))
        assert unroutable.value.error_class == "refused"
        assert "unroutable" in unroutable.value.reason
        assert "312 NO_ROUTE" in unroutable.value.reason
        missing = parse_target("amqp", url, {"routing_key": "k", "exchange": "efd-no-such"})
        with pytest.raises(PublishFailed) as no_exchange:
            await publisher.publish(missing, "k", b"{}", _headers(0))
        assert no_exchange.value.error_class == "refused"
        assert "no exchange 'efd-no-such'" in no_exchange.value.reason
        # The channel the missing exchange closed is opened again for the next publish.
        queue = await _amqp_queue(rabbit)
        fine = parse_target("amqp", url, {"routing_key": queue})
        await publisher.publish(fine, queue, b"{}", _headers(0))
        wrong = parse_target(
            "amqp", "amqp://guest:not-the-password@127.0.0.1:5672/", {"routing_key": "k"}
        )
        with pytest.raises(PublishFailed) as refused:
            await publisher.publish(wrong, "k", b"{}", _headers(0))
        assert refused.value.error_class == "auth"
        assert "ACCESS_REFUSED" in refused.value.reason
        assert "not-the-password" not in refused.value.reason
        # Until the back-off has run out, the same failure comes at once.
        with pytest.raises(PublishFailed) as again:
            await publisher.publish(wrong, "k", b"{}", _headers(0))
        assert again.value.error_class == "auth"
        assert "next connect in" in again.value.reason
    finally:
        await publisher.close()


async def test_amqp_reconnects(rabbit: aiormq.abc.AbstractChannel) -> None:
    queue = await _amqp_queue(rabbit)
    publisher = RabbitMQ(timeout=5, allowed=LOOPBACK)

    async def consumed() -> set[str]:
        return {headers["webhook-id"] for _, headers in await _amqp_drain(rabbit, queue)}

    try:
        await _reconnects(
            publisher,
            lambda port: parse_target(
                "amqp", f"amqp://guest:guest@127.0.0.1:{port}/", {"routing_key": queue}
            ),
            queue,
            consumed,
            5672,
        )
    finally:
        await publisher.close()


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


async def _nats_drain(js: Any, stream: str) -> list[tuple[bytes, dict[str, str]]]:
    subscription = await js.pull_subscribe(f"{stream.lower()}.>", durable=None, stream=stream)
    got: list[tuple[bytes, dict[str, str]]] = []
    while True:
        try:
            batch = await subscription.fetch(500, timeout=1)
        except TimeoutError:  # nats-py's own, or asyncio's from a fetch's last turn
            return got
        for message in batch:
            assert message.headers["Nats-Msg-Id"] == message.headers["webhook-id"]
            assert message.headers["content-type"] == "application/json"
            got.append((message.data, dict(message.headers)))
            await message.ack()


async def test_jetstream_delivers_each_message_once(jetstream: tuple[Any, str]) -> None:
    js, stream = jetstream
    target = parse_target(
        "nats", "nats://127.0.0.1:4222", {"subject": f"{stream.lower()}.{{{{type}}}}"}
    )
    publisher = JetStream(timeout=10, allowed=LOOPBACK)
    try:
        await _publish_all(publisher, target, {"type": "track"})
        # A resend of the same messages (same webhook-id) is acknowledged and not stored.
        await _publish_all(publisher, target, {"type": "track"}, count=10)
    finally:
        await publisher.close()
    got = await _nats_drain(js, stream)
    _check(got)


async def test_jetstream_missing_stream_is_refused() -> None:
    await _require("nats")
    target = parse_target("nats", "nats://127.0.0.1:4222", {"subject": "efd-no-stream.{{type}}"})
    publisher = JetStream(timeout=5, allowed=LOOPBACK)
    try:
        with pytest.raises(PublishFailed) as refused:
            await publisher.publish(target, "efd-no-stream.track", b"{}", _headers(0))
    finally:
        await publisher.close()
    assert refused.value.error_class == "refused"
    assert refused.value.reason == "no stream takes the subject 'efd-no-stream.track'"


async def test_jetstream_reconnects(jetstream: tuple[Any, str]) -> None:
    js, stream = jetstream
    publisher = JetStream(timeout=5, allowed=LOOPBACK)

    async def consumed() -> set[str]:
        return {headers["webhook-id"] for _, headers in await _nats_drain(js, stream)}

    try:
        await _reconnects(
            publisher,
            lambda port: parse_target(
                "nats", f"nats://127.0.0.1:{port}", {"subject": f"{stream.lower()}.x"}
            ),
            f"{stream.lower()}.x",
            consumed,
            4222,
        )
    finally:
        await publisher.close()


@pytest.fixture
async def redis_client() -> AsyncIterator[aioredis.Redis]:
    await _require("redis_streams")
    client = aioredis.Redis(host="127.0.0.1", port=6379)
    yield client
    await client.aclose()


async def _redis_drain(client: aioredis.Redis, stream: str) -> list[tuple[bytes, dict[str, str]]]:
    entries: list[tuple[bytes, dict[bytes, bytes]]] = await client.xrange(stream)  # type: ignore[assignment]
    got = []
    for _, fields in entries:
        assert next(iter(fields)) == b"body"  # the body's field first
        headers = {k.decode(): v.decode() for k, v in fields.items() if k != b"body"}
        assert headers["content-type"] == "application/json"
        got.append((fields[b"body"], headers))
    return got


async def test_redis_delivers_each_message_once(redis_client: aioredis.Redis) -> None:
    stream = f"efd-test-{secrets.token_hex(6)}"
    target = parse_target("redis_streams", "redis://127.0.0.1:6379/0", {"stream": stream})
    publisher = RedisStreams(timeout=10, allowed=LOOPBACK)
    try:
        await _publish_all(publisher, target, {"type": "track"})
        _check(await _redis_drain(redis_client, stream))
    finally:
        await publisher.close()
        await redis_client.delete(stream)


async def test_redis_maxlen_trims(redis_client: aioredis.Redis) -> None:
    stream = f"efd-test-{secrets.token_hex(6)}"
    target = parse_target(
        "redis_streams", "redis://127.0.0.1:6379/0", {"stream": stream, "maxlen": 100}
    )
    publisher = RedisStreams(timeout=10, allowed=LOOPBACK)
    try:
        await _publish_all(publisher, target, {"type": "track"})
        # Approximate: whole nodes of the stream are dropped, so somewhat more than 100 stay.
        assert 100 <= await redis_client.xlen(stream) < COUNT
    finally:
        await publisher.close()
        await redis_client.delete(stream)


async def test_redis_refusals(redis_client: aioredis.Redis) -> None:
    user = f"efd-test-{secrets.token_hex(4)}"
    key = f"efd-test-{secrets.token_hex(6)}"
    await redis_client.acl_setuser(
        user, enabled=True, passwords=["+the-right-one"], keys=["*"], commands=["+@all"]
    )
    await redis_client.set(key, "not a stream")
    publisher = RedisStreams(timeout=5, allowed=LOOPBACK)
    try:
        wrong = parse_target(
            "redis_streams", f"redis://{user}:a-wrong-one@127.0.0.1:6379/0", {"stream": key}
        )
        with pytest.raises(PublishFailed) as refused:
            await publisher.publish(wrong, key, b"{}", _headers(0))
        assert refused.value.error_class == "auth"
        assert "invalid username-password pair" in refused.value.reason
        assert "a-wrong-one" not in refused.value.reason
        right = parse_target(
            "redis_streams", f"redis://{user}:the-right-one@127.0.0.1:6379/0", {"stream": key}
        )
        with pytest.raises(PublishFailed) as wrong_type:
            await publisher.publish(right, key, b"{}", _headers(0))
        assert wrong_type.value.error_class == "refused"
        assert "WRONGTYPE" in wrong_type.value.reason
    finally:
        await publisher.close()
        await redis_client.acl_deluser(user)
        await redis_client.delete(key)


async def test_redis_reconnects(redis_client: aioredis.Redis) -> None:
    stream = f"efd-test-{secrets.token_hex(6)}"
    publisher = RedisStreams(timeout=5, allowed=LOOPBACK)

    async def consumed() -> set[str]:
        return {headers["webhook-id"] for _, headers in await _redis_drain(redis_client, stream)}

    try:
        await _reconnects(
            publisher,
            lambda port: parse_target(
                "redis_streams", f"redis://127.0.0.1:{port}/0", {"stream": stream}
            ),
            stream,
            consumed,
            6379,
        )
    finally:
        await publisher.close()
        await redis_client.delete(stream)


@pytest.mark.parametrize("qos", [1, 2])
async def test_mqtt_delivers_each_message_once(qos: int) -> None:
    await _require("mqtt")
    prefix = f"efd-test-{secrets.token_hex(6)}"
    target = parse_target(
        "mqtt", "mqtt://127.0.0.1:1883", {"topic": prefix + "/{{type}}", "qos": qos}
    )
    publisher = Mqtt(timeout=10, allowed=LOOPBACK)
    got: list[tuple[bytes, dict[str, str]]] = []
    async with aiomqtt.Client("127.0.0.1", 1883, protocol=aiomqtt.ProtocolVersion.V5) as consumer:
        await consumer.subscribe(f"{prefix}/#", qos=2)

        async def consume() -> None:
            async for message in consumer.messages:
                assert message.topic.value == f"{prefix}/track"
                properties: Any = message.properties
                assert properties is not None
                assert properties.ContentType == "application/json"
                payload = message.payload
                assert isinstance(payload, bytes)
                got.append((payload, dict(properties.UserProperty)))
                if len(got) == COUNT:
                    return

        reader = asyncio.create_task(consume())
        try:
            await _publish_all(publisher, target, {"type": "track"})
            await asyncio.wait_for(reader, 30)
        finally:
            reader.cancel()
            await publisher.close()
    _check(got)


async def test_mqtt_reconnects() -> None:
    await _require("mqtt")
    prefix = f"efd-test-{secrets.token_hex(6)}"
    publisher = Mqtt(timeout=5, allowed=LOOPBACK)
    seen: set[str] = set()
    async with aiomqtt.Client("127.0.0.1", 1883, protocol=aiomqtt.ProtocolVersion.V5) as consumer:
        await consumer.subscribe(f"{prefix}/#", qos=2)

        async def consume() -> None:
            async for message in consumer.messages:
                properties: Any = message.properties
                assert properties is not None
                seen.add(dict(properties.UserProperty)["webhook-id"])

        reader = asyncio.create_task(consume())

        async def consumed() -> set[str]:
            for _ in range(100):
                if len(seen) >= 40:
                    break
                await asyncio.sleep(0.05)
            return seen

        try:
            await _reconnects(
                publisher,
                lambda port: parse_target(
                    "mqtt", f"mqtt://127.0.0.1:{port}", {"topic": f"{prefix}/x"}
                ),
                f"{prefix}/x",
                consumed,
                1883,
            )
        finally:
            reader.cancel()
            await publisher.close()


@pytest.mark.parametrize(
    ("publisher_class", "url", "keys"),
    [
        (RabbitMQ, "amqp://guest:guest@127.0.0.1:5672/", {"routing_key": "k"}),
        (JetStream, "nats://127.0.0.1:4222", {"subject": "efd.k"}),
        (RedisStreams, "redis://127.0.0.1:6379/0", {"stream": "efd-k"}),
        (Mqtt, "mqtt://127.0.0.1:1883", {"topic": "efd/k"}),
    ],
)
async def test_the_address_guard_refuses_loopback(
    publisher_class: type[Publisher[Any]], url: str, keys: dict[str, Any]
) -> None:
    """Without allowed_networks exempting it, 127.0.0.1 is never connected to; a name that
    resolves to it neither."""
    await _require(publisher_class.kind)
    for host in ("127.0.0.1", "localhost"):
        target = parse_target(publisher_class.kind, url.replace("127.0.0.1", host), keys)
        publisher = publisher_class(timeout=5, allowed=())
        try:
            with pytest.raises(PublishFailed) as refused:
                await publisher.publish(target, "k", b"{}", _headers(0))
        finally:
            await publisher.close()
        assert refused.value.error_class == "blocked"
        assert "efd address guard: loopback address" in refused.value.reason
        assert publisher.link(target.broker).connects == 0
