#!/usr/bin/env python
"""efd benchmark: throughput, latency and scale, each beside this machine's own limit.

    .venv/bin/python bench/run.py [--quick] [--profile] [--only PHASES] [--out FILE]

Starts, all on 127.0.0.1 and each in its own process:
  * a webhook receiver (raw asyncio HTTP/1.1 on uvloop; answers 200 or 503, counts unique
    messageIds and duplicates, timestamps each receipt),
  * a load generator (a minimal keep-alive HTTP/1.1 client on uvloop, so that the load
    generator costs the daemon as little CPU as possible; the bare-POST limit uses aiohttp),
  * `python -m efd serve --config <generated toml>` on a fresh SQLite database in a temp
    directory, once per scenario (ingest+backlog, delivery+latency, recovery).

Prints a table and writes bench/results.json. See bench/README.md for what each figure
means and how it is measured. It is a benchmark, not a test: nothing asserts a time.
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import contextlib
import hashlib
import hmac
import io
import json
import multiprocessing as mp
import os
import platform
import shutil
import signal
import socket
import sqlite3
import subprocess
import sys
import tarfile
import tempfile
import time
import traceback
import urllib.request
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
WRITE_KEY = "wk_bench"
SECRET = "bench-secret"
AUTH = "Basic " + base64.b64encode(f"{WRITE_KEY}:".encode()).decode()
CLK_TCK = os.sysconf("SC_CLK_TCK")
REQUEST_TIMEOUT = 30.0  # seconds; a load-generator request that takes longer is an error

TARGETS = {
    "ingest_batch_events_per_s": (">=", 30000),
    "ingest_single_events_per_s": (">=", 5000),
    "deliver_ratio": (">=", 0.5),
    "latency_p99_ms": ("<=", 50),
    "backlog_ingest_ratio": (">=", 0.8),
    "rss_mb_backlog": ("<=", 300),
    "lost": ("==", 0),
    "duplicates": ("==", 0),
}

PHASES = ("limits", "ingest", "backlog", "deliver", "latency", "recovery")


@dataclass
class Plan:
    """Sizes and durations of every phase; every loop is bounded by one of these."""

    sqlite_seconds: float
    sqlite_max_rows: int
    bare_seconds: float
    bare_concurrency: int
    ingest_seconds: float
    warmup_seconds: float
    batch_size: int
    batch_clients: int
    single_clients: int
    backlog_target: int
    backlog_fill_cap_seconds: float
    fill_clients: int
    pairs: int  # backlog_ingest_ratio: alternating slices on the full and an empty store
    pair_seconds: float
    deliver_warmup_seconds: float
    deliver_seconds: float
    deliver_window: int
    deliver_clients: int
    latency_rate: int
    latency_seconds: float
    recovery_messages: int
    recovery_accept_cap_seconds: float
    recovery_drain_cap_seconds: float
    recovery_attempt_cap_seconds: float
    settle_cap_seconds: float


# The ingestion daemons' delivery settings. Deliveries cannot go out: one is in flight to a
# receiver that never answers (max_in_flight = 1, a one-hour timeout), so every other one
# stays pending and the dispatcher does no work: the ingest figures are ingestion alone.
INGEST_DELIVERY = {
    "timeout_seconds": 3600,
    "lease_seconds": 7300,
    "retry_initial_seconds": 3600,
    "retry_max_seconds": 3600,
    "max_in_flight": 1,
    "max_per_hook": 1,
}

QUICK = Plan(
    sqlite_seconds=2,
    sqlite_max_rows=400_000,
    bare_seconds=3,
    bare_concurrency=64,
    ingest_seconds=4,
    warmup_seconds=1,
    batch_size=100,
    batch_clients=8,
    single_clients=64,
    backlog_target=300_000,
    backlog_fill_cap_seconds=25,
    fill_clients=8,
    pairs=3,
    pair_seconds=1.5,
    deliver_warmup_seconds=2,
    deliver_seconds=6,
    deliver_window=5000,
    deliver_clients=4,
    latency_rate=1000,
    latency_seconds=5,
    recovery_messages=20_000,
    recovery_accept_cap_seconds=20,
    recovery_drain_cap_seconds=25,
    recovery_attempt_cap_seconds=20,
    settle_cap_seconds=15,
)

FULL = Plan(
    sqlite_seconds=5,
    sqlite_max_rows=1_500_000,
    bare_seconds=8,
    bare_concurrency=64,
    ingest_seconds=10,
    warmup_seconds=2,
    batch_size=100,
    batch_clients=8,
    single_clients=64,
    backlog_target=1_000_000,
    backlog_fill_cap_seconds=240,
    fill_clients=8,
    pairs=5,
    pair_seconds=2,
    deliver_warmup_seconds=3,
    deliver_seconds=15,
    deliver_window=5000,
    deliver_clients=4,
    latency_rate=1000,
    latency_seconds=15,
    recovery_messages=50_000,
    recovery_accept_cap_seconds=60,
    recovery_drain_cap_seconds=90,
    recovery_attempt_cap_seconds=45,
    settle_cap_seconds=30,
)


# ----------------------------------------------------------------------------------------
# Message bodies (shared by the load generator and the limit measurements)
# ----------------------------------------------------------------------------------------

_MSG = (
    '{"type":"track","userId":"user-%d","event":"Order Completed",'
    '"properties":{"orderId":"o-%d","plan":"pro","amount":42.5,"currency":"EUR",'
    '"items":3,"coupon":"SPRING"},'
    '"context":{"library":{"name":"efd-bench","version":"1.0"}},'
    '"messageId":"%s"}'
)


def _ids(prefix: str, n: int) -> list[str]:
    """n random messageIds (UUID-like randomness, as Segment libraries send)."""
    raw = os.urandom(16 * n).hex()
    return [f"{prefix}-{raw[i * 32 : i * 32 + 32]}" for i in range(n)]


def batch_body(prefix: str, n: int, seq: int) -> tuple[bytes, list[str]]:
    ids = _ids(prefix, n)
    msgs = ",".join(_MSG % (seq + i, seq + i, mid) for i, mid in enumerate(ids))
    return ('{"batch":[' + msgs + "]}").encode(), ids


def single_body(prefix: str, seq: int) -> tuple[bytes, list[str]]:
    ids = _ids(prefix, 1)
    return (_MSG % (seq, seq, ids[0])).encode(), ids


def sample_webhook_body() -> bytes:
    """A webhook body of the size efd sends for the generator's messages."""
    body = {
        "version": 1,
        "type": "track",
        "userId": "user-1",
        "event": "Order Completed",
        "properties": {
            "orderId": "o-1",
            "plan": "pro",
            "amount": 42.5,
            "currency": "EUR",
            "items": 3,
            "coupon": "SPRING",
        },
        "context": {"library": {"name": "efd-bench", "version": "1.0"}},
        "messageId": "bare-" + "0" * 32,
        "timestamp": "2025-01-01T00:00:00.000Z",
    }
    return json.dumps(body, separators=(",", ":")).encode()


# ----------------------------------------------------------------------------------------
# The webhook receiver (own process)
# ----------------------------------------------------------------------------------------

_OK = b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: 2\r\n\r\n{}"
_UNAVAILABLE = (
    b"HTTP/1.1 503 Service Unavailable\r\nContent-Type: application/json\r\n"
    b"Content-Length: 2\r\n\r\n{}"
)
_MID = b'"messageId":"'


