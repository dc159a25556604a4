"""The brokers phase (`--only brokers`): for each broker on this machine, efd's delivery to a
broker destination beside the same client library publishing the same bodies, with the same
headers and the same confirmation, flat out, in interleaved pairs (raw client, then efd).

efd's side of a pair: the generator ingests `efd_events` messages over /v1/batch and the
daemon publishes each to the broker; its rate is those events over the time from the first
request until the daemon counted the last one delivered (efd_deliveries_delivered_total),
and its CPU per event is the daemon's (its sender processes included) over the same time,
ingestion's share in it, as in the deliver phase. The raw side: a process of its own
publishing the webhook body efd makes of the generator's messages, with efd's four headers,
from `concurrency` tasks at once (efd's `max_per_hook`) on one connection (a pool of as
many for Redis, as efd's), each waiting for the broker's confirmation, for `raw_seconds`;
its rate and its own CPU per publish. Each slice's messages are removed after it.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import hmac
import os
import secrets
import time
from collections.abc import Awaitable, Callable
from dataclasses import asdict, dataclass
from typing import Any

from efdbench.bodies import SECRET, sample_webhook_body
from efdbench.processes import Daemon, Worker
from efdbench.procstats import cpu_seconds, machine_cpu_seconds
from efdbench.stats import medians

KINDS = ("amqp", "nats", "redis_streams", "mqtt")
HOSTS = {
    "amqp": "amqp://guest:guest@127.0.0.1:5672/%2f",
    "nats": "nats://127.0.0.1:4222",
    "redis_streams": "redis://127.0.0.1:6379/0",
    "mqtt": "mqtt://127.0.0.1:1883",
}
NAME_KEY = {"amqp": "routing_key", "nats": "subject", "redis_streams": "stream", "mqtt": "topic"}
# Both sides' delivery settings: efd's defaults, with short retries as in the deliver phase.
DELIVERY = {"timeout_seconds": 5, "retry_initial_seconds": 0.5, "retry_max_seconds": 2}


@dataclass(frozen=True)
class BrokerPlan:
    pairs: int
    raw_seconds: float
    efd_events: int
    concurrency: int  # the raw client's publishes in flight: efd's max_per_hook
    ingest_clients: int
    cap_seconds: float  # the longest an efd slice may take to deliver its events


BROKERS_FULL = BrokerPlan(
    pairs=5, raw_seconds=5, efd_events=20_000, concurrency=64, ingest_clients=4, cap_seconds=180
)
BROKERS_QUICK = BrokerPlan(
    pairs=3, raw_seconds=3, efd_events=8_000, concurrency=64, ingest_clients=4, cap_seconds=90
)
BROKERS_SMOKE = BrokerPlan(
    pairs=1, raw_seconds=0.3, efd_events=300, concurrency=8, ingest_clients=2, cap_seconds=30
)


# -- the target each kind publishes to, made and emptied from the orchestrator --------------


@dataclass
class Target:
    kind: str
    name: str  # the routing key, subject, stream or topic
    stream: str = ""  # JetStream's stream

    def hook_lines(self) -> list[str]:
        lines = [f'type = "{self.kind}"', "[[destinations.hooks]]", f'url = "{HOSTS[self.kind]}"']
        lines.append(f'{NAME_KEY[self.kind]} = "{self.name}"')
        if self.kind == "mqtt":
            lines.append("qos = 1")
        return lines


async def _make(kind: str) -> Target:
    tag = secrets.token_hex(4)
    if kind == "amqp":
        import aiormq

        target = Target(kind, f"efd-bench-{tag}")
        connection = await aiormq.connect(HOSTS[kind])
        channel = await connection.channel()
        # Durable: efd's messages are persistent, so the broker writes them as a durable
        # queue's consumer would have them.
        await channel.queue_declare(target.name, durable=True)
        await connection.close()
        return target
    if kind == "nats":
        import nats
        from nats.js.api import StorageType

        target = Target(kind, f"efdbench{tag}.track", stream=f"EFDBENCH{tag.upper()}")
        client = await nats.connect(HOSTS[kind])
        await client.jetstream().add_stream(
            name=target.stream, subjects=[target.name], storage=StorageType.FILE
        )
        await client.close()
        return target
    if kind == "redis_streams":
        return Target(kind, f"efd-bench-{tag}")
    return Target(kind, f"efd-bench-{tag}/track")  # MQTT: no subscriber, the broker drops it


async def _empty(target: Target, remove: bool = False) -> None:
    """Remove what a slice published (and, with `remove`, the queue or stream itself)."""
    if target.kind == "amqp":
        import aiormq

        connection = await aiormq.connect(HOSTS["amqp"])
        channel = await connection.channel()
        if remove:
            await channel.queue_delete(target.name)
        else:
            await channel.queue_purge(target.name)
        await connection.close()
    elif target.kind == "nats":
        import nats

        client = await nats.connect(HOSTS["nats"])
        js = client.jetstream()
        if remove:
            await js.delete_stream(target.stream)
        else:
            await js.purge_stream(target.stream)
        await client.close()
    elif target.kind == "redis_streams":
        import redis.asyncio as aioredis

        redis_client = aioredis.Redis(host="127.0.0.1", port=6379)
        await redis_client.delete(target.name)
        await redis_client.aclose()


# -- the raw client (a worker process) -----------------------------------------------------


Publish = Callable[[int], Awaitable[None]]


def _headers(webhook_id: str, signature: str) -> dict[str, str]:
    """efd's headers of one message, in lower case as efd writes them to a broker."""
    return {
        "user-agent": "efd-bench/1.0",
        "content-type": "application/json",
        "webhook-id": webhook_id,
        "x-signature": signature,
    }


