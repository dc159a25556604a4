"""The load generator (own process): closed-loop and paced ingestion through a minimal
keep-alive HTTP/1.1 client, and the bare-POST limit through aiohttp."""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import hmac
import os
import time
from collections import Counter
from typing import Any, cast

from efdbench.bodies import AUTH, SECRET, batch_body, single_body
from efdbench.stats import pct

REQUEST_TIMEOUT = 30.0  # seconds; a load-generator request that takes longer is an error


class _Client(asyncio.Protocol):
    """One keep-alive connection; one request at a time; Content-Length responses only."""

    def __init__(self) -> None:
        self.buf = bytearray()
        self.transport: asyncio.Transport | None = None
        self.waiter: asyncio.Future[tuple[int, bytes]] | None = None
        self.lost = False

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = cast(asyncio.Transport, transport)  # a TCP connection's: a stream

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
    ports: list[int] | None = None,
    rate: float | None = None,
    timed: bool = False,
) -> dict[str, Any]:
    """Closed-loop ingestion: `clients` connections, each POSTing as soon as answered.

    `batch` messages per request (/v1/batch), or one bare message when path is a single
    endpoint. Stops at `duration` seconds or after `max_events` accepted events. With
    `window`, a client waits while acked - received >= window (sustained end-to-end mode).
    With `rate` (events/s), request k starts no earlier than k requests' worth of events
    at that rate after the start: a steady offered load, as long as the clients keep up.
    With `timed`, each acknowledged request's (start, latency) in seconds from the job's
    start is returned too (`timed`), for percentiles over parts of a long run.
    """
    # With `ports` (several daemons on one database), client i goes to ports[i % len].
    pools = [_Pool(p) for p in ports or [port]]
    conns = [(pools[i % len(pools)], await pools[i % len(pools)].connect()) for i in range(clients)]
    single = not path.endswith("/batch")
    state = {"acked": 0, "claimed": 0, "requests": 0, "seq": 0, "slots": 0}
    errors: Counter[str] = Counter()
    latencies: list[float] = []
    timings: list[tuple[float, float]] = []
    ids_kept: list[str] = []
    samples: list[tuple[float, int, int]] = []
    t0 = time.monotonic()
    end = t0 + duration
    # The receiver's count runs on across jobs: the window counts this job's receipts only.
    received_before = received.value

    async def worker(pool: _Pool, client: _Client) -> None:
        while True:
            if time.monotonic() >= end:
                break
            n = 1 if single else batch
            if max_events is not None:
                n = min(n, max_events - state["claimed"])
                if n <= 0:
                    break
            state["claimed"] += n
            if rate is not None:
                slot = state["slots"]
                state["slots"] += n
                delay = t0 + slot / rate - time.monotonic()
                if delay > 0:
                    await asyncio.sleep(delay)
                if time.monotonic() >= end:
                    state["claimed"] -= n
                    break
            if window is not None:
                while (
                    state["acked"] - (received.value - received_before) >= window
                    and time.monotonic() < end
                ):
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
                if timed:
                    timings.append((started - t0, latencies[-1]))
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
    await asyncio.gather(*(worker(p, c) for p, c in conns))
    elapsed = time.monotonic() - t0
    samples.append((elapsed, state["acked"], received.value))
    sampling.cancel()
    latencies.sort()
    return {
        "acked": state["acked"],
        "requests": state["requests"],
        "elapsed": elapsed,
        "errors": dict(errors),
        "request_p50_ms": pct(latencies, 50) * 1000 if latencies else None,
        "request_p99_ms": pct(latencies, 99) * 1000 if latencies else None,
        "samples": samples,
        "received_before": received_before,
        "ids": ids_kept,
        "timed": timings,
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
                    "webhook-id": "msg_" + "a" * 26,
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