class _ReceiverState:
    def __init__(self, received: Any) -> None:
        self.received = received  # shared counter: unique messageIds answered 200
        self.status = 200
        self.seen: dict[str, float] = {}
        self.duplicates = 0
        self.hook_200 = 0
        self.hook_503 = 0
        self.bare = 0
        self.bad_signatures = 0
        self.checked_signatures = 0
        self.no_id = 0
        self.requests = 0

    def reset(self) -> None:
        self.seen.clear()
        self.duplicates = self.hook_200 = self.hook_503 = self.bare = 0
        self.bad_signatures = self.checked_signatures = self.no_id = 0
        self.received.value = 0

    def handle(self, path: bytes, head: bytes, body: bytes) -> bytes:
        self.requests += 1
        if path == b"/bare":
            self.bare += 1
            return _OK
        if self.status != 200:
            self.hook_503 += 1
            return _UNAVAILABLE
        now = time.monotonic()
        self.hook_200 += 1
        if self.hook_200 % 101 == 1:  # verify a sample of signatures: efd signs correctly
            self.checked_signatures += 1
            i = head.lower().find(b"\r\nx-signature:")
            sig = b""
            if i >= 0:
                j = head.find(b"\r\n", i + 2)
                sig = head[i + 14 : j if j >= 0 else len(head)].strip()
            expected = hmac.new(SECRET.encode(), body, hashlib.sha1).hexdigest().encode()
            if not hmac.compare_digest(sig, expected):
                self.bad_signatures += 1
        i = body.find(_MID)
        if i < 0:
            self.no_id += 1
            return _OK
        j = body.find(b'"', i + 13)
        mid = body[i + 13 : j].decode()
        if mid in self.seen:
            self.duplicates += 1
        else:
            self.seen[mid] = now
            self.received.value += 1
        return _OK

    def stats(self) -> dict[str, Any]:
        return {
            "unique": len(self.seen),
            "duplicates": self.duplicates,
            "hook_200": self.hook_200,
            "hook_503": self.hook_503,
            "bare": self.bare,
            "requests": self.requests,
            "checked_signatures": self.checked_signatures,
            "bad_signatures": self.bad_signatures,
            "no_id": self.no_id,
        }


class _ReceiverProtocol(asyncio.Protocol):
    def __init__(self, state: _ReceiverState) -> None:
        self.state = state
        self.buf = bytearray()
        self.transport: asyncio.Transport | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]

    def data_received(self, data: bytes) -> None:
        buf = self.buf
        buf += data
        out = []
        while True:
            end = buf.find(b"\r\n\r\n")
            if end < 0:
                break
            head = bytes(buf[:end])
            i = head.lower().find(b"\r\ncontent-length:")
            length = 0
            if i >= 0:
                j = head.find(b"\r\n", i + 2)
                length = int(head[i + 17 : j if j >= 0 else len(head)])
            total = end + 4 + length
            if len(buf) < total:
                break
            body = bytes(buf[end + 4 : total])
            del buf[:total]
            first = head.find(b" ")
            path = head[first + 1 : head.find(b" ", first + 1)]
            out.append(self.state.handle(path, head, body))
        if out and self.transport is not None:
            self.transport.write(b"".join(out))


async def _receiver_serve(conn: Any, received: Any, blackhole_backlog: int) -> None:
    loop = asyncio.get_running_loop()
    state = _ReceiverState(received)
    server = await loop.create_server(
        lambda: _ReceiverProtocol(state), "127.0.0.1", 0, backlog=1024
    )
    port = server.sockets[0].getsockname()[1]
    # The blackhole: a listening socket that is never accepted from. A request to it
    # connects (the kernel completes the handshake) and then waits forever.
    blackhole = socket.socket()
    blackhole.bind(("127.0.0.1", 0))
    blackhole.listen(blackhole_backlog)
    conn.send({"port": port, "blackhole_port": blackhole.getsockname()[1], "pid": os.getpid()})
    stop = asyncio.Event()

    def on_command() -> None:
        os.set_blocking(conn.fileno(), True)  # the event loop made it non-blocking
        while conn.poll():
            cmd, *args = conn.recv()
            if cmd == "status":
                state.status = args[0]
                conn.send(True)
            elif cmd == "stats":
                conn.send(state.stats())
            elif cmd == "receipts":
                prefix = args[0]
                conn.send({k: v for k, v in state.seen.items() if k.startswith(prefix)})
            elif cmd == "missing":
                conn.send([mid for mid in args[0] if mid not in state.seen])
            elif cmd == "reset":
                state.reset()
                conn.send(True)
            elif cmd == "close_blackhole":
                blackhole.close()
                conn.send(True)
            elif cmd == "stop":
                stop.set()
                conn.send(True)

    loop.add_reader(conn.fileno(), on_command)
    await stop.wait()
    server.close()


def receiver_main(conn: Any, received: Any, blackhole_backlog: int) -> None:
    import uvloop

    uvloop.run(_receiver_serve(conn, received, blackhole_backlog))


# ----------------------------------------------------------------------------------------
# The load generator (own process): a minimal HTTP/1.1 keep-alive client
# ----------------------------------------------------------------------------------------


class _Client(asyncio.Protocol):
    """One keep-alive connection; one request at a time; Content-Length responses only."""

    def __init__(self) -> None:
        self.buf = bytearray()
        self.transport: asyncio.Transport | None = None
        self.waiter: asyncio.Future[tuple[int, bytes]] | None = None
        self.lost = False

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]

    def connection_lost(self, exc: Exception | None) -> None:
        self.lost = True
        if self.waiter is not None and not self.waiter.done():
            self.waiter.set_exception(ConnectionError("connection lost"))

    def data_received(self, data: bytes) -> None:
        self.buf += data
        if self.waiter is None:
            return
        buf = self.buf
        end = buf.find(b"\r\n\r\n")
        if end < 0:
            return
        head = bytes(buf[:end])
        i = head.lower().find(b"\r\ncontent-length:")
        if i < 0:
            self.waiter.set_exception(ConnectionError("response without Content-Length"))
            self.waiter = None
            return
        j = head.find(b"\r\n", i + 2)
        length = int(head[i + 17 : j if j >= 0 else len(head)])
        if len(buf) < end + 4 + length:
            return
        body = bytes(buf[end + 4 : end + 4 + length])
        del buf[: end + 4 + length]
        waiter, self.waiter = self.waiter, None
        if not waiter.done():
            waiter.set_result((int(head[9:12]), body))

    async def request(self, data: bytes) -> tuple[int, bytes]:
        if self.lost or self.transport is None or self.transport.is_closing():
            raise ConnectionError("connection closed")
        self.waiter = asyncio.get_running_loop().create_future()
        self.transport.write(data)
        return await self.waiter

    def close(self) -> None:
        if self.transport is not None:
            self.transport.close()


class _Pool:
    def __init__(self, port: int) -> None:
        self.port = port
        self.head = (
            f"Host: 127.0.0.1:{port}\r\nAuthorization: {AUTH}\r\nContent-Type: application/json\r\n"
        )

    async def connect(self) -> _Client:
        loop = asyncio.get_running_loop()
        _, client = await loop.create_connection(_Client, "127.0.0.1", self.port)
        return client

    def request_bytes(self, path: str, body: bytes) -> bytes:
        return (
            f"POST {path} HTTP/1.1\r\n{self.head}Content-Length: {len(body)}\r\n\r\n".encode()
            + body
        )


async def _send(
    pool: _Pool, client: _Client, data: bytes
) -> tuple[_Client, int | None, str | None]:
    """Send one request; on any failure reconnect; return (client, status, error)."""
    try:
        async with asyncio.timeout(REQUEST_TIMEOUT):
            status, _ = await client.request(data)
        return client, status, None
    except (TimeoutError, OSError, ConnectionError, RuntimeError) as error:
        client.close()
        with contextlib.suppress(OSError):
            client = await pool.connect()
        return client, None, type(error).__name__


async def job_ingest(
    received: Any,
    *,
    port: int,
    path: str,
    clients: int,
    batch: int,
    duration: float,
    prefix: str,
    max_events: int | None = None,
    window: int | None = None,
    keep_ids: bool = False,
    sample_every: float = 0.5,
) -> dict[str, Any]:
    """Closed-loop ingestion: `clients` connections, each POSTing as soon as answered.

    `batch` messages per request (/v1/batch), or one bare message when path is a single
    endpoint. Stops at `duration` seconds or after `max_events` accepted events. With
    `window`, a client waits while acked - received >= window (sustained end-to-end mode).
    """
    pool = _Pool(port)
    conns = [await pool.connect() for _ in range(clients)]
    single = not path.endswith("/batch")
    state = {"acked": 0, "claimed": 0, "requests": 0, "seq": 0}
    errors: Counter[str] = Counter()
    latencies: list[float] = []
    ids_kept: list[str] = []
    samples: list[tuple[float, int, int]] = []
    t0 = time.monotonic()
    end = t0 + duration

    async def worker(client: _Client) -> None:
        while True:
            if time.monotonic() >= end:
                break
            n = 1 if single else batch
            if max_events is not None:
                n = min(n, max_events - state["claimed"])
                if n <= 0:
                    break
            state["claimed"] += n
            if window is not None:
                while state["acked"] - received.value >= window and time.monotonic() < end:
                    await asyncio.sleep(0.002)
            seq = state["seq"]
            state["seq"] += n
            body, ids = single_body(prefix, seq) if single else batch_body(prefix, n, seq)
            data = pool.request_bytes(path, body)
            started = time.monotonic()
            client, status, error = await _send(pool, client, data)
            state["requests"] += 1
            if status == 200:
                state["acked"] += n
                latencies.append(time.monotonic() - started)
                if keep_ids:
                    ids_kept.extend(ids)
            else:
                state["claimed"] -= n  # not accepted: may be sent again (with new ids)
                errors[error or f"HTTP {status}"] += 1
                if error is not None:
                    await asyncio.sleep(0.05)
        client.close()

    async def sampler() -> None:
        while time.monotonic() < end + 1:
            samples.append((time.monotonic() - t0, state["acked"], received.value))
            await asyncio.sleep(sample_every)

    sampling = asyncio.create_task(sampler())
    await asyncio.gather(*(worker(c) for c in conns))
    elapsed = time.monotonic() - t0
    samples.append((elapsed, state["acked"], received.value))
    sampling.cancel()
    latencies.sort()
    return {
        "acked": state["acked"],
        "requests": state["requests"],
        "elapsed": elapsed,
        "errors": dict(errors),
        "request_p50_ms": _pct(latencies, 50) * 1000 if latencies else None,
        "request_p99_ms": _pct(latencies, 99) * 1000 if latencies else None,
        "samples": samples,
        "ids": ids_kept,
    }