async def _raw(
    kind: str, to: str, seconds: float, concurrency: int, body: bytes, signature: str
) -> dict[str, Any]:
    """Publish `body` to `to` (the routing key, subject, stream or topic) from `concurrency`
    tasks, each awaiting the broker's confirmation, for `seconds`: the count, the time and
    this process's CPU."""
    closers: list[Callable[[], Awaitable[Any]]] = []
    prefix = secrets.token_hex(8)
    publish: Publish
    if kind == "amqp":
        import aiormq
        from pamqp import commands as spec

        connection = await aiormq.connect(HOSTS[kind])
        channel = await connection.channel(publisher_confirms=True, on_return_raises=True)
        closers.append(connection.close)

        async def publish(i: int) -> None:
            headers = _headers(f"msg_{prefix}{i}", signature)
            properties = spec.Basic.Properties(
                headers={k: v for k, v in headers.items() if k != "content-type"},
                content_type=headers["content-type"],
                message_id=headers["webhook-id"],
                delivery_mode=2,
            )
            confirmation = await channel.basic_publish(
                body, exchange="", routing_key=to, properties=properties, mandatory=True
            )
            assert isinstance(confirmation, spec.Basic.Ack), confirmation

    elif kind == "nats":
        import nats

        client = await nats.connect(HOSTS[kind])
        js = client.jetstream()
        closers.append(client.close)

        async def publish(i: int) -> None:
            headers = _headers(f"msg_{prefix}{i}", signature)
            headers["Nats-Msg-Id"] = headers["webhook-id"]
            ack = await js.publish(to, body, timeout=5, headers=headers)
            assert ack.stream

    elif kind == "redis_streams":
        import redis.asyncio as aioredis

        redis_client = aioredis.Redis(host="127.0.0.1", port=6379, max_connections=concurrency)
        closers.append(redis_client.aclose)

        async def publish(i: int) -> None:
            fields: dict[Any, Any] = {"body": body, **_headers(f"msg_{prefix}{i}", signature)}
            await redis_client.xadd(to, fields)

    else:
        import aiomqtt
        from paho.mqtt.packettypes import PacketTypes
        from paho.mqtt.properties import Properties

        mqtt = aiomqtt.Client(
            "127.0.0.1",
            1883,
            identifier=f"efd-bench-raw-{prefix}",
            protocol=aiomqtt.ProtocolVersion.V5,
            timeout=5,
        )
        mqtt.pending_calls_threshold = 1 << 62  # as efd's: no warning per publish
        await mqtt.__aenter__()

        async def close_mqtt() -> None:
            await mqtt.__aexit__(None, None, None)

        closers.append(close_mqtt)

        async def publish(i: int) -> None:
            headers = _headers(f"msg_{prefix}{i}", signature)
            properties = Properties(PacketTypes.PUBLISH)  # type: ignore[no-untyped-call]
            properties.ContentType = headers.pop("content-type")
            properties.UserProperty = list(headers.items())
            await mqtt.publish(to, body, qos=1, properties=properties, timeout=5)

    state = {"next": 0, "done": 0}
    errors: dict[str, int] = {}
    cpu_before = time.process_time()
    started = time.monotonic()
    end = started + seconds

    async def worker() -> None:
        while time.monotonic() < end:
            i = state["next"]
            state["next"] += 1
            try:
                await publish(i)
            except Exception as error:  # counted and shown: a raw side that fails is no limit
                key = type(error).__name__
                errors[key] = errors.get(key, 0) + 1
                await asyncio.sleep(0.01)
                continue
            state["done"] += 1

    await asyncio.gather(*(worker() for _ in range(concurrency)))
    elapsed = time.monotonic() - started
    cpu = time.process_time() - cpu_before
    for close in closers:
        with contextlib.suppress(Exception):
            await close()
    return {"count": state["done"], "elapsed": elapsed, "cpu": cpu, "errors": errors}


