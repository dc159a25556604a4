#!/usr/bin/env python
"""efd benchmark: a hook's rate limit (max_per_second) across daemons on one PostgreSQL store.

    .venv/bin/python bench/ratelimit.py [--rates 50,200] [--daemons 1,3] [--seconds 25]

For each limit and each number of daemons: a fresh database on the local PostgreSQL server
($EFD_BENCH_PG, else scripts/ensure-postgres), N `efd serve` processes on it with the same
configuration (one hook, max_per_second = limit, the default burst), and a receiver in this
process that notes when each request arrives and enforces the same limit itself (a token
bucket of the same rate and burst: a request beyond it is answered 429 and counted). A backlog
of limit x (seconds + 5) messages is sent to the daemons in batches, spread over them, as
fast as they take it, so the limit is what paces delivery throughout.

Reported, from the arrivals at the receiver:
  * rate ÷ limit over every 10 s window (sliding by 1 s) from the first arrival while the
    backlog lasts: min and max, with and without the first window (which holds the burst);
  * the most arrivals in any 1 s, against limit + burst, and the most requests efd started
    in any 1 s (its attempts table: the limit as efd applies it, without the network);
  * the receiver's 429s, and duplicates.
It is a benchmark, not a test: nothing asserts. The machine may be shared; the ratios are to
the configured limit, which does not depend on the machine.
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import bisect
import json
import os
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path
from typing import Any

import psycopg
from aiohttp import web

ROOT = Path(__file__).resolve().parent.parent
WRITE_KEY = "wk_ratelimit_bench"


def admin_url() -> str:
    url = os.environ.get("EFD_BENCH_PG")
    if url:
        return url
    return subprocess.run(
        [str(ROOT / "scripts" / "ensure-postgres")], capture_output=True, text=True, check=True
    ).stdout.strip()


class Receiver:
    """Counts arrivals; enforces (rate, burst) with a token bucket, as a receiver would."""

    def __init__(self, rate: float, burst: float) -> None:
        self.rate = rate
        self.burst = burst
        self.tokens = burst
        self.updated = time.monotonic()
        self.arrivals: list[float] = []
        self.refused = 0
        self.seen: set[str] = set()
        self.firsts: list[float] = []  # when each message first arrived accepted
        self.duplicates = 0

    async def handle(self, request: web.Request) -> web.Response:
        body = await request.read()
        now = time.monotonic()
        self.tokens = min(self.burst, self.tokens + (now - self.updated) * self.rate)
        self.updated = now
        self.arrivals.append(now)
        if self.tokens < 1.0:
            self.refused += 1
            return web.Response(status=429)  # no Retry-After: efd's backoff decides
        self.tokens -= 1.0
        message_id = json.loads(body)["messageId"]
        if message_id in self.seen:
            self.duplicates += 1
        else:
            self.firsts.append(now)
        self.seen.add(message_id)
        return web.Response(status=200)


def start_daemon(directory: Path, url: str, hook: str, rate: float, port: int) -> Any:
    directory.mkdir(parents=True)
    config = directory / "efd.toml"
    config.write_text(
        "\n".join(
            [
                "[server]",
                'host = "127.0.0.1"',
                f"port = {port}",
                "parse_processes = 0",
                "[storage]",
                f'url = "{url}"',
                "[delivery]",
                'allowed_networks = ["127.0.0.0/8"]',
                "sender_processes = 0",
                "retry_initial_seconds = 0.5",
                "retry_max_seconds = 2",
                "[logging]",
                'level = "WARNING"',
                "[[sources]]",
                'name = "bench"',
                f'write_key = "{WRITE_KEY}"',
                'destinations = ["receiver"]',
                "[[destinations]]",
                'name = "receiver"',
                "[[destinations.hooks]]",
                f'url = "{hook}"',
                f"max_per_second = {rate}",
            ]
        )
        + "\n"
    )
    log = (directory / "efd.log").open("wb")
    process = subprocess.Popen(
        [sys.executable, "-m", "efd", "serve", "--config", str(config)],
        cwd=directory,
        stdout=log,
        stderr=subprocess.STDOUT,
    )
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise SystemExit(f"efd exited at start-up: {(directory / 'efd.log').read_text()}")
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/healthz", timeout=2):
                return process
        except OSError:
            time.sleep(0.2)
    raise SystemExit("efd did not start within 60 s")


def free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


async def post_backlog(ports: list[int], count: int) -> None:
    import aiohttp

    auth = "Basic " + base64.b64encode(f"{WRITE_KEY}:".encode()).decode()
    async with aiohttp.ClientSession() as session:
        for start in range(0, count, 100):
            batch = [
                {"type": "track", "userId": "u", "event": "E", "messageId": f"m-{i}"}
                for i in range(start, min(count, start + 100))
            ]
            port = ports[(start // 100) % len(ports)]
            async with session.post(
                f"http://127.0.0.1:{port}/v1/batch",
                json={"batch": batch},
                headers={"Authorization": auth},
            ) as response:
                assert response.status == 200, await response.text()


def windows(arrivals: list[float], length: float, until: float) -> list[int]:
    """Arrivals in each window [t, t + length), t from the first arrival by 1 s steps, for
    windows that end by `until`."""
    first = arrivals[0]
    counts = []
    t = first
    while t + length <= until + 1e-9:
        counts.append(bisect.bisect_left(arrivals, t + length) - bisect.bisect_left(arrivals, t))
        t += 1.0
    return counts


async def run_one(
    url: str, rate: float, daemons: int, seconds: float, root: Path
) -> dict[str, Any]:
    name = f"efd_ratelimit_{os.getpid()}_{int(rate)}_{daemons}"
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute(f"DROP DATABASE IF EXISTS {name}")
        conn.execute(f"CREATE DATABASE {name}")
    db_url = url.rsplit("/", 1)[0] + "/" + name
    burst = max(1.0, rate)
    receiver = Receiver(rate, burst)
    app = web.Application()
    app.router.add_post("/hook", receiver.handle)
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = runner.addresses[0][1]
    hook = f"http://127.0.0.1:{port}/hook"
    processes = []
    try:
        ports = []
        for i in range(daemons):
            ports.append(free_port())
            processes.append(
                await asyncio.to_thread(
                    start_daemon, root / f"{name}-{i}", db_url, hook, rate, ports[-1]
                )
            )
        backlog = int(rate * (seconds + 5))
        await post_backlog(ports, backlog)
        deadline = time.monotonic() + seconds + 30
        while len(receiver.seen) < backlog and time.monotonic() < deadline:
            await asyncio.sleep(0.2)
    finally:
        for process in processes:
            process.terminate()
        for process in processes:
            await asyncio.to_thread(process.wait, 30)
        await runner.cleanup()
        with psycopg.connect(db_url) as conn:
            sent = sorted(row[0] for row in conn.execute("SELECT attempted_at FROM attempts"))
        with psycopg.connect(url, autocommit=True) as conn:
            conn.execute(f"DROP DATABASE IF EXISTS {name}")
    arrivals = sorted(receiver.arrivals)
    # While the backlog lasts: until a second's worth of messages is left to deliver.
    firsts = sorted(receiver.firsts)
    until = firsts[max(0, backlog - int(rate) - 1)] if len(firsts) >= backlog else arrivals[-1]
    ten = windows(arrivals, 10.0, until)
    one = max(windows(arrivals, 1.0, arrivals[-1]), default=0)
    one_sent = max(windows(sent, 1.0, sent[-1]), default=0)
    # efd's own starts, over the same span of the backlog (wall-clock times).
    sent_until = sent[0] + (until - arrivals[0])
    ten_sent = windows(sent, 10.0, sent_until)
    return {
        "limit": rate,
        "burst": burst,
        "daemons": daemons,
        "backlog": backlog,
        "delivered": len(receiver.seen),
        "requests": len(arrivals),
        "drain_s": round(arrivals[-1] - arrivals[0], 2),
        "ratio_10s_min": round(min(ten) / (10 * rate), 3) if ten else None,
        "ratio_10s_max": round(max(ten) / (10 * rate), 3) if ten else None,
        "ratio_10s_max_after_first": round(max(ten[1:]) / (10 * rate), 3) if len(ten) > 1 else None,
        "sent_10s_min": round(min(ten_sent) / (10 * rate), 3) if ten_sent else None,
        "sent_10s_max": round(max(ten_sent) / (10 * rate), 3) if ten_sent else None,
        "busiest_1s": one,
        "busiest_1s_sent": one_sent,
        "limit_plus_burst": rate + burst,
        "receiver_429": receiver.refused,
        "duplicates": receiver.duplicates,
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rates", default="50,200", help="limits to run, comma-separated")
    parser.add_argument("--daemons", default="1,3", help="daemon counts, comma-separated")
    parser.add_argument("--seconds", type=float, default=25, help="backlog, in seconds of limit")
    args = parser.parse_args()
    url = admin_url()
    results = []
    with tempfile.TemporaryDirectory(prefix="efd-ratelimit-") as tmp:
        for rate in (float(r) for r in args.rates.split(",")):
            for daemons in (int(d) for d in args.daemons.split(",")):
                result = asyncio.run(run_one(url, rate, daemons, args.seconds, Path(tmp)))
                results.append(result)
                print(json.dumps(result), flush=True)
    print()
    print(
        "| limit/s | daemons | delivered | 10 s rate ÷ limit (min to max) | after the first window"
        " (max) | sent: 10 s ÷ limit | busiest 1 s: arrived, sent (limit+burst) | 429s |"
        " duplicates |"
    )
    print("|---|---|---|---|---|---|---|---|---|")
    for r in results:
        print(
            f"| {r['limit']:g} | {r['daemons']} | {r['delivered']}/{r['backlog']} |"
            f" {r['ratio_10s_min']} to {r['ratio_10s_max']} | {r['ratio_10s_max_after_first']} |"
            f" {r['sent_10s_min']} to {r['sent_10s_max']} |"
            f" {r['busiest_1s']}, {r['busiest_1s_sent']} ({r['limit_plus_burst']:g}) |"
            f" {r['receiver_429']} |"
            f" {r['duplicates']} |"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