async def job_paced(
    received: Any, *, port: int, rate: float, duration: float, prefix: str, max_conns: int = 256
) -> dict[str, Any]:
    """Open-loop /v1/track at `rate` messages/s; returns send and ack times per messageId."""
    pool = _Pool(port)
    idle: list[_Client] = [await pool.connect() for _ in range(32)]
    opened = len(idle)
    sends: dict[str, float] = {}
    acks: dict[str, float] = {}
    errors: Counter[str] = Counter()
    late = 0
    tasks: set[asyncio.Task[None]] = set()
    total = int(rate * duration)

    async def one(seq: int) -> None:
        nonlocal opened
        if idle:
            client = idle.pop()
        else:
            opened += 1
            client = await pool.connect()
        body, ids = single_body(prefix, seq)
        data = pool.request_bytes("/v1/track", body)
        sends[ids[0]] = time.monotonic()
        client, status, error = await _send(pool, client, data)
        if status == 200:
            acks[ids[0]] = time.monotonic()
        else:
            errors[error or f"HTTP {status}"] += 1
        idle.append(client)

    t0 = time.monotonic()
    for seq in range(total):
        delay = t0 + seq / rate - time.monotonic()
        if delay > 0:
            await asyncio.sleep(delay)
        elif delay < -0.005:
            late += 1
        if len(tasks) >= max_conns:
            errors["skipped: too many in flight"] += 1
            continue
        task = asyncio.create_task(one(seq))
        tasks.add(task)
        task.add_done_callback(tasks.discard)
    if tasks:
        await asyncio.wait(set(tasks), timeout=REQUEST_TIMEOUT + 5)
    elapsed = time.monotonic() - t0
    for client in idle:
        client.close()
    return {
        "offered": total,
        "elapsed": elapsed,
        "sends": sends,
        "acks": acks,
        "errors": dict(errors),
        "late_sends": late,
        "connections": opened,
    }


async def job_bare(
    received: Any, *, url: str, duration: float, concurrency: int, body: bytes
) -> dict[str, Any]:
    """The delivery stack's limit: aiohttp POSTing the same signed body to the receiver."""
    import aiohttp

    count = 0
    errors: Counter[str] = Counter()
    connector = aiohttp.TCPConnector(limit=0)
    timeout = aiohttp.ClientTimeout(total=None, connect=None, sock_read=None)
    async with aiohttp.ClientSession(
        connector=connector, timeout=timeout, auto_decompress=False, trust_env=False
    ) as session:
        t0 = time.monotonic()
        end = t0 + duration

        async def worker() -> None:
            nonlocal count
            while time.monotonic() < end:
                signature = hmac.new(SECRET.encode(), body, hashlib.sha1).hexdigest()
                headers = {
                    "User-Agent": "efd/1.0",
                    "Content-Type": "application/json",
                    "X-Signature": signature,
                }
                try:
                    async with asyncio.timeout(REQUEST_TIMEOUT):
                        async with session.post(
                            url, data=body, headers=headers, allow_redirects=False
                        ) as response:
                            await response.read()
                            if response.status == 200:
                                count += 1
                            else:
                                errors[f"HTTP {response.status}"] += 1
                except (TimeoutError, aiohttp.ClientError, OSError) as error:
                    errors[type(error).__name__] += 1

        await asyncio.gather(*(worker() for _ in range(concurrency)))
        elapsed = time.monotonic() - t0
    return {"count": count, "elapsed": elapsed, "errors": dict(errors)}


JOBS = {"ingest": job_ingest, "paced": job_paced, "bare": job_bare}


def generator_main(conn: Any, received: Any) -> None:
    import uvloop

    conn.send({"pid": os.getpid()})
    while True:
        if not conn.poll(3600):
            return
        cmd = conn.recv()
        if cmd is None:
            return
        name, kwargs = cmd
        try:
            job: Any = JOBS[name]
            result = uvloop.run(job(received, **kwargs))
        except Exception as error:  # reported to the orchestrator, which shows it
            result = {"error": f"{type(error).__name__}: {error}"}
        conn.send(result)


# ----------------------------------------------------------------------------------------
# Orchestration
# ----------------------------------------------------------------------------------------


def _p99_by_second(acks: dict[str, float], receipts: dict[str, float]) -> list[float]:
    """The ack-to-receipt p99 of the messages acknowledged in each second: shows whether the
    tail is spread out or comes in bursts (a checkpoint, a pause, another tenant)."""
    if not acks:
        return []
    start = min(acks.values())
    seconds: dict[int, list[float]] = {}
    for mid, acked in acks.items():
        if mid in receipts:
            seconds.setdefault(int(acked - start), []).append(receipts[mid] - acked)
    return [_round(_pct(sorted(seconds.get(i, [0.0])), 99) * 1000) for i in range(max(seconds) + 1)]


def _pct(sorted_values: list[float], p: float) -> float:
    if not sorted_values:
        return float("nan")
    k = (len(sorted_values) - 1) * p / 100
    lo = int(k)
    hi = min(lo + 1, len(sorted_values) - 1)
    return sorted_values[lo] + (sorted_values[hi] - sorted_values[lo]) * (k - lo)


def _process_tree(pid: int) -> list[int]:
    """`pid` and its descendants (efd's sender processes are children of the daemon)."""
    tree = [pid]
    for parent in tree:
        with contextlib.suppress(OSError):
            for task in os.listdir(f"/proc/{parent}/task"):
                with open(f"/proc/{parent}/task/{task}/children") as handle:
                    tree.extend(int(child) for child in handle.read().split())
    return tree


def _own_cpu_seconds(pid: int) -> float:
    try:
        with open(f"/proc/{pid}/stat") as handle:
            fields = handle.read().rsplit(")", 1)[1].split()
    except OSError:
        return float("nan")
    return (int(fields[11]) + int(fields[12])) / CLK_TCK


def cpu_seconds(pid: int) -> float:
    """utime + stime of a process (all its threads) and its child processes, in seconds."""
    return sum(_own_cpu_seconds(p) for p in _process_tree(pid))


def machine_cpu_seconds() -> dict[str, float]:
    """CPU seconds of the whole machine (all cores) from /proc/stat: time in processes
    (user, nice, system), in interrupts (irq, softirq: loopback networking lands partly
    here), and stolen by the hypervisor (steal: other virtual machines on the host)."""
    with open("/proc/stat") as handle:
        f = [int(x) for x in handle.readline().split()[1:]]
    return {
        "processes": (f[0] + f[1] + f[2]) / CLK_TCK,
        "irq": (f[5] + f[6]) / CLK_TCK,
        "steal": f[7] / CLK_TCK,
    }