def raw_main(conn: Any) -> None:
    """The raw client's process: one publishing job a call, on uvloop as efd runs."""
    import uvloop

    conn.send({"pid": os.getpid()})
    while True:
        if not conn.poll(3600):
            return
        cmd = conn.recv()
        if cmd is None:
            return
        _, kwargs = cmd
        try:
            result = uvloop.run(_raw(**kwargs))
        except Exception as error:  # reported to the orchestrator, which shows it
            result = {"error": f"{type(error).__name__}: {error}"}
        conn.send(result)


# -- the phase -----------------------------------------------------------------------------


def run_brokers(
    bench: Any, ctx: Any, plan: BrokerPlan, kinds: tuple[str, ...] = KINDS
) -> dict[str, Any]:
    """Every kind's pairs; the figures per kind (medians, and the smallest and largest pair)."""
    body = sample_webhook_body()
    # X-Signature as efd writes it: the hex HMAC-SHA1 of the body (docs/delivery.md).
    signature = hmac.new(SECRET.encode(), body, hashlib.sha1).hexdigest()
    raw = Worker(ctx, raw_main)
    figures: dict[str, Any] = {"plan": asdict(plan)}
    try:
        for kind in kinds:
            print(f"  brokers {kind} ...", flush=True)
            figures[kind] = _one_kind(bench, raw, plan, kind, body, signature)
    finally:
        raw.stop(None)
    return figures


