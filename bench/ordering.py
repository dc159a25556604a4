#!/usr/bin/env python
"""Ordered delivery's cost: an ordered destination against the same unordered, and with 1 % of
users whose every delivery fails, each figure a ratio to one measured in the same run.

    .venv/bin/python bench/ordering.py [--users 10000] [--per-user 4] [--pairs 2]
                                       [--rate 150] [--paced-seconds 15] [--fast-retries]

Each measurement starts `python -m efd serve` on a fresh SQLite database (sender processes as
configured by default) and a receiver in its own process (raw asyncio HTTP/1.1), both on
127.0.0.1. Two phases per measurement:

* drain: users x per-user messages, batches of 100 sent as fast as efd takes them, user after
  user in each batch; delivered events/s of the users that do not fail = their count over the
  time from the first to the last of them received (ingestion and delivery overlap).
* paced: `rate` messages/s for `paced-seconds`, random users; each healthy message's latency
  from efd's acknowledgement to its first receipt; p50 and p99. Keep the rate well below
  the drain rate, or the latency measures a growing backlog.

Variants, run as interleaved pairs (A B A B …): `unordered`, `ordered`, `ordered-1%-failing`
(users whose number is divisible by 100 answered 503, always). Prints a table and the ratios
the issue asks for: ordered / unordered ≥ 0.8, failing / ordered ≥ 0.8, and p99 of each.
It is a benchmark, not a test: nothing asserts a time. The receiver also checks each user's
sequence never goes backwards (counted as `backwards`).
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import json
import multiprocessing
import os
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
WRITE_KEY = "wk_bench"
AUTH = "Basic " + base64.b64encode(f"{WRITE_KEY}:".encode()).decode()
_OK = b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\n{}"
_FAIL = b"HTTP/1.1 503 Service Unavailable\r\nContent-Length: 2\r\n\r\n{}"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


# -- the receiver (own process) ------------------------------------------------------------


def _field(body: bytes, name: bytes) -> bytes:
    i = body.find(b'"' + name + b'":"')
    if i < 0:
        return b""
    i += len(name) + 4
    return body[i : body.find(b'"', i)]


def receiver_main(port: int, conn: Any) -> None:
    seen: dict[bytes, float] = {}  # messageId -> first receipt
    last: dict[bytes, int] = {}  # userId -> highest sequence number received
    counts = {"requests": 0, "duplicates": 0, "backwards": 0}

    class Protocol(asyncio.Protocol):
        def connection_made(self, transport: asyncio.BaseTransport) -> None:
            self.transport: Any = transport
            self.buffer = b""

        def data_received(self, data: bytes) -> None:
            self.buffer += data
            while True:
                end = self.buffer.find(b"\r\n\r\n")
                if end < 0:
                    return
                length = 0
                for line in self.buffer[:end].split(b"\r\n")[1:]:
                    name, _, value = line.partition(b":")
                    if name.strip().lower() == b"content-length":
                        length = int(value)
                if len(self.buffer) < end + 4 + length:
                    return
                body = self.buffer[end + 4 : end + 4 + length]
                self.buffer = self.buffer[end + 4 + length :]
                self.transport.write(handle(body))

    def handle(body: bytes) -> bytes:
        counts["requests"] += 1
        user, mid = _field(body, b"userId"), _field(body, b"messageId")
        number = int(user.rsplit(b"-", 1)[1])
        if number % 100 == 0 and failing:
            return _FAIL
        sequence = int(mid.rsplit(b"-", 1)[1])
        if sequence < last.get(user, -1):
            counts["backwards"] += 1
        last[user] = max(sequence, last.get(user, -1))
        if mid in seen:
            counts["duplicates"] += 1
        else:
            seen[mid] = time.time()
        return _OK

    failing = False

    async def serve() -> None:
        nonlocal failing
        loop = asyncio.get_running_loop()
        server = await loop.create_server(Protocol, "127.0.0.1", port, backlog=1024)
        reader = asyncio.Event()
        loop.add_reader(conn.fileno(), reader.set)
        while True:
            await reader.wait()
            reader.clear()
            while conn.poll():
                command = conn.recv()
                if command[0] == "failing":
                    failing = command[1]
                    seen.clear()
                    last.clear()
                    counts.update(requests=0, duplicates=0, backwards=0)
                    conn.send(None)
                elif command[0] == "received":
                    conn.send((dict(seen), dict(counts)))
                elif command[0] == "stop":
                    server.close()
                    return

    asyncio.run(serve())


# -- efd ---------------------------------------------------------------------------------------


def start_efd(
    root: Path, hook: str, ordering: str, fast_retries: bool
) -> tuple[subprocess.Popen[bytes], int]:
    port = free_port()
    config = root / "efd.toml"
    config.write_text(
        "\n".join(
            [
                "[server]",
                'host = "127.0.0.1"',
                f"port = {port}",
                "[storage]",
                f'url = "sqlite:///{root / "efd.db"}"',
                "[delivery]",
                'allowed_networks = ["127.0.0.0/8"]',
                # The failing users' circuit stays closed, as the healthy users' answers keep
                # coming; --fast-retries makes their heads retry every 0.5-2 s instead of on
                # efd's default backoff, the harsher case.
                *(["retry_initial_seconds = 0.5", "retry_max_seconds = 2"] if fast_retries else []),
                "circuit_failures = 100000",
                "[logging]",
                'level = "WARNING"',
                "[[sources]]",
                'name = "bench"',
                f'write_key = "{WRITE_KEY}"',
                'destinations = ["receiver"]',
                "[[destinations]]",
                'name = "receiver"',
                f'ordering = "{ordering}"',
                "[[destinations.hooks]]",
                f'url = "{hook}"',
            ]
        )
        + "\n"
    )
    log = (root / "efd.log").open("wb")
    process = subprocess.Popen(
        [sys.executable, "-m", "efd", "serve", "--config", str(config)],
        cwd=ROOT,
        stdout=log,
        stderr=subprocess.STDOUT,
    )
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/healthz", timeout=2):
                return process, port
        except OSError:
            time.sleep(0.1)
    process.kill()
    raise RuntimeError((root / "efd.log").read_text())


# -- load ------------------------------------------------------------------------------------


def batch_body(messages: list[tuple[int, str]]) -> bytes:
    return json.dumps(
        {
            "batch": [
                {
                    "type": "track",
                    "userId": f"user-{u}",
                    "event": "Order Completed",
                    "properties": {"plan": "pro", "amount": 42.5},
                    "messageId": mid,
                }
                for u, mid in messages
            ]
        }
    ).encode()


async def send_all(
    port: int, batches: list[list[tuple[int, str]]], clients: int
) -> dict[str, float]:
    """POST the batches, in order per client; returns messageId -> acknowledgement time."""
    import aiohttp

    acked: dict[str, float] = {}
    queue: asyncio.Queue[list[tuple[int, str]]] = asyncio.Queue()
    for b in batches:
        queue.put_nowait(b)
    url = f"http://127.0.0.1:{port}/v1/batch"
    headers = {"Authorization": AUTH, "Content-Type": "application/json"}

    async def client(session: aiohttp.ClientSession) -> None:
        while not queue.empty():
            b = queue.get_nowait()
            async with session.post(url, data=batch_body(b), headers=headers) as response:
                assert response.status == 200, await response.text()
            now = time.time()
            for _, mid in b:
                acked[mid] = now

    async with aiohttp.ClientSession() as session:
        await asyncio.gather(*(client(session) for _ in range(clients)))
    return acked


async def send_paced(port: int, users: int, rate: float, seconds: float) -> dict[str, float]:
    import random

    import aiohttp

    rng = random.Random(7)
    acked: dict[str, float] = {}
    url = f"http://127.0.0.1:{port}/v1/batch"
    headers = {"Authorization": AUTH, "Content-Type": "application/json"}
    per_tick = max(1, int(rate / 20))
    sequence: dict[int, int] = {}
    tasks = []

    async with aiohttp.ClientSession() as session:

        async def post(b: list[tuple[int, str]]) -> None:
            async with session.post(url, data=batch_body(b), headers=headers) as response:
                assert response.status == 200
            now = time.time()
            for _, mid in b:
                acked[mid] = now

        start = time.monotonic()
        tick = 0
        while time.monotonic() - start < seconds:
            b = []
            for _ in range(per_tick):
                u = rng.randrange(users)
                n = sequence.get(u, 1000)  # after the drain's numbers
                sequence[u] = n + 1
                b.append((u, f"p-{u}-{n}"))
            tasks.append(asyncio.create_task(post(b)))
            tick += 1
            await asyncio.sleep(max(0.0, start + tick / 20 - time.monotonic()))
        await asyncio.gather(*tasks)
    return acked


def healthy(mid: str) -> bool:
    return int(mid.split("-")[1]) % 100 != 0


def measure(variant: str, args: argparse.Namespace, receiver: Any, hook: str) -> dict[str, Any]:
    ordering = "none" if variant == "unordered" else "per_user"
    failing = variant.endswith("failing")
    receiver.send(("failing", failing))
    receiver.recv()
    with tempfile.TemporaryDirectory(prefix="efd-ordering-") as tmp:
        process, port = start_efd(Path(tmp), hook, ordering, args.fast_retries)
        try:
            # drain: user after user in each batch, every user's messages in sequence
            messages = [(u, f"d-{u}-{i}") for i in range(args.per_user) for u in range(args.users)]
            batches = [messages[i : i + 100] for i in range(0, len(messages), 100)]
            want = {mid for _, mid in messages if healthy(mid)}
            asyncio.run(send_all(port, batches, clients=4))
            deadline = time.monotonic() + 600
            while True:
                seen, counts = _ask(receiver)
                got = want.intersection(seen)
                if len(got) == len(want) or time.monotonic() > deadline:
                    break
                time.sleep(0.5)
            times = sorted(seen[m] for m in got)
            drain_rate = (len(times) - 1) / max(1e-9, times[-1] - times[0])
            # paced
            acked = asyncio.run(send_paced(port, args.users, args.rate, args.paced_seconds))
            target = {m for m in acked if healthy(m)}
            deadline = time.monotonic() + 120
            while True:
                seen, counts = _ask(receiver)
                if target.issubset(seen) or time.monotonic() > deadline:
                    break
                time.sleep(0.5)
            latencies = sorted((seen[m] - acked[m]) * 1000 for m in target if m in seen)
        finally:
            process.send_signal(signal.SIGTERM)
            try:
                process.wait(30)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()
    return {
        "variant": variant,
        "drain_events_per_s": round(drain_rate, 1),
        "drained": f"{len(got)}/{len(want)}",
        "p50_ms": round(statistics.median(latencies), 1),
        "p99_ms": round(latencies[int(0.99 * (len(latencies) - 1))], 1),
        "paced_delivered": f"{len(latencies)}/{len(target)}",
        "backwards": counts["backwards"],
        "duplicates": counts["duplicates"],
    }


def _ask(receiver: Any) -> tuple[dict[str, float], dict[str, int]]:
    receiver.send(("received",))
    seen, counts = receiver.recv()
    return {k.decode(): v for k, v in seen.items()}, counts


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--users", type=int, default=10_000)
    parser.add_argument("--per-user", type=int, default=4)
    parser.add_argument("--pairs", type=int, default=2)
    parser.add_argument("--rate", type=float, default=150.0)
    parser.add_argument("--paced-seconds", type=float, default=15.0)
    parser.add_argument(
        "--fast-retries",
        action="store_true",
        help="failing heads retried every 0.5-2 s (default: efd's own backoff)",
    )
    args = parser.parse_args()
    # SIGTERM ends the run through the same cleanup as Ctrl-C: no daemon left behind.
    signal.signal(signal.SIGTERM, signal.default_int_handler)
    port = free_port()
    parent, child = multiprocessing.Pipe()
    receiver = multiprocessing.Process(target=receiver_main, args=(port, child), daemon=True)
    receiver.start()
    hook = f"http://127.0.0.1:{port}/hook"
    results: list[dict[str, Any]] = []
    try:
        for pair in range(args.pairs):
            order = ["unordered", "ordered", "ordered-1%-failing"]
            if pair % 2:
                order.reverse()
            for variant in order:
                result = measure(variant, args, parent, hook)
                results.append(result)
                print(json.dumps(result), flush=True)
    finally:
        parent.send(("stop",))
        receiver.join(5)
    by = {
        v: [r for r in results if r["variant"] == v]
        for v in ("unordered", "ordered", "ordered-1%-failing")
    }

    def mean(variant: str, key: str) -> float:
        return statistics.mean(float(r[key]) for r in by[variant])

    print()
    print(f"machine: {os.cpu_count()} cores, shared; {args.users} users x {args.per_user}")
    for variant in by:
        print(
            f"{variant:20} drain {mean(variant, 'drain_events_per_s'):8.1f} events/s"
            f"   p50 {mean(variant, 'p50_ms'):7.1f} ms   p99 {mean(variant, 'p99_ms'):7.1f} ms"
            f"   backwards {sum(r['backwards'] for r in by[variant])}"
        )
    print(
        "ordered / unordered drain: "
        f"{mean('ordered', 'drain_events_per_s') / mean('unordered', 'drain_events_per_s'):.2f}"
        " (issue: >= 0.8)"
    )
    print(
        "1%-failing healthy / ordered drain: "
        f"{mean('ordered-1%-failing', 'drain_events_per_s') / mean('ordered', 'drain_events_per_s'):.2f}"  # noqa: E501
        " (issue: >= 0.8)"
    )
    print(
        "1%-failing healthy p99 / ordered p99: "
        f"{mean('ordered-1%-failing', 'p99_ms') / mean('ordered', 'p99_ms'):.2f}"
        " (issue: unchanged within noise)"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