def memory_mb(pid: int) -> dict[str, float]:
    """VmRSS and VmHWM of a process and its child processes, summed, in MB."""
    out: dict[str, float] = {}
    for p in _process_tree(pid):
        with contextlib.suppress(OSError), open(f"/proc/{p}/status") as handle:
            for line in handle:
                key, _, value = line.partition(":")
                if key in ("VmRSS", "VmHWM"):
                    out[key] = round(out.get(key, 0.0) + int(value.split()[0]) / 1024, 1)
    return out


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class Worker:
    """A child process driven over a pipe."""

    def __init__(self, ctx: Any, target: Any, *args: Any) -> None:
        self.conn, child = ctx.Pipe()
        self.process = ctx.Process(target=target, args=(child, *args), daemon=True)
        self.process.start()
        if not self.conn.poll(60):
            raise RuntimeError(f"{target.__name__} did not start")
        self.hello = self.conn.recv()
        self.pid: int = self.hello["pid"]

    def call(self, *cmd: Any, timeout: float = 60) -> Any:
        self.conn.send(cmd)
        if not self.conn.poll(timeout):
            raise TimeoutError(f"no answer to {cmd[0]!r} in {timeout} s")
        return self.conn.recv()

    def job(self, name: str, timeout: float, **kwargs: Any) -> dict[str, Any]:
        self.conn.send((name, kwargs))
        if not self.conn.poll(timeout):
            raise TimeoutError(f"job {name!r} gave no answer in {timeout} s")
        result = self.conn.recv()
        assert isinstance(result, dict)
        if "error" in result:
            raise RuntimeError(f"job {name!r} failed: {result['error']}")
        return result

    def stop(self, message: Any) -> None:
        with contextlib.suppress(OSError, BrokenPipeError):
            self.conn.send(message)
        self.process.join(5)
        if self.process.is_alive():
            self.process.kill()
            self.process.join(5)


class Daemon:
    """`python -m efd serve` on a fresh SQLite database in its own directory."""

    def __init__(self, name: str, root: Path, delivery: dict[str, Any], hook_url: str) -> None:
        self.name = name
        self.dir = root / name
        self.dir.mkdir(parents=True)
        self.db = self.dir / "efd.db"
        self.port = free_port()
        self.log_path = self.dir / "efd.log"
        lines = [
            "[server]",
            'host = "127.0.0.1"',
            f"port = {self.port}",
            "[storage]",
            f'url = "sqlite:///{self.db}"',
            "[delivery]",
            'allowed_networks = ["127.0.0.0/8"]',
            'user_agent = "efd-bench/1.0"',
            *(f"{k} = {json.dumps(v)}" for k, v in delivery.items()),
            "[logging]",
            'level = "INFO"',
            "[[sources]]",
            'name = "bench"',
            f'write_key = "{WRITE_KEY}"',
            'destinations = ["receiver"]',
            "[[destinations]]",
            'name = "receiver"',
            'type = "webhooks"',
            f'shared_secret = "{SECRET}"',
            "[[destinations.hooks]]",
            f'url = "{hook_url}"',
        ]
        self.config = self.dir / "efd.toml"
        self.config.write_text("\n".join(lines) + "\n")
        self._log = self.log_path.open("wb")
        started = time.monotonic()
        self.process = subprocess.Popen(
            [sys.executable, "-m", "efd", "serve", "--config", str(self.config)],
            cwd=self.dir,
            stdout=self._log,
            stderr=subprocess.STDOUT,
            env={**os.environ, "PYTHONUNBUFFERED": "1"},
        )
        self.pid = self.process.pid
        deadline = time.monotonic() + 60
        while True:
            if self.process.poll() is not None:
                raise RuntimeError(f"efd ({name}) exited at start-up:\n{self.log_tail()}")
            try:
                with urllib.request.urlopen(
                    f"http://127.0.0.1:{self.port}/healthz", timeout=2
                ) as response:
                    if response.status == 200:
                        break
            except OSError:
                pass
            if time.monotonic() > deadline:
                raise RuntimeError(f"efd ({name}) not ready in 60 s:\n{self.log_tail()}")
            time.sleep(0.05)
        self.startup_seconds = time.monotonic() - started

    def log_tail(self, lines: int = 30) -> str:
        with contextlib.suppress(OSError):
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])
        return ""

    def first_error(self, lines: int = 20) -> list[str]:
        """The first ERROR or Traceback in the log and the lines after it."""
        with contextlib.suppress(OSError):
            text = self.log_path.read_text(errors="replace").splitlines()
            for i, line in enumerate(text):
                if " ERROR " in line or line.startswith("Traceback"):
                    return text[i : i + lines]
        return []

    def log_counts(self) -> dict[str, int]:
        counts: Counter[str] = Counter()
        with contextlib.suppress(OSError), self.log_path.open(errors="replace") as handle:
            for line in handle:
                for level in ("WARNING", "ERROR", "CRITICAL", "Traceback"):
                    if f" {level} " in line or line.startswith(level):
                        counts[level] += 1
        return dict(counts)

    def pending(self) -> int:
        with contextlib.closing(sqlite3.connect(f"file:{self.db}?mode=ro", uri=True)) as db:
            db.execute("PRAGMA busy_timeout=10000")
            return int(
                db.execute("SELECT count(*) FROM deliveries WHERE status = 'pending'").fetchone()[0]
            )

    def stop(self, grace: float = 15) -> dict[str, Any]:
        started = time.monotonic()
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(grace)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait(10)
        self._log.close()
        return {"exit_code": self.process.returncode, "stop_seconds": time.monotonic() - started}


class Profiler:
    """py-spy record of the daemon during one phase (only with --profile)."""

    def __init__(self, enabled: bool, out_dir: Path, gil: bool = False) -> None:
        self.enabled = enabled and shutil.which("py-spy", path=str(Path(sys.executable).parent))
        self.out_dir = out_dir
        self.gil = gil
        self.exe = str(Path(sys.executable).parent / "py-spy")

    @contextlib.contextmanager
    def record(self, name: str, pid: int, seconds: float) -> Iterator[None]:
        if not self.enabled:
            yield
            return
        self.out_dir.mkdir(parents=True, exist_ok=True)
        raw = self.out_dir / f"{name}{'.gil' if self.gil else ''}.txt"
        proc = subprocess.Popen(
            [
                self.exe, "record", "--pid", str(pid), "--rate", "100",
                "--duration", str(max(1, int(seconds))), "--threads",
                "--format", "raw", "-o", str(raw), *(["--gil"] if self.gil else []),
            ],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )  # fmt: skip
        time.sleep(0.3)  # let it attach
        try:
            yield
        finally:
            # A phase may end before the recording would: stop it now (py-spy writes the
            # file on SIGINT), so the profiler never stretches a phase.
            if proc.poll() is None:
                proc.send_signal(signal.SIGINT)
            try:
                proc.wait(15)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(5)