def _one_kind(
    bench: Any, raw: Worker, plan: BrokerPlan, kind: str, body: bytes, signature: str
) -> dict[str, Any]:
    target = asyncio.run(_make(kind))
    daemon = Daemon(f"brokers-{kind}", bench.root, DELIVERY, "", destination=target.hook_lines())
    pairs: list[dict[str, Any]] = []
    try:
        _efd_slice(bench, daemon, plan, min(plan.efd_events, 1000), "warm")  # not counted
        asyncio.run(_empty(target))
        for i in range(plan.pairs):
            machine = machine_cpu_seconds()["processes"]
            clock = time.monotonic()
            loadavg = round(os.getloadavg()[0], 2)
            out = raw.job(
                "raw",
                plan.raw_seconds + 60,
                kind=kind,
                to=target.name,
                seconds=plan.raw_seconds,
                concurrency=plan.concurrency,
                body=body,
                signature=signature,
            )
            raw_machine = (machine_cpu_seconds()["processes"] - machine) / (
                time.monotonic() - clock
            )
            asyncio.run(_empty(target))
            efd = _efd_slice(bench, daemon, plan, plan.efd_events, str(i))
            asyncio.run(_empty(target))
            raw_per_s = out["count"] / out["elapsed"]
            pair = {
                "raw_per_s": round(raw_per_s, 1),
                "raw_cpu_us_per_event": round(out["cpu"] / max(out["count"], 1) * 1e6, 1),
                "raw_errors": out["errors"],
                "efd_per_s": efd["per_s"],
                "efd_cpu_us_per_event": efd["cpu_us_per_event"],
                "loadavg": [loadavg, efd["loadavg"]],
                "machine_cpu_pct": [round(raw_machine * 100, 1), efd["machine_cpu_pct"]],
            }
            if raw_per_s:
                pair["ratio"] = round(efd["per_s"] / raw_per_s, 3)
            if pair["raw_cpu_us_per_event"]:
                pair["cpu_ratio"] = round(efd["cpu_us_per_event"] / pair["raw_cpu_us_per_event"], 2)
            pairs.append(pair)
            print(
                f"   [{i + 1}] raw {raw_per_s:,.0f}/s {pair['raw_cpu_us_per_event']:.0f} us,"
                f" efd {efd['per_s']:,.0f}/s {efd['cpu_us_per_event']:.0f} us"
                f" (load {loadavg})",
                flush=True,
            )
    finally:
        stopped = daemon.stop()
        asyncio.run(_empty(target, remove=True))
    counts = daemon.log_counts()
    keys = (
        "ratio",
        "efd_per_s",
        "raw_per_s",
        "efd_cpu_us_per_event",
        "raw_cpu_us_per_event",
        "cpu_ratio",
    )
    figures = medians(pairs, keys)
    result: dict[str, Any] = {key: figures[key][0] for key in keys}
    result["ratio_spread"] = figures["ratio"][1]
    result["pairs"] = pairs
    result["daemon_log_lines"] = counts
    result["daemon_exit_code"] = stopped["exit_code"]
    if counts.get("ERROR") or counts.get("Traceback"):
        result["first_error"] = daemon.first_error()
        bench.keep = True
    return result


def _efd_slice(
    bench: Any, daemon: Daemon, plan: BrokerPlan, events: int, index: str
) -> dict[str, Any]:
    """Ingest `events` messages and wait until the daemon delivered them all."""
    delivered_before = daemon.counter("efd_deliveries_delivered_total")
    cpu_before = cpu_seconds(daemon.pid)
    machine_before = machine_cpu_seconds()["processes"]
    loadavg = round(os.getloadavg()[0], 2)
    started = time.monotonic()
    with bench.profiler.record(f"brokers_{daemon.name}_{index}", daemon.pid, plan.cap_seconds):
        out = bench.generator.job(
            "ingest",
            plan.cap_seconds + 60,
            port=daemon.port,
            path="/v1/batch",
            clients=plan.ingest_clients,
            batch=100,
            duration=plan.cap_seconds,
            prefix=f"br{index}-",
            max_events=events,
        )
        acked = out["acked"]
        while daemon.counter("efd_deliveries_delivered_total") - delivered_before < acked:
            if time.monotonic() - started > plan.cap_seconds:
                raise RuntimeError(
                    f"{daemon.name}: {acked} events not delivered in {plan.cap_seconds} s"
                )
            time.sleep(0.1)
    elapsed = time.monotonic() - started
    cpu = cpu_seconds(daemon.pid) - cpu_before
    machine = machine_cpu_seconds()["processes"] - machine_before
    return {
        "per_s": round(acked / elapsed, 1),
        "cpu_us_per_event": round(cpu / max(acked, 1) * 1e6, 1),
        "machine_cpu_pct": round(machine / elapsed * 100, 1),
        "loadavg": loadavg,
    }
