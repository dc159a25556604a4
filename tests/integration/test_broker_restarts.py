"""A broker stopped for 10 s mid-stream and started again: the real daemon, with a broker
destination ordered per user, loses nothing, duplicates at most the publishes in flight at
the stop (none on JetStream, which drops a resend by its `Nats-Msg-Id`), and keeps each
user's order across the restart. docs/brokers.md.

Each test runs a server of its own, the machine's real binary on a port of its own with a
data directory in the test's temporary directory, and stops and starts that process: the
servers on the standard ports are shared by the broker tests running beside this one under
pytest-xdist, which a stop of theirs would fail at random. scripts/ensure-brokers installs
the binaries; a missing one fails its test, saying so.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import secrets
import shutil
import signal
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any

import aiomqtt
import aiormq
import nats
import pytest
import redis.asyncio as aioredis
from nats.js.api import StorageType
from paho.mqtt.packettypes import PacketTypes
from paho.mqtt.properties import Properties

from efd.segment import webhooks
from tests.conftest import SECRET, DaemonFactory, eventually, free_port, post, settings_dict, sql

COUNT = 1000
USERS = 10
BATCH = 100
STOPPED_SECONDS = 10
SETTLE_SECONDS = 3
RABBITMQ_SERVER = "/usr/lib/rabbitmq/bin/rabbitmq-server"


def _binary(name: str, *fallbacks: str) -> str:
    found = shutil.which(name) or next((p for p in fallbacks if os.access(p, os.X_OK)), None)
    if found is None:
        pytest.fail(f"{name} is not installed: scripts/ensure-brokers installs it")
    return found


async def _listening(port: int) -> bool:
    try:
        _, writer = await asyncio.wait_for(asyncio.open_connection("127.0.0.1", port), 2)
    except (OSError, TimeoutError):
        return False
    writer.close()
    with contextlib.suppress(OSError):
        await writer.wait_closed()
    return True


class Server:
    """A broker's server process of the test's own: started, stopped (SIGTERM, as the
    service's stop does) and started again on the same port with the same data."""

    def __init__(
        self, name: str, argv: list[str], port: int, workdir: Path, env: dict[str, str]
    ) -> None:
        self.name = name
        self.argv = argv
        self.port = port
        self.workdir = workdir
        self.env = {**os.environ, **env}
        self.process: asyncio.subprocess.Process | None = None
        self.starts = 0

    async def start(self) -> None:
        assert self.process is None, f"{self.name} is running"
        log = (self.workdir / f"{self.name}.log").open("ab")
        self.process = await asyncio.create_subprocess_exec(
            *self.argv,
            cwd=self.workdir,
            env=self.env,
            stdout=log,
            stderr=asyncio.subprocess.STDOUT,
            start_new_session=True,  # its own group: a stop reaches every process it started
        )
        log.close()
        self.starts += 1
        for _ in range(240):
            if self.process.returncode is not None:
                pytest.fail(f"{self.name} exited at start-up:\n{self.log_tail()}")
            if await _listening(self.port):
                return
            await asyncio.sleep(0.25)
        pytest.fail(f"{self.name} did not listen on 127.0.0.1:{self.port}:\n{self.log_tail()}")

    async def stop(self) -> None:
        process, self.process = self.process, None
        if process is None or process.returncode is not None:
            return
        os.killpg(process.pid, signal.SIGTERM)
        try:
            await asyncio.wait_for(process.wait(), 60)
        except TimeoutError:
            os.killpg(process.pid, signal.SIGKILL)
            await asyncio.wait_for(process.wait(), 10)
        with contextlib.suppress(ProcessLookupError):
            os.killpg(process.pid, signal.SIGKILL)  # anything of its group still there

    def log_tail(self) -> str:
        text = (self.workdir / f"{self.name}.log").read_text(errors="replace")
        return "\n".join(text.splitlines()[-30:])


def _redis(workdir: Path) -> Server:
    port = free_port()
    argv = [_binary("redis-server"), "--bind", "127.0.0.1", "--port", str(port)]
    # Every write on disk before its reply, so that what XADD confirmed outlives the stop.
    argv += ["--dir", str(workdir), "--appendonly", "yes", "--appendfsync", "always"]
    argv += ["--save", "", "--daemonize", "no", "--logfile", ""]
    return Server("redis", argv, port, workdir, {})


def _nats(workdir: Path) -> Server:
    port = free_port()
    binary = _binary("nats-server", "/usr/sbin/nats-server")
    argv = [binary, "-a", "127.0.0.1", "-p", str(port), "-js", "-sd", str(workdir / "js")]
    return Server("nats", argv, port, workdir, {})


def _mosquitto(workdir: Path) -> Server:
    port = free_port()
    lines = [
        f"listener {port} 127.0.0.1",
        "allow_anonymous true",
        # Sessions and their queued messages are written out at the stop and read back.
        "persistence true",
        f"persistence_location {workdir}/",
    ]
    if os.geteuid() == 0:
        lines.append("user root")  # stays root, the owner of the data directory
    config = workdir / "mosquitto.conf"
    config.write_text("\n".join(lines) + "\n")
    argv = [_binary("mosquitto", "/usr/sbin/mosquitto"), "-c", str(config)]
    return Server("mosquitto", argv, port, workdir, {})


def _rabbitmq(workdir: Path) -> Server:
    port, dist = free_port(), free_port()
    if not os.access(RABBITMQ_SERVER, os.X_OK):
        pytest.fail("rabbitmq-server is not installed: scripts/ensure-brokers installs it")
    (workdir / "rabbitmq.conf").write_text(f"listeners.tcp.local = 127.0.0.1:{port}\n")
    (workdir / "enabled_plugins").write_text("[].\n")  # no management listener on 15672
    (workdir / "rabbitmq-env.conf").write_text("")  # none of the system node's settings
    env = {
        "RABBITMQ_CONF_ENV_FILE": str(workdir / "rabbitmq-env.conf"),
        "RABBITMQ_NODENAME": f"efdtest{port}@localhost",
        "RABBITMQ_CONFIG_FILE": str(workdir / "rabbitmq.conf"),
        "RABBITMQ_ENABLED_PLUGINS_FILE": str(workdir / "enabled_plugins"),
        "RABBITMQ_MNESIA_BASE": str(workdir / "mnesia"),
        "RABBITMQ_LOG_BASE": str(workdir / "log"),
        "RABBITMQ_DIST_PORT": str(dist),
        "ERL_EPMD_ADDRESS": "127.0.0.1",
        "HOME": str(workdir),  # the Erlang cookie's
    }
    return Server("rabbitmq", [RABBITMQ_SERVER], port, workdir, env)


@pytest.fixture
async def workdir(tmp_path: Path) -> Path:
    path = tmp_path / "broker"
    path.mkdir()
    return path


@contextlib.asynccontextmanager
async def running(server: Server) -> AsyncIterator[Server]:
    await server.start()
    try:
        yield server
    finally:
        await server.stop()
        assert not await _listening(server.port), f"{server.name} still listens"


def _settings(db_url: str, kind: str, hook: dict[str, Any]) -> dict[str, Any]:
    # A window far longer than the stop and the reconnect back-off after it.
    settings = settings_dict(db_url, delivery={"retry_window_seconds": 600})
    settings["destinations"] = [
        {
            "name": "hooks",
            "type": kind,
            "shared_secret": SECRET,
            "ordering": "per_user",
            "hooks": [hook],
        }
    ]
    return settings


def _delivered(db_url: str) -> int:
    [(count,)] = sql(db_url, "SELECT count(*) FROM deliveries WHERE status = 'delivered'")
    return int(count)


async def _ingest(port: int) -> None:
    for start in range(0, COUNT, BATCH):
        batch = [
            {
                "type": "track",
                "messageId": f"m-{i}",
                "userId": f"u-{i % USERS}",
                "event": "Order Completed",
                "properties": {"n": i},
            }
            for i in range(start, start + BATCH)
        ]
        status, answer = await post(port, "/v1/batch", {"batch": batch})
        assert (status, answer) == (200, {"success": True})


async def _stream_through_a_restart(db_url: str, port: int, server: Server) -> None:
    """Ingest COUNT messages; once a fifth of them is delivered, stop the server for
    STOPPED_SECONDS (nothing is delivered meanwhile) and start it again; every message is
    then delivered."""
    ingesting = asyncio.create_task(_ingest(port))
    await eventually(lambda: _delivered(db_url) >= COUNT // 5, timeout=60)
    await server.stop()
    try:
        # What the broker confirmed before it stopped may still be on its way to the
        # store for a moment; from then on nothing more is delivered.
        await asyncio.sleep(SETTLE_SECONDS)
        stalled = _delivered(db_url)
        assert stalled < COUNT, "all delivered before the stop: nothing was mid-stream"
        await asyncio.sleep(STOPPED_SECONDS - SETTLE_SECONDS)
        assert _delivered(db_url) == stalled, "delivered while the broker was stopped"
    finally:
        await server.start()
    await ingesting
    await eventually(lambda: _delivered(db_url) == COUNT, timeout=120)
    assert server.starts == 2
    [(failed,)] = sql(db_url, "SELECT count(*) FROM deliveries WHERE status <> 'delivered'")
    assert failed == 0
    classes = {row[0] for row in sql(db_url, "SELECT DISTINCT error_class FROM attempts") if row[0]}
    assert classes, "no publish failed while the broker was stopped"
    assert classes <= {"connect", "reset", "timeout", "protocol", "refused"}, classes


def _check(got: list[bytes], duplicates_allowed: int) -> None:
    """Every message there, verifying; duplicates only up to the publishes that can be in
    flight at once (one per user, ordering per user); each user's messages in order, a
    resend seen again right where it was."""
    numbers = []
    for body in got:
        message = json.loads(body)
        numbers.append(message["properties"]["n"])
    assert set(numbers) == set(range(COUNT)), sorted(set(range(COUNT)) - set(numbers))[:20]
    assert len(numbers) - COUNT <= duplicates_allowed, len(numbers) - COUNT
    by_user: dict[int, list[int]] = {}
    for n in numbers:
        seen = by_user.setdefault(n % USERS, [])
        if n not in seen:
            seen.append(n)
    for user, order in by_user.items():
        assert order == list(range(user, COUNT, USERS)), (user, order)


def _verify_signatures(got: list[tuple[bytes, str]]) -> None:
    for body, signature in got:
        assert webhooks.verify(SECRET, body, signature)


# -- Redis ---------------------------------------------------------------------------------


async def test_redis_restarted_loses_nothing_and_keeps_each_users_order(
    db_url: str, daemon_factory: DaemonFactory, workdir: Path
) -> None:
    key = f"efd-test-{secrets.token_hex(6)}"
    async with running(_redis(workdir)) as server:
        url = f"redis://127.0.0.1:{server.port}/0"
        daemon = await daemon_factory(
            _settings(db_url, "redis_streams", {"url": url, "stream": key})
        )
        await _stream_through_a_restart(db_url, daemon.port, server)
        client = aioredis.Redis(host="127.0.0.1", port=server.port)
        try:
            entries: list[tuple[bytes, dict[bytes, bytes]]] = await client.xrange(key)  # type: ignore[assignment]
        finally:
            await client.aclose()
    _verify_signatures([(f[b"body"], f[b"x-signature"].decode()) for _id, f in entries])
    _check([fields[b"body"] for _id, fields in entries], duplicates_allowed=USERS)


# -- NATS JetStream ------------------------------------------------------------------------


async def test_jetstream_restarted_loses_nothing_duplicates_nothing_and_keeps_order(
    db_url: str, daemon_factory: DaemonFactory, workdir: Path
) -> None:
    stream = f"EFDTEST{secrets.token_hex(4).upper()}"
    subject = f"{stream.lower()}.track"
    async with running(_nats(workdir)) as server:
        url = f"nats://127.0.0.1:{server.port}"
        client = await nats.connect(url)
        await client.jetstream().add_stream(
            name=stream, subjects=[subject], storage=StorageType.FILE
        )
        await client.close()
        daemon = await daemon_factory(_settings(db_url, "nats", {"url": url, "subject": subject}))
        await _stream_through_a_restart(db_url, daemon.port, server)
        client = await nats.connect(url)
        try:
            js = client.jetstream()
            info = await js.stream_info(stream)
            subscription = await js.pull_subscribe(subject, durable=None, stream=stream)
            got: list[tuple[bytes, str]] = []
            while len(got) < info.state.messages:
                for message in await subscription.fetch(500, timeout=5):
                    assert message.headers is not None
                    assert message.headers["Nats-Msg-Id"] == message.headers["webhook-id"]
                    got.append((message.data, message.headers["x-signature"]))
                    await message.ack()
        finally:
            await client.close()
    _verify_signatures(got)
    # A resend after the restart is acknowledged as a duplicate and not stored again.
    _check([body for body, _ in got], duplicates_allowed=0)


# -- RabbitMQ ------------------------------------------------------------------------------


async def test_rabbitmq_restarted_loses_nothing_and_keeps_each_users_order(
    db_url: str, daemon_factory: DaemonFactory, workdir: Path
) -> None:
    queue = f"efd-test-{secrets.token_hex(6)}"
    async with running(_rabbitmq(workdir)) as server:
        url = f"amqp://guest:guest@127.0.0.1:{server.port}/"

        async def channel_of(
            use: Callable[[aiormq.abc.AbstractChannel], Awaitable[Any]],
        ) -> Any:
            connection = await aiormq.connect(url)
            try:
                return await use(await connection.channel())
            finally:
                await connection.close()

        # Durable, so that it and its persistent messages outlive the stop.
        await channel_of(lambda channel: channel.queue_declare(queue, durable=True))
        daemon = await daemon_factory(_settings(db_url, "amqp", {"url": url, "routing_key": queue}))
        await _stream_through_a_restart(db_url, daemon.port, server)

        async def drain(channel: aiormq.abc.AbstractChannel) -> list[tuple[bytes, str]]:
            got: list[tuple[bytes, str]] = []
            while True:
                message = await channel.basic_get(queue, no_ack=True)
                if message.delivery_tag is None:  # Basic.GetEmpty
                    return got
                headers = message.header.properties.headers or {}
                got.append((message.body, str(headers["x-signature"])))

        got: list[tuple[bytes, str]] = await channel_of(drain)
    _verify_signatures(got)
    _check([body for body, _ in got], duplicates_allowed=USERS)


# -- MQTT ----------------------------------------------------------------------------------


async def test_mosquitto_restarted_loses_nothing_and_keeps_each_users_order(
    db_url: str, daemon_factory: DaemonFactory, workdir: Path
) -> None:
    topic = f"efd-test-{secrets.token_hex(6)}/track"
    got: list[tuple[bytes, str]] = []
    subscribed = asyncio.Event()
    async with running(_mosquitto(workdir)) as server:

        async def consume() -> None:
            """A consumer with a session that outlives its connection (clean_start off,
            an expiry), QoS 1: what the broker queued for it at the stop comes after."""
            connect = Properties(PacketTypes.CONNECT)  # type: ignore[no-untyped-call]
            connect.SessionExpiryInterval = 3600
            while len(got) < COUNT:
                try:
                    async with aiomqtt.Client(
                        "127.0.0.1",
                        server.port,
                        identifier=f"efd-test-consumer-{server.port}",
                        protocol=aiomqtt.ProtocolVersion.V5,
                        clean_start=False,
                        properties=connect,
                    ) as consumer:
                        if not subscribed.is_set():
                            await consumer.subscribe(topic, qos=1)
                            subscribed.set()
                        async for message in consumer.messages:
                            assert isinstance(message.payload, bytes)
                            properties: Any = message.properties
                            headers = dict(properties.UserProperty)
                            got.append((message.payload, headers["x-signature"]))
                            if len({body for body, _ in got}) == COUNT:
                                return
                except aiomqtt.MqttError:
                    await asyncio.sleep(0.25)  # the broker is stopped: connect again

        consuming = asyncio.create_task(consume())
        try:
            await asyncio.wait_for(subscribed.wait(), 30)
            daemon = await daemon_factory(
                _settings(
                    db_url,
                    "mqtt",
                    {"url": f"mqtt://127.0.0.1:{server.port}", "topic": topic, "qos": 1},
                )
            )
            await _stream_through_a_restart(db_url, daemon.port, server)
            await asyncio.wait_for(consuming, 60)
        finally:
            consuming.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await consuming
    _verify_signatures(got)
    # Duplicates: efd's resends of publishes in flight at the stop, and the broker's own
    # of messages it had sent the consumer without its PUBACK yet (QoS 1 is at least once).
    _check([body for body, _ in got], duplicates_allowed=2 * USERS)