@dataclass
class Bench:
    plan: Plan
    quick: bool
    only: set[str]
    root: Path
    profiler: Profiler
    receiver: Worker
    generator: Worker
    received: Any
    results: dict[str, Any] = field(default_factory=dict)
    phases: dict[str, Any] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)
    daemon: Daemon | None = None
    keep: bool = False  # keep the temp dir (a daemon logged errors)

    # -- helpers -----------------------------------------------------------------------------

    @contextlib.contextmanager
    def phase(self, name: str, *, second_daemon: int | None = None) -> Iterator[dict[str, Any]]:
        pids = {
            "orchestrator": os.getpid(),
            "receiver": self.receiver.pid,
            "generator": self.generator.pid,
        }
        if self.daemon is not None:
            pids["daemon"] = self.daemon.pid
        if second_daemon is not None:
            pids["daemon2"] = second_daemon

        # A daemon's figure includes its sender processes; the others are single processes
        # (the orchestrator's children are the receiver, generator and daemons themselves).
        def cpu(key: str, pid: int) -> float:
            return cpu_seconds(pid) if key.startswith("daemon") else _own_cpu_seconds(pid)

        before = {k: cpu(k, p) for k, p in pids.items()}
        machine_before = machine_cpu_seconds()
        info: dict[str, Any] = {}
        started = time.monotonic()
        print(f"  {name} ...", end="", flush=True)
        yield info
        elapsed = time.monotonic() - started
        info["seconds"] = round(elapsed, 2)
        used = {k: (cpu(k, p) - before[k]) / elapsed * 100 for k, p in pids.items()}
        machine = {
            k: (v - machine_before[k]) / elapsed * 100 for k, v in machine_cpu_seconds().items()
        }
        # Everything else on the machine (other users' jobs, py-spy): a noisy-run flag.
        used["other"] = max(0.0, machine["processes"] - sum(used.values()))
        used["irq"] = machine["irq"]
        used["steal"] = machine["steal"]
        info["cpu_pct"] = {k: round(v, 1) for k, v in used.items()}
        # The daemon's CPU per event: steadier than a rate when other jobs share the machine.
        events = info.get("events") or info.get("delivered")
        if "daemon" in used and events:
            info["daemon_cpu_us_per_event"] = round(
                used["daemon"] / 100 * elapsed / events * 1e6, 1
            )
        self.phases[name] = info
        if used["other"] + used["steal"] > 25:
            self.notes.append(
                f"{name}: other processes used {used['other']:.0f}% CPU and the hypervisor "
                f"stole {used['steal']:.0f}%: this figure is perturbed"
            )
        if info.get("errors"):
            self.notes.append(f"{name}: request errors {info['errors']}")
        shown = " ".join(f"{k}={v:.0f}" for k, v in used.items())
        print(f" {elapsed:.1f} s  cpu% {shown}")

    def wait_received(self, target: int, cap: float) -> tuple[bool, float]:
        started = time.monotonic()
        while self.received.value < target:
            if time.monotonic() - started > cap:
                return False, time.monotonic() - started
            time.sleep(0.02)
        return True, time.monotonic() - started

    def ingest_job(
        self, port: int, *, clients: int, seconds: float, path: str = "/v1/batch", **extra: Any
    ) -> dict[str, Any]:
        """The generator's closed-loop ingestion (job_ingest) against `port`, 100 a batch."""
        return self.generator.job(
            "ingest",
            seconds + 120,
            port=port,
            path=path,
            clients=clients,
            batch=self.plan.batch_size,
            duration=seconds,
            **extra,
        )

    def start_daemon(self, name: str, delivery: dict[str, Any], hook_url: str) -> Daemon:
        self.daemon = Daemon(name, self.root, delivery, hook_url)
        self.phases[f"{name}_startup"] = {"seconds": round(self.daemon.startup_seconds, 2)}
        return self.daemon

    def stop_daemon(self) -> None:
        assert self.daemon is not None
        daemon = self.daemon
        info = daemon.stop()
        info["log_lines"] = daemon.log_counts()
        if info["log_lines"].get("ERROR") or info["log_lines"].get("Traceback"):
            info["first_error"] = daemon.first_error()
            self.keep = True
            self.notes.append(
                f"daemon {daemon.name}: {info['log_lines']} in its log ({daemon.log_path}, "
                "kept; the first is in context.phases)"
            )
        info["log_tail"] = daemon.log_tail(5).splitlines()
        self.phases[f"{daemon.name}_stop"] = info
        self.daemon = None

    # -- phases ------------------------------------------------------------------------------

    def limits(self) -> None:
        plan = self.plan
        with self.phase("sqlite_raw") as info:
            raw = sqlite_raw(
                self.root / "raw.db", plan.sqlite_seconds, plan.sqlite_max_rows, indexes=False
            )
            info.update(raw)
        self.results["sqlite_raw_rows_per_s"] = raw["events_per_s"]
        with self.phase("sqlite_raw_efd_schema") as info:
            raw = sqlite_raw(
                self.root / "raw-idx.db", plan.sqlite_seconds, plan.sqlite_max_rows, indexes=True
            )
            info.update(raw)
        self.results["sqlite_raw_efd_schema_rows_per_s"] = raw["events_per_s"]
        with self.phase("sqlalchemy_core") as info:
            core = sqlalchemy_core(self.root / "core.db", plan.sqlite_seconds, plan.sqlite_max_rows)
            info.update(core)
        self.results["sqlalchemy_core_events_per_s"] = core["events_per_s"]
        port = self.receiver.hello["port"]
        with self.phase("bare_post") as info:
            bare = self.generator.job(
                "bare",
                plan.bare_seconds + 60,
                url=f"http://127.0.0.1:{port}/bare",
                duration=plan.bare_seconds,
                concurrency=plan.bare_concurrency,
                body=sample_webhook_body(),
            )
            info.update({k: bare[k] for k in ("count", "errors")})
        self.results["bare_post_per_s"] = round(bare["count"] / bare["elapsed"], 1)

    def ingest_rate(self, name: str, path: str, clients: int, prefix: str) -> dict[str, Any]:
        assert self.daemon is not None
        plan = self.plan
        with (
            self.phase(name) as info,
            self.profiler.record(name, self.daemon.pid, plan.ingest_seconds),
        ):
            out = self.ingest_job(
                self.daemon.port,
                clients=clients,
                seconds=plan.ingest_seconds,
                path=path,
                prefix=prefix,
            )
            rate = out["acked"] / out["elapsed"]
            info.update(
                events=out["acked"],
                requests=out["requests"],
                errors=out["errors"],
                request_p50_ms=_round(out["request_p50_ms"]),
                request_p99_ms=_round(out["request_p99_ms"]),
                events_per_s=round(rate, 1),
            )
        return info

    def ingest_and_backlog(self) -> None:
        plan = self.plan
        blackhole = self.receiver.hello["blackhole_port"]
        daemon = self.start_daemon("ingest", INGEST_DELIVERY, f"http://127.0.0.1:{blackhole}/hook")
        try:
            # A short warm-up first (the daemon's first requests are slower: caches, the
            # first WAL growth, allocator): not counted, reported in context.phases.
            with self.phase("ingest_warmup") as info:
                out = self.ingest_job(
                    daemon.port,
                    clients=plan.batch_clients,
                    seconds=plan.warmup_seconds,
                    prefix="iw",
                )
                info.update(events=out["acked"], errors=out["errors"])
            batch = self.ingest_rate("ingest_batch", "/v1/batch", plan.batch_clients, "ib")
            self.results["ingest_batch_events_per_s"] = batch["events_per_s"]
            single = self.ingest_rate("ingest_single", "/v1/track", plan.single_clients, "is")
            self.results["ingest_single_events_per_s"] = single["events_per_s"]
            if "backlog" not in self.only:
                return
            with self.phase("backlog_fill") as info:
                have = daemon.pending()
                need = max(0, plan.backlog_target - have)
                out = self.ingest_job(
                    daemon.port,
                    clients=plan.fill_clients,
                    seconds=plan.backlog_fill_cap_seconds,
                    max_events=need,
                    prefix="fill",
                )
                pending = daemon.pending()
                info.update(
                    events=out["acked"],
                    errors=out["errors"],
                    events_per_s=round(out["acked"] / out["elapsed"], 1),
                    pending_after=pending,
                    db_mb=round(_db_bytes(daemon.db) / 2**20, 1),
                    rss=memory_mb(daemon.pid),
                )
            if pending < plan.backlog_target:
                self.notes.append(
                    f"backlog: reached {pending:,} pending deliveries, not "
                    f"{plan.backlog_target:,}: the fill is capped at "
                    f"{plan.backlog_fill_cap_seconds:g} s"
                )
            if self.quick:
                self.notes.append(
                    f"--quick: backlog of {pending:,} pending deliveries, not 1,000,000"
                )
            backlog = self.paired_backlog_rate(daemon, blackhole)
            memory = memory_mb(daemon.pid)
            self.phases["ingest_batch_backlog"]["rss"] = memory
            self.phases["ingest_batch_backlog"]["pending_before"] = pending
            self.results["backlog_pending"] = pending
            self.results["backlog_ingest_ratio"] = backlog["ratio"]
            if batch["events_per_s"]:
                # The unpaired figure, for comparison: minutes apart, so machine drift shows.
                self.results["backlog_ingest_ratio_sequential"] = round(
                    backlog["events_per_s"] / batch["events_per_s"], 3
                )
            self.results["rss_mb_backlog"] = memory.get("VmRSS")
            self.results["rss_mb_backlog_peak"] = memory.get("VmHWM")
        finally:
            self.receiver.call("close_blackhole")  # the hung request fails fast at stop
            self.stop_daemon()

    def paired_backlog_rate(self, daemon: Daemon, blackhole: int) -> dict[str, Any]:
        """The /v1/batch rate of `daemon` (its backlog filled) and of a second daemon on an
        empty store, measured in alternating slices: the ratio of the two.

        This machine's speed drifts by 20 % or more over a minute (other tenants), and the
        empty-store figure is taken minutes before the backlog is full. Slices a few seconds
        long, in the order ABBA ABBA…, cancel that drift: both daemons see the same machine.
        """
        plan = self.plan
        fresh = Daemon(
            "ingest_fresh", self.root, INGEST_DELIVERY, f"http://127.0.0.1:{blackhole}/hook"
        )
        self.phases["ingest_fresh_startup"] = {"seconds": round(fresh.startup_seconds, 2)}
        sides = {"backlog": daemon, "fresh": fresh}
        totals = {side: {"events": 0, "seconds": 0.0, "cpu": 0.0} for side in sides}

        def ingest(side: str, seconds: float, prefix: str) -> dict[str, Any]:
            target = sides[side]
            cpu_before = cpu_seconds(target.pid)
            out = self.ingest_job(
                target.port,
                clients=plan.batch_clients,
                seconds=seconds,
                prefix=prefix,
            )
            out["cpu"] = cpu_seconds(target.pid) - cpu_before
            return out

        try:
            ingest("fresh", plan.warmup_seconds, "ibw")  # not counted, as for ingest_batch
            with (
                self.phase("ingest_batch_backlog", second_daemon=fresh.pid) as info,
                self.profiler.record(
                    "ingest_batch_backlog", daemon.pid, 2 * plan.pair_seconds * plan.pairs
                ),
            ):
                for i in range(plan.pairs):
                    order = ("fresh", "backlog") if i % 2 == 0 else ("backlog", "fresh")
                    for side in order:
                        out = ingest(side, plan.pair_seconds, f"ib{side[0]}{i}-")
                        totals[side]["events"] += out["acked"]
                        totals[side]["seconds"] += out["elapsed"]
                        totals[side]["cpu"] += out["cpu"]
                        if out["errors"]:
                            info.setdefault("errors", {}).update(out["errors"])
                rates = {
                    side: t["events"] / t["seconds"] if t["seconds"] else 0.0
                    for side, t in totals.items()
                }
                info.update(
                    events=totals["backlog"]["events"],
                    events_per_s=round(rates["backlog"], 1),
                    fresh_events_per_s=round(rates["fresh"], 1),
                    pairs=plan.pairs,
                    pair_seconds=plan.pair_seconds,
                    daemon_cpu_us_per_event_fresh=round(
                        totals["fresh"]["cpu"] / max(1, totals["fresh"]["events"]) * 1e6, 1
                    ),
                )
            info["daemon_cpu_us_per_event"] = round(
                totals["backlog"]["cpu"] / max(1, totals["backlog"]["events"]) * 1e6, 1
            )
        finally:
            stopped = fresh.stop()
            stopped["log_lines"] = fresh.log_counts()
            self.phases["ingest_fresh_stop"] = stopped
        ratio = round(rates["backlog"] / rates["fresh"], 3) if rates["fresh"] else 0.0
        return {"events_per_s": rates["backlog"], "ratio": ratio}

    def deliver_and_latency(self) -> None:
        port = self.receiver.hello["port"]
        daemon = self.start_daemon(
            "deliver",
            {"timeout_seconds": 5, "retry_initial_seconds": 0.5, "retry_max_seconds": 2},
            f"http://127.0.0.1:{port}/hook",
        )
        try:
            if "deliver" in self.only:
                self.deliver(daemon)
            if "latency" in self.only:
                self.latency(daemon)
            self.results["rss_mb_after_delivery"] = memory_mb(daemon.pid).get("VmRSS")
        finally:
            self.stop_daemon()

    def deliver(self, daemon: Daemon) -> None:
        plan = self.plan
        self.receiver.call("reset")
        total = plan.deliver_warmup_seconds + plan.deliver_seconds
        with self.phase("deliver") as info, self.profiler.record("deliver", daemon.pid, total):
            out = self.ingest_job(
                daemon.port,
                clients=plan.deliver_clients,
                seconds=total,
                prefix="dl",
                window=plan.deliver_window,
                sample_every=0.25,
            )
            samples = out["samples"]
            start = _sample_at(samples, plan.deliver_warmup_seconds)
            stop = _sample_at(samples, total)
            rate = (stop[2] - start[2]) / max(stop[0] - start[0], 1e-3)
            acked = out["acked"]
            drained, drain_seconds = self.wait_received(acked, plan.settle_cap_seconds)
            time.sleep(0.5)  # late duplicates
            stats = self.receiver.call("stats")
            info.update(
                delivered=stats["unique"],
                events_acked=acked,
                window=[round(start[0], 2), round(stop[0], 2)],
                received_in_window=stop[2] - start[2],
                ingest_events_per_s_in_window=round(
                    (stop[1] - start[1]) / max(stop[0] - start[0], 1e-3), 1
                ),
                errors=out["errors"],
                drained=drained,
                drain_seconds=round(drain_seconds, 2),
                receiver=stats,
            )
        self.results["deliver_events_per_s"] = round(rate, 1)
        self.results["deliver_lost"] = acked - stats["unique"]
        self.results["deliver_duplicates"] = stats["duplicates"]
        if stats["bad_signatures"]:
            self.notes.append(f"deliver: {stats['bad_signatures']} sampled signatures were wrong")

    def latency(self, daemon: Daemon) -> None:
        plan = self.plan
        with (
            self.phase("latency") as info,
            self.profiler.record("latency", daemon.pid, plan.latency_seconds),
        ):
            out = self.generator.job(
                "paced",
                plan.latency_seconds + 120,
                port=daemon.port,
                rate=plan.latency_rate,
                duration=plan.latency_seconds,
                prefix="lat",
            )
            acks: dict[str, float] = out["acks"]
            deadline = time.monotonic() + plan.settle_cap_seconds
            receipts: dict[str, float] = {}
            while time.monotonic() < deadline:
                receipts = self.receiver.call("receipts", "lat-")
                if len(receipts) >= len(acks):
                    break
                time.sleep(0.2)
            from_ack = sorted(receipts[m] - t for m, t in acks.items() if m in receipts)
            from_send = sorted(receipts[m] - out["sends"][m] for m in acks if m in receipts)
            info.update(
                offered=out["offered"],
                acked=len(acks),
                received=sum(1 for m in acks if m in receipts),
                errors=out["errors"],
                late_sends=out["late_sends"],
                achieved_rate=round(out["offered"] / out["elapsed"], 1),
                ack_to_receipt_ms={
                    p: _round(_pct(from_ack, p) * 1000) for p in (0, 50, 90, 99, 99.9, 100)
                },
                send_to_receipt_ms={p: _round(_pct(from_send, p) * 1000) for p in (50, 99)},
                receipt_before_ack=sum(1 for v in from_ack if v < 0),
                ack_to_receipt_p99_ms_by_second=_p99_by_second(acks, receipts),
            )
        # A receipt can precede the ack reaching the client (efd wakes the dispatcher
        # before the response is written); such latencies count as 0.
        clipped = [max(0.0, v) for v in from_ack]
        self.results["latency_p50_ms"] = _round(_pct(clipped, 50) * 1000)
        self.results["latency_p99_ms"] = _round(_pct(clipped, 99) * 1000)
        self.results["latency_missing"] = len(acks) - len(from_ack)

    def recovery(self) -> None:
        plan = self.plan
        port = self.receiver.hello["port"]
        daemon = self.start_daemon(
            "recovery",
            {"timeout_seconds": 5, "retry_initial_seconds": 0.5, "retry_max_seconds": 2},
            f"http://127.0.0.1:{port}/hook",
        )
        try:
            self.receiver.call("reset")
            self.receiver.call("status", 503)
            n = plan.recovery_messages
            with (
                self.phase("recovery_accept") as info,
                self.profiler.record(
                    "recovery_accept", daemon.pid, min(plan.recovery_accept_cap_seconds, 15)
                ),
            ):
                out = self.ingest_job(
                    daemon.port,
                    clients=plan.batch_clients,
                    seconds=plan.recovery_accept_cap_seconds,
                    max_events=n,
                    prefix="rec",
                    keep_ids=True,
                )
                acked_ids: list[str] = out["ids"]
                info.update(
                    accepted=len(acked_ids),
                    events_per_s=round(len(acked_ids) / out["elapsed"], 1),
                    errors=out["errors"],
                    answered_503_at_accepted=self.receiver.call("stats")["hook_503"],
                )
                # Stay down until every accepted message has met at least one 503 (as many
                # 503 answers as messages), so the drain is a drain of retries.
                deadline = time.monotonic() + plan.recovery_attempt_cap_seconds
                while time.monotonic() < deadline:
                    stats = self.receiver.call("stats")
                    if stats["hook_503"] >= len(acked_ids):
                        break
                    time.sleep(0.1)
                info.update(answered_503=stats["hook_503"], pending=daemon.pending())
            if len(acked_ids) < n:
                self.notes.append(
                    f"recovery: only {len(acked_ids):,} of {n:,} messages accepted in "
                    f"{plan.recovery_accept_cap_seconds:g} s"
                )
            if self.quick:
                self.notes.append(f"--quick: recovery with {n:,} messages, not 50,000")
            with (
                self.phase("recovery_drain") as info,
                self.profiler.record(
                    "recovery_drain", daemon.pid, min(plan.recovery_drain_cap_seconds, 20)
                ),
            ):
                self.receiver.call("status", 200)
                drained, seconds = self.wait_received(
                    len(acked_ids), plan.recovery_drain_cap_seconds
                )
                time.sleep(2.5)  # let retries already in flight (duplicates) arrive
                stats = self.receiver.call("stats")
                missing = self.receiver.call("missing", acked_ids, timeout=120)
                info.update(
                    drained=drained,
                    drain_seconds=round(seconds, 2),
                    receiver=stats,
                    pending_after=daemon.pending(),
                    missing_sample=missing[:5],
                )
            if acked_ids:
                self.results["recovery_events_per_s"] = round(
                    (len(acked_ids) - len(missing)) / max(seconds, 1e-3), 1
                )
            self.results["recovery_messages"] = len(acked_ids)
            self.results["lost"] = len(missing)
            self.results["duplicates"] = stats["duplicates"]
        finally:
            self.receiver.call("status", 200)
            self.stop_daemon()


def _round(value: float | None, digits: int = 2) -> float | None:
    if value is None or value != value:
        return None
    return round(value, digits)


def _sample_at(samples: list[tuple[float, int, int]], t: float) -> tuple[float, int, int]:
    """The last sample taken at or before t (samples are (elapsed, acked, received))."""
    best = samples[0]
    for sample in samples:
        if sample[0] <= t:
            best = sample
    return best


def _db_bytes(db: Path) -> int:
    return sum(p.stat().st_size for p in db.parent.glob(db.name + "*") if p.is_file())


# -- storage limits -----------------------------------------------------------------------


def _create_schema(path: Path, *, indexes: bool = True) -> None:
    """efd's tables (from efd.store.schema); without `indexes`, primary keys only."""
    from sqlalchemy import create_engine

    from efd.store.schema import metadata

    engine = create_engine(f"sqlite:///{path}")
    metadata.create_all(engine)
    engine.dispose()
    if not indexes:
        with contextlib.closing(sqlite3.connect(path)) as db:
            names = [
                row[0]
                for row in db.execute(
                    "SELECT name FROM sqlite_master WHERE type = 'index' AND sql IS NOT NULL"
                )
            ]
            for name in names:
                db.execute(f'DROP INDEX "{name}"')
            db.commit()


def sqlite_raw(path: Path, seconds: float, max_rows: int, *, indexes: bool) -> dict[str, Any]:
    """Raw sqlite3 executemany, WAL, synchronous=FULL, 100 events per transaction, each
    event a messages row and a deliveries row (random UUID-like messageIds).

    indexes=False: efd's tables with primary keys only, the machine's SQLite limit.
    indexes=True: with efd's secondary indexes, its writer's checkpoint interval and its
    in-memory deduplication index too, the limit of efd's current schema."""
    from efd.store import dedupe
    from efd.store.dedupe import message_key

    _create_schema(path, indexes=indexes)
    body = sample_webhook_body().decode()
    db = sqlite3.connect(path, isolation_level=None)
    db.execute("PRAGMA journal_mode=WAL")
    db.execute("PRAGMA synchronous=FULL")
    if indexes:  # as efd/store/engine.py sets them
        db.execute("PRAGMA wal_autocheckpoint=10000")
        dedupe.attach(db)
    now = time.time()
    started = time.monotonic()
    done = 0
    transactions = 0
    while done < max_rows and time.monotonic() - started < seconds:
        chunk = _ids("raw", min(100, max_rows - done))
        first = done + 1
        db.execute("BEGIN IMMEDIATE")
        db.executemany(
            "INSERT INTO messages (id, source, message_id, type, user_id, anonymous_id, event,"
            " timestamp, received_at, body, message_key) VALUES (?, 'bench', ?, 'track',"
            " 'user-1', NULL, 'Order Completed', ?, ?, ?, ?)",
            [
                (first + i, mid, now, now, body, message_key("bench", mid))
                for i, mid in enumerate(chunk)
            ],
        )
        db.executemany(
            "INSERT INTO deliveries (message_pk, destination, status, attempts, created_at,"
            " next_attempt_at, lease_token) VALUES (?, 'receiver', 'pending', 0, ?, ?, 0)",
            [(first + i, now, now) for i in range(len(chunk))],
        )
        if indexes:
            db.executemany(
                "INSERT INTO dedupe.recent (message_key, message_pk) VALUES (?, ?)",
                [(message_key("bench", mid), first + i) for i, mid in enumerate(chunk)],
            )
        db.execute("COMMIT")
        done += len(chunk)
        transactions += 1
    elapsed = time.monotonic() - started
    db.close()
    return {
        "events": done,
        "transactions": transactions,
        "events_per_s": round(done / elapsed, 1),
    }


def sqlalchemy_core(path: Path, seconds: float, max_rows: int) -> dict[str, Any]:
    """Context, not a key of the issue: the same through SQLAlchemy Core as efd's store
    does it (insert ... RETURNING id sorted by parameter order, then the deliveries)."""
    from sqlalchemy import create_engine, event, insert

    from efd.store.dedupe import message_key
    from efd.store.schema import deliveries, messages

    _create_schema(path)
    engine = create_engine(f"sqlite:///{path}")

    @event.listens_for(engine, "connect")
    def _pragmas(dbapi_connection: Any, _record: Any) -> None:
        dbapi_connection.isolation_level = None
        dbapi_connection.execute("PRAGMA journal_mode=WAL")
        dbapi_connection.execute("PRAGMA synchronous=FULL")

    @event.listens_for(engine, "begin")
    def _begin(connection: Any) -> None:
        connection.exec_driver_sql("BEGIN IMMEDIATE")

    body = sample_webhook_body().decode()
    now = time.time()
    started = time.monotonic()
    done = 0
    while done < max_rows and time.monotonic() - started < seconds:
        chunk = _ids("core", min(100, max_rows - done))
        with engine.begin() as conn:
            pks = conn.execute(
                insert(messages).returning(messages.c.id, sort_by_parameter_order=True),
                [
                    {
                        "source": "bench",
                        "message_id": mid,
                        "type": "track",
                        "user_id": "user-1",
                        "anonymous_id": None,
                        "event": "Order Completed",
                        "timestamp": now,
                        "received_at": now,
                        "body": body,
                        "message_key": message_key("bench", mid),
                    }
                    for mid in chunk
                ],
            ).scalars()
            conn.execute(
                insert(deliveries),
                [
                    {
                        "message_pk": pk,
                        "destination": "receiver",
                        "status": "pending",
                        "created_at": now,
                        "next_attempt_at": now,
                    }
                    for pk in pks
                ],
            )
        done += len(chunk)
    elapsed = time.monotonic() - started
    engine.dispose()
    return {"events": done, "events_per_s": round(done / elapsed, 1)}


# -- report -------------------------------------------------------------------------------

KEYS = (
    "bare_post_per_s",
    "sqlite_raw_rows_per_s",
    "ingest_batch_events_per_s",
    "ingest_single_events_per_s",
    "deliver_events_per_s",
    "deliver_ratio",
    "latency_p50_ms",
    "latency_p99_ms",
    "backlog_ingest_ratio",
    "rss_mb_backlog",
    "recovery_events_per_s",
    "lost",
    "duplicates",
)

LIMIT_OF = {
    "ingest_batch_events_per_s": "sqlite_raw_rows_per_s",
    "ingest_single_events_per_s": "sqlite_raw_rows_per_s",
    "deliver_events_per_s": "bare_post_per_s",
    "recovery_events_per_s": "deliver_events_per_s",
}


def _check(key: str, value: Any, results: dict[str, Any]) -> str:
    if value is None:
        return ""
    if key == "recovery_events_per_s":
        steady = results.get("deliver_events_per_s")
        if steady is None:
            return ""
        return "ok" if value >= steady else "MISS"
    if key not in TARGETS:
        return ""
    op, target = TARGETS[key]
    ok = {">=": value >= target, "<=": value <= target, "==": value == target}[op]
    return "ok" if ok else "MISS"


def _target_text(key: str) -> str:
    if key == "recovery_events_per_s":
        return ">= deliver"
    if key in TARGETS:
        op, target = TARGETS[key]
        return f"{op} {target:,}" if isinstance(target, int) else f"{op} {target}"
    return "(limit)" if key in ("bare_post_per_s", "sqlite_raw_rows_per_s") else ""


def _fmt(value: Any) -> str:
    if value is None:
        return "-"
    if isinstance(value, float):
        return f"{value:,.1f}" if abs(value) >= 100 else f"{value:,.3g}"
    if isinstance(value, int):
        return f"{value:,}"
    return str(value)


def table(results: dict[str, Any]) -> str:
    rows = [("figure", "value", "limit (same run)", "% of limit", "target", "")]
    for key in KEYS:
        value = results.get(key)
        limit_key = LIMIT_OF.get(key)
        limit = results.get(limit_key) if limit_key else None
        share = f"{100 * value / limit:.1f}%" if value is not None and limit else ""
        rows.append(
            (
                key,
                _fmt(value),
                f"{_fmt(limit)} ({limit_key})" if limit_key else "",
                share,
                _target_text(key),
                _check(key, value, results),
            )
        )
    for key, limit_key in (
        ("sqlite_raw_efd_schema_rows_per_s", "sqlite_raw_rows_per_s"),
        ("sqlalchemy_core_events_per_s", "sqlite_raw_rows_per_s"),
    ):
        value, limit = results.get(key), results.get(limit_key)
        if value is not None:
            share = f"{100 * value / limit:.1f}%" if limit else ""
            rows.append(
                ("  " + key, _fmt(value), f"{_fmt(limit)} ({limit_key})", share, "(context)", "")
            )
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    lines = []
    for n, row in enumerate(rows):
        lines.append(
            "  ".join(
                cell.rjust(widths[i]) if 0 < i < 4 else cell.ljust(widths[i])
                for i, cell in enumerate(row)
            ).rstrip()
        )
        if n == 0:
            lines.append("  ".join("-" * w for w in widths))
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="smaller phases, under 2 minutes")
    parser.add_argument(
        "--profile",
        action="store_true",
        help="py-spy record the daemon during each load phase into bench/profiles/ "
        "(perturbs the figures a little)",
    )
    parser.add_argument(
        "--gil",
        action="store_true",
        help="with --profile: sample only the thread holding the GIL (py-spy --gil)",
    )
    parser.add_argument(
        "--only",
        default=",".join(PHASES),
        help=f"comma-separated subset of {','.join(PHASES)} (default: all)",
    )
    parser.add_argument(
        "--rev",
        help="benchmark this git revision (git archive into the temp dir, put first on "
        "PYTHONPATH) instead of the working tree",
    )
    parser.add_argument(
        "--src",
        help="benchmark the efd source tree in this directory (put first on PYTHONPATH), "
        "e.g. a patched copy for an experiment",
    )
    parser.add_argument("--out", default=str(HERE / "results.json"), help="results file")
    parser.add_argument("--keep", action="store_true", help="keep the temp dir (logs, dbs)")
    args = parser.parse_args(argv)
    only = {p.strip() for p in args.only.split(",") if p.strip()}
    unknown = only - set(PHASES)
    if unknown:
        parser.error(f"unknown phases: {', '.join(sorted(unknown))}")
    if "backlog" in only:
        only.add("ingest")  # the ratio needs the empty-store rate

    plan = QUICK if args.quick else FULL
    started = time.monotonic()
    root = Path(tempfile.mkdtemp(prefix="efd-bench-"))
    efd_source = "working tree"
    if args.rev and args.src:
        parser.error("--rev and --src exclude each other")
    if args.rev:
        efd_source = snapshot(args.rev, root / "efd-src")
    elif args.src:
        efd_source = use_source(Path(args.src).resolve())
    ctx = mp.get_context("spawn")
    received = ctx.RawValue("q", 0)
    receiver = Worker(ctx, receiver_main, received, 4096)
    generator = Worker(ctx, generator_main, received)
    bench = Bench(
        plan=plan,
        quick=args.quick,
        only=only,
        root=root,
        profiler=Profiler(args.profile, HERE / "profiles", gil=args.gil),
        receiver=receiver,
        generator=generator,
        received=received,
    )
    print(f"efd bench ({'quick' if args.quick else 'full'}) in {root}")
    failure = None
    try:
        if "limits" in only:
            bench.limits()
        if "ingest" in only:
            bench.ingest_and_backlog()
        if only & {"deliver", "latency"}:
            bench.deliver_and_latency()
        if "recovery" in only:
            bench.recovery()
    except Exception as error:  # any failure: report it with what was measured
        traceback.print_exc()
        failure = f"{type(error).__name__}: {error}"
        print(f"\nbench stopped: {failure}", file=sys.stderr)
    finally:
        if bench.daemon is not None:
            with contextlib.suppress(Exception):
                bench.stop_daemon()
        receiver.stop(("stop",))
        generator.stop(None)
        kept = args.keep or failure is not None or bench.keep
        if not kept:
            shutil.rmtree(root, ignore_errors=True)

    results = bench.results
    if results.get("deliver_events_per_s") and results.get("bare_post_per_s"):
        results["deliver_ratio"] = round(
            results["deliver_events_per_s"] / results["bare_post_per_s"], 3
        )
    report: dict[str, Any] = {key: results.get(key) for key in KEYS}
    report["context"] = {
        "quick": args.quick,
        "phases_run": sorted(only),
        "profile": bool(args.profile),
        "cores": os.cpu_count(),
        "cpu_model": _cpu_model(),
        "loadavg_at_end": os.getloadavg(),
        "python": platform.python_version(),
        "platform": platform.platform(),
        "sqlite": sqlite3.sqlite_version,
        "efd_commit": _git_commit(),
        "efd_source": efd_source,
        "plan": plan.__dict__,
        "extra": {k: v for k, v in results.items() if k not in KEYS},
        "phases": bench.phases,
        "notes": bench.notes,
        "failure": failure,
        "total_seconds": round(time.monotonic() - started, 1),
        "temp_dir_kept": str(root) if kept else None,
    }
    Path(args.out).write_text(json.dumps(report, indent=2) + "\n")
    print()
    print(table(results))
    for note in bench.notes:
        print(f"note: {note}")
    extra = report["context"]["extra"]
    if extra:
        print("context: " + ", ".join(f"{k}={_fmt(v)}" for k, v in extra.items()))
    print(f"wrote {args.out} in {report['context']['total_seconds']} s")
    return 1 if failure else 0


def snapshot(rev: str, dest: Path) -> str:
    """Extract `rev` of the repository into dest (read-only for the repository) and make
    the daemons and this process import efd from there."""
    commit = subprocess.run(
        ["git", "-C", str(ROOT), "rev-parse", "--verify", f"{rev}^{{commit}}"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.strip()
    archive = subprocess.run(
        ["git", "-C", str(ROOT), "archive", "--format=tar", commit],
        capture_output=True,
        check=True,
    ).stdout
    dest.mkdir(parents=True)
    with tarfile.open(fileobj=io.BytesIO(archive)) as tar:
        tar.extractall(dest, filter="data")
    use_source(dest)
    return f"git {rev} = {commit}"


def use_source(path: Path) -> str:
    if not (path / "efd" / "__init__.py").is_file():
        raise SystemExit(f"{path} holds no efd package")
    old = os.environ.get("PYTHONPATH")
    os.environ["PYTHONPATH"] = str(path) + (os.pathsep + old if old else "")
    sys.path.insert(0, str(path))
    return f"source tree {path}"


def _cpu_model() -> str | None:
    with contextlib.suppress(OSError), open("/proc/cpuinfo") as handle:
        for line in handle:
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    return None


def _git_commit() -> str | None:
    with contextlib.suppress(OSError, subprocess.SubprocessError):
        out = subprocess.run(
            ["git", "-C", str(ROOT), "describe", "--always", "--dirty"],
            capture_output=True,
            text=True,
            timeout=5,
        )
        return out.stdout.strip() or None
    return None


if __name__ == "__main__":
    sys.exit(main())
