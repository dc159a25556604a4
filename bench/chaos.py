"""Chaos soak: steady traffic through real `efd serve` daemons while things fail.

    .venv/bin/python bench/chaos.py --store sqlite|postgresql [--minutes 10] [--seed N]

PostgreSQL: 3 daemons on a private cluster (initdb into a temporary directory, its own port;
removed at the end). SQLite: 1 daemon. Three receivers on 127.0.0.1 (destinations `alpha`,
`beta` and `ordered`, the last with `ordering = "per_user"`) record every delivery they answer
2xx to: messageId, time, and the daemon that sent it (each daemon's hooks carry an
`X-Chaos-Daemon: d<n>.<incarnation>.<reload>` header). `ordered` also notes every request
it reads, in order: per user (lane), the sequence must never go backwards, duplicates
included: no message again after a later one, none after a message the client sent only once
it had been acknowledged.
At seeded random intervals one fault starts (faults may overlap): kill -9 of a daemon's
process group and a restart, SIGTERM and a restart, PostgreSQL stopped for a few seconds,
a receiver answering 500, hanging past the delivery timeout, resetting connections, or gone
(listening socket closed), and a SIGHUP reload with changed headers and user agent. Then it
stops the faults, drains, stops every process it started, and prints as its last line one
JSON object. bench/chaos.md describes the accounting; the exit status is 1 when a message
was lost or a duplicate is unexplained.
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import contextlib
import itertools
import json
import logging
import os
import random
import shutil
import signal
import socket
import struct
import subprocess
import sys
import tempfile
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp
import sqlalchemy as sa
from aiohttp import web

ROOT = Path(__file__).resolve().parent.parent
WRITE_KEY = "wk_chaos"
AUTH = {"Authorization": "Basic " + base64.b64encode(f"{WRITE_KEY}:".encode()).decode()}
DESTINATIONS = ("alpha", "beta", "ordered")
ORDERED = "ordered"  # the destination with ordering = "per_user"
# Delivery settings written into every daemon's config: short back-offs and a short lease so
# that the soak converges within its time.
TIMEOUT_S = 4.0
LEASE_S = 10.0
RETRY_INITIAL_S = 0.5
RETRY_MAX_S = 2.0
# A circuit opened by a receiver fault is probed as often as a retry would come.
CIRCUIT_PROBE_S = 2.0
RETRY_WINDOW_S = 3600.0
# How long after a 2xx a daemon may still be committing its outcome: a receipt this close
# before a kill -9 (or before it, while the store was down) was in flight at the kill.
COMMIT_WINDOW_S = 5.0
# A killed process's last answers may be read by the receiver just after the kill.
KILL_SLACK_S = 1.0
PG_KINDS = (
    "kill9",
    "sigterm",
    "pg_stop",
    "reload",
    "recv_500",
    "recv_hang",
    "recv_reset",
    "recv_gone",
)
SQLITE_KINDS = tuple(k for k in PG_KINDS if k != "pg_stop")


class Clock:
    """Seconds since the soak started (monotonic; all parties live in this process)."""

    def __init__(self) -> None:
        self.t0 = time.monotonic()

    def __call__(self) -> float:
        return time.monotonic() - self.t0


CLOCK = Clock()


def say(text: str) -> None:
    print(f"[{CLOCK():7.1f}s] {text}", flush=True)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


@dataclass
class Window:
    """An outage: deliveries to `scope` (a destination, or "all") could not happen."""

    kind: str
    start: float
    end: float
    scope: str


@dataclass
class Receipt:
    t: float
    tag: str  # X-Chaos-Daemon: d<n>.<incarnation>.<reload>

    @property
    def incarnation(self) -> str:
        return ".".join(self.tag.split(".")[:2])


@dataclass
class Ending:
    how: str  # kill9 | sigterm | final
    t: float


@dataclass
class Soak:
    """Everything the accounting needs, gathered while the soak runs."""

    acked: dict[str, float] = field(default_factory=dict)  # messageId -> acknowledgement time
    sent: dict[str, float] = field(default_factory=dict)  # messageId -> its first request
    windows: list[Window] = field(default_factory=list)
    endings: dict[str, Ending] = field(default_factory=dict)  # incarnation -> how it ended
    faults: Counter[str] = field(default_factory=Counter)
    skipped_faults: int = 0
    requests_ok: int = 0
    request_failures: int = 0
    abandoned: int = 0  # messages whose every request failed: never acknowledged
    skipped_ticks: int = 0
    orphans_lingering: int = 0  # kills of the daemon alone whose children did not exit
    reload_tags: list[str] = field(default_factory=list)  # the header each reload set
    # When PostgreSQL was stopped -m immediate (a crash: commits not yet flushed are lost),
    # from the stop command to the server being gone: the server keeps committing (and a
    # daemon keeps sending what it claimed) until it actually dies inside that span.
    store_crashes: list[tuple[float, float]] = field(default_factory=list)


# -- PostgreSQL ------------------------------------------------------------------------------


class PrivateCluster:
    """A PostgreSQL cluster of the soak's own, never the machine's shared one."""

    def __init__(self) -> None:
        bins = sorted(
            Path("/usr/lib/postgresql").glob("*/bin"),
            key=lambda p: int(p.parent.name) if p.parent.name.isdigit() else 0,
        )
        initdb = bins[-1] / "initdb" if bins else shutil.which("initdb")
        if initdb is None or not Path(initdb).exists():
            raise SystemExit("PostgreSQL's initdb was not found (apt-get install postgresql)")
        self.bin = Path(initdb).parent
        self.data = Path(tempfile.mkdtemp(prefix="efd-chaos-pg-"))
        self.port = free_port()
        self.url = f"postgresql://postgres@127.0.0.1:{self.port}/postgres"

    def _run(self, *args: str) -> None:
        cmd = [str(self.bin / args[0]), *args[1:]]
        if os.geteuid() == 0:  # the server refuses to run as root
            cmd = ["runuser", "-u", "postgres", "--", *cmd]
        done = subprocess.run(cmd, capture_output=True, text=True, timeout=120, check=False)
        if done.returncode != 0:
            raise RuntimeError(f"{' '.join(cmd)}: {done.stdout}{done.stderr}")

    def init(self) -> None:
        if os.geteuid() == 0:
            shutil.chown(self.data, "postgres")
        self._run("initdb", "-D", str(self.data), "-A", "trust", "-U", "postgres", "--no-sync")
        self.start()

    def start(self) -> None:
        options = f"-p {self.port} -k {self.data} -c listen_addresses=127.0.0.1"
        log = f"{self.data}/log"
        self._run(
            "pg_ctl", "-D", str(self.data), "-l", log, "-o", options, "-w", "-t", "60", "start"
        )

    def stop(self, mode: str) -> None:
        self._run("pg_ctl", "-D", str(self.data), "-m", mode, "-w", "-t", "60", "stop")

    def remove(self) -> None:
        with contextlib.suppress(Exception):
            self.stop("immediate")
        shutil.rmtree(self.data, ignore_errors=True)


# -- daemons ---------------------------------------------------------------------------------


def _toml(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int | float):
        return repr(value)
    if isinstance(value, str):
        return json.dumps(value)
    if isinstance(value, list):
        return "[" + ", ".join(_toml(v) for v in value) + "]"
    if isinstance(value, dict):
        return "{ " + ", ".join(f"{json.dumps(k)} = {_toml(v)}" for k, v in value.items()) + " }"
    raise TypeError(value)


class Daemon:
    """One `efd serve` in its own process group, restarted with a new incarnation number."""

    def __init__(self, index: int, workdir: Path, store_url: str, hooks: dict[str, str]):
        self.name = f"d{index}"
        self.port = free_port()
        self.workdir = workdir
        self.store_url = store_url
        self.hooks = hooks
        self.incarnation = 0
        self.reloads = 0
        self.proc: subprocess.Popen[bytes] | None = None
        self.up = False  # ready and not being stopped: traffic goes to it
        self.busy = False  # a fault is under way on it
        self.config_path = workdir / f"{self.name}.toml"
        self.log_path = workdir / f"{self.name}.log"

    @property
    def tag(self) -> str:
        return f"{self.name}.{self.incarnation}.{self.reloads}"

    @property
    def key(self) -> str:
        return f"{self.name}.{self.incarnation}"

    def write_config(self) -> None:
        sections: list[tuple[str, dict[str, Any]]] = [
            ("server", {"host": "127.0.0.1", "port": self.port, "parse_processes": 0}),
            ("storage", {"url": self.store_url, "pool_size": 3}),
            (
                "delivery",
                {
                    "timeout_seconds": TIMEOUT_S,
                    "retry_initial_seconds": RETRY_INITIAL_S,
                    "retry_max_seconds": RETRY_MAX_S,
                    "retry_window_seconds": RETRY_WINDOW_S,
                    "lease_seconds": LEASE_S,
                    "circuit_probe_seconds": CIRCUIT_PROBE_S,
                    "allowed_networks": ["127.0.0.0/8"],
                    "sender_processes": 1,
                    "user_agent": f"efd-chaos/{self.tag}",
                },
            ),
            ("logging", {"level": "INFO"}),
        ]
        lines: list[str] = []
        for name, values in sections:
            lines.append(f"[{name}]")
            lines += [f"{k} = {_toml(v)}" for k, v in values.items()]
        lines += [
            "[[sources]]",
            'name = "chaos"',
            f"write_key = {_toml(WRITE_KEY)}",
            f"destinations = {_toml(list(DESTINATIONS))}",
        ]
        for dest, url in self.hooks.items():
            lines += [
                "[[destinations]]",
                f"name = {_toml(dest)}",
                f"ordering = {_toml('per_user' if dest == ORDERED else 'none')}",
                f"shared_secret = {_toml('secret-' + str(self.reloads))}",
                "[[destinations.hooks]]",
                f"url = {_toml(url)}",
                f"headers = {_toml({'X-Chaos-Daemon': self.tag})}",
            ]
        self.config_path.write_text("\n".join(lines) + "\n")

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def _spawn(self) -> None:
        cmd = [sys.executable, "-m", "efd", "serve", "--config", str(self.config_path)]
        # A safety net: the daemon dies with this script even if the script is killed -9.
        # Popen runs in the loop's thread, which lives as long as the script.
        if shutil.which("setpriv"):
            cmd = ["setpriv", "--pdeathsig", "KILL", "--", *cmd]
        with self.log_path.open("ab") as log:
            self.proc = subprocess.Popen(
                cmd, stdout=log, stderr=subprocess.STDOUT, cwd=ROOT, start_new_session=True
            )

    async def start(self, session: aiohttp.ClientSession, timeout: float = 90.0) -> float:
        """Start a new incarnation; return when /healthz answers 200 (the time it did)."""
        self.incarnation += 1
        self.reloads = 0
        self.write_config()
        deadline = CLOCK() + timeout
        self._spawn()
        while CLOCK() < deadline:
            if not self.alive():  # e.g. the store was down at start: try again
                await asyncio.sleep(1.0)
                self._spawn()
                continue
            with contextlib.suppress(aiohttp.ClientError, TimeoutError):
                url = f"http://127.0.0.1:{self.port}/healthz"
                async with session.get(url, timeout=aiohttp.ClientTimeout(total=2)) as r:
                    if r.status == 200:
                        self.up = True
                        return CLOCK()
            await asyncio.sleep(0.2)
        raise RuntimeError(f"{self.name} did not become ready; see {self.log_path}")

    async def healthy(self, session: aiohttp.ClientSession, timeout: float = 90.0) -> float:
        deadline = CLOCK() + timeout
        while CLOCK() < deadline:
            with contextlib.suppress(aiohttp.ClientError, TimeoutError):
                url = f"http://127.0.0.1:{self.port}/healthz"
                async with session.get(url, timeout=aiohttp.ClientTimeout(total=2)) as r:
                    if r.status == 200:
                        return CLOCK()
            await asyncio.sleep(0.2)
        raise RuntimeError(f"{self.name} did not become healthy; see {self.log_path}")

    def kill9(self, group: bool) -> float:
        """SIGKILL to the whole group (a host or cgroup kill), or to the daemon process
        alone (its sender process is left to notice, as after an OOM kill)."""
        assert self.proc is not None
        self.up = False
        with contextlib.suppress(ProcessLookupError):
            if group:
                os.killpg(self.proc.pid, signal.SIGKILL)
            else:
                self.proc.kill()
        t = CLOCK()
        self.proc.wait(30)
        return t

    async def orphans_gone(self, timeout: float) -> bool:
        """Whether the killed daemon's group empties within `timeout` (then SIGKILLed)."""
        assert self.proc is not None
        deadline = CLOCK() + timeout
        while CLOCK() < deadline:
            try:
                os.killpg(self.proc.pid, 0)
            except ProcessLookupError:
                return True
            await asyncio.sleep(0.1)
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.proc.pid, signal.SIGKILL)
        return False

    async def terminate(self) -> int:
        """SIGTERM to the group, as systemd does; SIGKILL after 30 s."""
        assert self.proc is not None
        self.up = False
        proc = self.proc
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGTERM)
        try:
            return await asyncio.to_thread(proc.wait, 30)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(10)
            raise RuntimeError(f"{self.name} ignored SIGTERM for 30 s") from None

    def reload(self) -> None:
        assert self.proc is not None
        self.reloads += 1
        self.write_config()
        self.proc.send_signal(signal.SIGHUP)

    def ensure_stopped(self) -> None:
        if self.proc is None:
            return
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.proc.pid, signal.SIGKILL)  # the group: its sender process too
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.proc.wait(10)


# -- receivers -------------------------------------------------------------------------------


def _reset(request: web.BaseRequest) -> None:
    """Drop the connection with an RST, as a crashed peer's kernel would."""
    transport = request.transport
    if transport is None:
        return
    sock = transport.get_extra_info("socket")
    if sock is not None:
        with contextlib.suppress(OSError):
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    transport.abort()


class Receiver:
    """A webhook receiver that records each delivery it answers 2xx to."""

    def __init__(self, name: str, self_check: str | None):
        self.name = name
        self.port = free_port()
        self.mode = "ok"  # ok | 500 | hang | reset | gone
        self.busy = False
        self.receipts: dict[str, list[Receipt]] = {}
        self.read: list[tuple[str, str]] = []  # (userId, messageId) of each request read
        self.answered = 0
        self.self_check = self_check
        self.runner: web.AppRunner | None = None
        self.site: web.TCPSite | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}/hook"

    async def _handle(self, request: web.Request) -> web.StreamResponse:
        if self.mode in ("reset", "gone"):
            _reset(request)
            return web.Response(status=500)  # never written: the connection is gone
        body = await request.read()
        sent = json.loads(body)
        self.read.append((sent["userId"], sent["messageId"]))
        if self.mode == "500":
            return web.Response(status=500)
        if self.mode == "hang":
            await asyncio.sleep(TIMEOUT_S + 2)  # past efd's timeout: it has given up
            return web.Response(status=503)
        message_id = json.loads(body)["messageId"]
        receipt = Receipt(CLOCK(), request.headers.get("X-Chaos-Daemon", "?"))
        self.answered += 1
        # --self-check: deliberately wrong bookkeeping, to show the accounting notices.
        if self.self_check == "drop" and self.answered == 50:
            return web.Response(status=200)
        self.receipts.setdefault(message_id, []).append(receipt)
        if self.self_check == "duplicate" and self.answered == 50:
            self.receipts[message_id].append(Receipt(CLOCK(), receipt.tag))
        return web.Response(status=200)

    async def start(self) -> None:
        app = web.Application()
        app.router.add_post("/hook", self._handle)
        self.runner = web.AppRunner(app, access_log=None, handler_cancellation=True)
        await self.runner.setup()
        await self.listen()

    async def listen(self) -> None:
        assert self.runner is not None
        self.site = web.TCPSite(self.runner, "127.0.0.1", self.port, reuse_address=True)
        await self.site.start()

    async def vanish(self) -> None:
        self.mode = "gone"  # requests on connections still open are reset
        if self.site is not None:
            await self.site.stop()  # new connections are refused
            self.site = None

    async def stop(self) -> None:
        if self.runner is not None:
            await self.runner.cleanup()


# -- traffic ---------------------------------------------------------------------------------


class Traffic:
    """Segment batch and track requests at a steady rate, each message retried (same
    messageId, any daemon) until acknowledged or 30 s have passed."""

    def __init__(self, soak: Soak, daemons: list[Daemon], rate: float, rng: random.Random):
        self.soak = soak
        self.daemons = daemons
        self.rate = rate
        self.rng = rng
        self.seq = 0
        self.tasks: set[asyncio.Task[None]] = set()

    async def run(self, session: aiohttp.ClientSession, until: float) -> None:
        tick = 0.25
        per_tick = max(1, round(self.rate * tick))
        next_t = CLOCK()
        while CLOCK() < until:
            ids = [f"m{self.seq + i}" for i in range(per_tick)]
            self.seq += per_tick
            if len(self.tasks) < 256:
                if self.rng.random() < 0.2:
                    for mid in ids:
                        self._spawn(self._send(session, "/v1/track", [mid]))
                else:
                    self._spawn(self._send(session, "/v1/batch", ids))
            else:  # bounded: daemons too slow to keep up are not flooded further
                self.soak.skipped_ticks += 1
            next_t += tick
            await asyncio.sleep(max(0.0, next_t - CLOCK()))
        if self.tasks:
            await asyncio.wait(self.tasks, timeout=60)

    def _spawn(self, coro: Any) -> None:
        task = asyncio.ensure_future(coro)
        self.tasks.add(task)
        task.add_done_callback(self.tasks.discard)

    async def _send(self, session: aiohttp.ClientSession, path: str, ids: list[str]) -> None:
        def message(mid: str) -> dict[str, Any]:
            n = int(mid[1:])
            return {
                "type": "track",
                "userId": f"user-{n % 97}",
                "event": "Chaos Tick",
                "messageId": mid,
                "properties": {"n": n},
            }

        body: Any = {"batch": [message(m) for m in ids]} if path == "/v1/batch" else message(ids[0])
        first = CLOCK()
        for mid in ids:
            self.soak.sent[mid] = first
        for attempt in range(30):
            live = [d for d in self.daemons if d.up] or self.daemons
            daemon = self.rng.choice(live)
            try:
                async with session.post(
                    f"http://127.0.0.1:{daemon.port}{path}",
                    json=body,
                    headers=AUTH,
                    timeout=aiohttp.ClientTimeout(total=10),
                ) as r:
                    await r.read()
                    if r.status == 200:
                        t = CLOCK()
                        for mid in ids:
                            self.soak.acked[mid] = t
                        self.soak.requests_ok += 1
                        return
            except (aiohttp.ClientError, TimeoutError):
                pass
            self.soak.request_failures += 1
            if CLOCK() - first > 30:
                break
            await asyncio.sleep(min(2.0, 0.2 * (attempt + 1)))
        self.soak.abandoned += len(ids)


# -- faults ----------------------------------------------------------------------------------


class Faults:
    def __init__(
        self,
        soak: Soak,
        daemons: list[Daemon],
        receivers: dict[str, Receiver],
        cluster: PrivateCluster | None,
        session: aiohttp.ClientSession,
        rng: random.Random,
        gap: tuple[float, float],
    ):
        self.soak = soak
        self.daemons = daemons
        self.receivers = receivers
        self.cluster = cluster
        self.session = session
        self.rng = rng
        self.gap = gap
        self.pg_busy = False
        self.pg_stops = 0
        self.store_down: list[Window] = []

    async def run(self, until: float) -> None:
        kinds = PG_KINDS if self.cluster is not None else SQLITE_KINDS
        bag: list[str] = []
        tasks: list[asyncio.Task[None]] = []
        for _ in range(100_000):
            gap = self.rng.uniform(*self.gap)
            if CLOCK() + gap >= until:
                break
            await asyncio.sleep(gap)
            if not bag:  # every kind once per round, in a seeded order
                bag = list(kinds)
                self.rng.shuffle(bag)
            kind = bag.pop()
            fault = self._fault(kind)
            if fault is None:
                self.soak.skipped_faults += 1
                continue
            self.soak.faults[kind] += 1
            tasks.append(asyncio.ensure_future(fault))
        if tasks:  # every fault ends by putting things back
            await asyncio.gather(*tasks)

    def _fault(self, kind: str) -> Any:
        rng = self.rng
        if kind.startswith("recv_"):
            free = [r for r in self.receivers.values() if not r.busy]
            if not free:
                return None
            receiver = rng.choice(free)
            receiver.busy = True
            return self._receiver_fault(receiver, kind[5:], rng.uniform(2, 6))
        if kind == "pg_stop":
            if self.pg_busy:
                return None
            self.pg_busy = True
            self.pg_stops += 1
            mode = "immediate" if self.pg_stops % 2 else "fast"
            return self._pg_stop(mode, rng.uniform(2, 6))
        free_d = [d for d in self.daemons if not d.busy and d.up]
        if not free_d:
            return None
        if kind in ("kill9", "sigterm") and len(self.daemons) > 1:
            # Some daemon keeps taking traffic.
            others_up = [d for d in self.daemons if d.up and not d.busy]
            if len(others_up) < 2:
                return None
        daemon = rng.choice(free_d)
        daemon.busy = True
        if kind == "kill9":
            return self._kill9(daemon, rng.uniform(0.5, 3), group=rng.random() < 0.5)
        if kind == "sigterm":
            return self._sigterm(daemon, rng.uniform(0.5, 2))
        return self._reload(daemon)

    async def _receiver_fault(self, receiver: Receiver, mode: str, seconds: float) -> None:
        start = CLOCK()
        say(f"receiver {receiver.name}: {mode} for {seconds:.1f} s")
        try:
            if mode == "gone":
                await receiver.vanish()
            else:
                receiver.mode = mode
            await asyncio.sleep(seconds)
        finally:
            if mode == "gone":
                await receiver.listen()
            receiver.mode = "ok"
            receiver.busy = False
        self.soak.windows.append(Window(f"recv_{mode}", start, CLOCK(), receiver.name))
        say(f"receiver {receiver.name}: ok again")

    async def _kill9(self, daemon: Daemon, down: float, group: bool) -> None:
        try:
            key = daemon.key
            pid = daemon.proc.pid if daemon.proc else 0
            t = daemon.kill9(group)
            self.soak.endings[key] = Ending("kill9", t)
            what = "its process group" if group else "the daemon process only"
            say(f"kill -9 {key}: {what} (pid {pid}); restart in {down:.1f} s")
            if not group and not await daemon.orphans_gone(10.0):
                self.soak.orphans_lingering += 1
                say(f"{key}: its sender process outlived it by 10 s")
            await asyncio.sleep(down)
            ready = await daemon.start(self.session)
            # On PostgreSQL the killed process's claims wait for their lease to lapse.
            end = max(ready, t + LEASE_S) if self.cluster is not None else ready
            self.soak.windows.append(Window("kill9", t, end, "all"))
            say(f"{daemon.key} ready ({ready - t:.1f} s after the kill)")
        finally:
            daemon.busy = False

    async def _sigterm(self, daemon: Daemon, down: float) -> None:
        try:
            key = daemon.key
            t = CLOCK()
            say(f"SIGTERM {key}")
            code = await daemon.terminate()
            self.soak.endings[key] = Ending("sigterm", t)
            say(f"{key} exited {code} after {CLOCK() - t:.1f} s; restart in {down:.1f} s")
            await asyncio.sleep(down)
            ready = await daemon.start(self.session)
            self.soak.windows.append(Window("sigterm", t, ready, "all"))
            say(f"{daemon.key} ready")
        finally:
            daemon.busy = False

    async def _reload(self, daemon: Daemon) -> None:
        try:
            daemon.reload()
            self.soak.reload_tags.append(daemon.tag)
            say(f"SIGHUP {daemon.key}: headers now {daemon.tag}")
            await asyncio.sleep(1.0)  # one reload at a time per daemon
        finally:
            daemon.busy = False

    async def _pg_stop(self, mode: str, seconds: float) -> None:
        assert self.cluster is not None
        try:
            t = CLOCK()
            say(f"PostgreSQL stop -m {mode} for {seconds:.1f} s")
            await asyncio.to_thread(self.cluster.stop, mode)
            if mode == "immediate":
                self.soak.store_crashes.append((t, CLOCK()))
            await asyncio.sleep(seconds)
            await asyncio.to_thread(self.cluster.start)
            back = CLOCK()
            say(f"PostgreSQL up again after {back - t:.1f} s")
            live = [d for d in self.daemons if d.alive()]
            ends = await asyncio.gather(*(d.healthy(self.session) for d in live))
            end = max([back, *ends])
            window = Window("pg_stop", t, end, "all")
            self.soak.windows.append(window)
            self.store_down.append(window)
            say(f"every daemon healthy {end - back:.1f} s after PostgreSQL came back")
        finally:
            self.pg_busy = False


# -- accounting ------------------------------------------------------------------------------


def _sa_url(url: str) -> str:
    return url.replace("postgresql://", "postgresql+psycopg://", 1)


def delivery_statuses(store_url: str, ids: list[str]) -> dict[tuple[str, str], str]:
    """(destination, messageId) -> deliveries.status, for the messages not received."""
    if not ids:
        return {}
    engine = sa.create_engine(_sa_url(store_url))
    try:
        with engine.connect() as conn:
            rows = conn.execute(
                sa.text(
                    "SELECT d.destination, m.message_id, d.status FROM deliveries d"
                    " JOIN messages m ON m.id = d.message_pk"
                    " WHERE m.message_id IN :ids"
                ).bindparams(sa.bindparam("ids", expanding=True)),
                {"ids": ids},
            ).all()
    finally:
        engine.dispose()
    return {(r[0], r[1]): r[2] for r in rows}


def lanes_backwards(read: list[tuple[str, str]], soak: Soak) -> list[str]:
    """Where the ordered receiver's sequence of a lane (a user) went backwards: a message
    read again after a later one of its lane, or read after a message that was sent only
    once it had been acknowledged (an order the client made, which efd must keep). Messages
    sent at the same time, to one daemon or several, have no order between them."""
    current: dict[str, str] = {}
    left: dict[str, set[str]] = {}
    latest_sent: dict[str, tuple[float, str]] = {}  # lane -> the latest first request read
    found = []
    for user, mid in read:
        if current.get(user) == mid:
            continue  # the same message again: a retry
        done = left.setdefault(user, set())
        if mid in done:
            found.append(f"{user}: {mid} read again after {current[user]}")
        if user in current:
            done.add(current[user])
        current[user] = mid
        acked = soak.acked.get(mid)
        before = latest_sent.get(user)
        if acked is not None and before is not None and before[0] > acked:
            found.append(
                f"{user}: {mid} (acknowledged at {acked:.2f}s) after {before[1]}, first sent "
                f"at {before[0]:.2f}s"
            )
        sent = soak.sent.get(mid, 0.0)
        if before is None or sent > before[0]:
            latest_sent[user] = (sent, mid)
    return found


def explain(first: Receipt, again: Receipt, soak: Soak, store_down: list[Window]) -> str | None:
    """Why a second receipt is allowed: the first was answered to a daemon incarnation that
    was then killed -9 before it could record the outcome, or just before or while
    PostgreSQL crashed (claims and outcomes commit without waiting for the WAL's flush, so the last
    moments of them are lost with the server), and the second came after. None when
    nothing explains it."""
    for crash, gone in soak.store_crashes:
        if first.t <= gone and crash <= again.t and crash - first.t <= COMMIT_WINDOW_S:
            if first.t > crash:
                return f"PostgreSQL was crashing ({first.t - crash:.2f} s into its stop)"
            return f"PostgreSQL crashed {crash - first.t:.2f} s after this receipt"
    ending = soak.endings.get(first.incarnation)
    if ending is None or ending.how != "kill9":
        return None
    kill = ending.t
    if first.t > kill + KILL_SLACK_S or again.t < kill:
        return None
    if kill - first.t <= COMMIT_WINDOW_S:
        return f"{first.incarnation} killed -9 {kill - first.t:.2f} s after this receipt"
    for w in store_down:  # the outcome could not be committed while the store was down
        if w.start <= kill and w.end >= first.t:
            return f"{first.incarnation} killed -9 while the store was down since {w.start:.1f}"
    return None


def account(
    soak: Soak,
    receivers: dict[str, Receiver],
    statuses: dict[tuple[str, str], str],
    store_down: list[Window],
) -> dict[str, Any]:
    lost: list[str] = []
    expired = failed = delivered = 0
    duplicates: list[dict[str, Any]] = []
    max_delay = max_all = 0.0
    counted = 0
    for dest in DESTINATIONS:
        receipts = receivers[dest].receipts
        windows = [w for w in soak.windows if w.scope in ("all", dest)]
        for mid, acked_at in soak.acked.items():
            got = receipts.get(mid)
            if not got:
                status = statuses.get((dest, mid), "missing")
                if status == "expired":
                    expired += 1
                elif status == "failed":
                    failed += 1
                else:
                    lost.append(f"{dest}/{mid} ({status})")
                continue
            delivered += 1
            first = got[0].t
            delay = max(0.0, first - acked_at)
            max_all = max(max_all, delay)
            # Outside outages: no outage window, stretched by one full back-off, overlaps
            # the time from acknowledgement to delivery.
            if not any(w.start <= first and w.end + RETRY_MAX_S >= acked_at for w in windows):
                counted += 1
                max_delay = max(max_delay, delay)
        for mid, got in receipts.items():
            for previous, again in itertools.pairwise(got):
                reason = explain(previous, again, soak, store_down)
                duplicates.append(
                    {
                        "destination": dest,
                        "messageId": mid,
                        "first": f"{previous.t:.2f}s by {previous.tag}",
                        "again": f"{again.t:.2f}s by {again.tag}",
                        "explained": reason,
                    }
                )
    unacked = sum(1 for r in receivers.values() for mid in r.receipts if mid not in soak.acked)
    unexplained = [d for d in duplicates if d["explained"] is None]
    # A reload took effect when a delivery carried the header it set.
    tags = {x.tag for r in receivers.values() for got in r.receipts.values() for x in got}
    reloads_seen = sum(1 for tag in soak.reload_tags if tag in tags)
    return {
        "acknowledged": len(soak.acked),
        "deliveries_expected": len(soak.acked) * len(DESTINATIONS),
        "delivered": delivered,
        "lost": len(lost),
        "lost_examples": lost[:20],
        "duplicates": len(duplicates),
        "duplicates_explained": len(duplicates) - len(unexplained),
        "duplicates_unexplained": unexplained[:20],
        "expired": expired,
        "failed": failed,
        "max_delay_s": round(max_delay, 3),
        "delays_counted": counted,
        "max_delay_all_s": round(max_all, 3),
        "delivered_unacknowledged": unacked,
        "abandoned_unacknowledged": soak.abandoned,
        "requests_ok": soak.requests_ok,
        "request_failures": soak.request_failures,
        "skipped_ticks": soak.skipped_ticks,
        "faults": dict(sorted(soak.faults.items())),
        "skipped_faults": soak.skipped_faults,
        "orphans_lingering": soak.orphans_lingering,
        "reloads_seen_in_deliveries": f"{reloads_seen}/{len(soak.reload_tags)}",
        "outage_windows": len(soak.windows),
        "_duplicates": duplicates,
    }


# -- the soak --------------------------------------------------------------------------------


def commit() -> str:
    done = subprocess.run(
        ["git", "rev-parse", "--short", "HEAD"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=False,
    )
    dirty = subprocess.run(
        ["git", "status", "--porcelain", "--untracked-files=no"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=False,
    )
    return done.stdout.strip() + ("+dirty" if dirty.stdout.strip() else "")


async def soak(args: argparse.Namespace, workdir: Path) -> dict[str, Any]:
    seed = args.seed if args.seed is not None else random.SystemRandom().randrange(1 << 31)
    say(f"store {args.store}, {args.minutes} minutes, seed {seed}, workdir {workdir}")
    fault_rng = random.Random(seed)
    traffic_rng = random.Random(seed + 1)
    state = Soak()
    receivers = {d: Receiver(d, args.self_check if d == "alpha" else None) for d in DESTINATIONS}
    cluster: PrivateCluster | None = None
    daemons: list[Daemon] = []
    connector = aiohttp.TCPConnector(limit=200)
    session = aiohttp.ClientSession(connector=connector)
    try:
        for r in receivers.values():
            await r.start()
        hooks = {d: r.url for d, r in receivers.items()}
        if args.store == "postgresql":
            cluster = PrivateCluster()
            await asyncio.to_thread(cluster.init)
            say(f"private PostgreSQL cluster on port {cluster.port} in {cluster.data}")
            store_url = cluster.url
            count = 3
        else:
            store_url = f"sqlite:///{workdir}/efd.db"
            count = 1
        daemons = [Daemon(i + 1, workdir, store_url, hooks) for i in range(count)]
        await daemons[0].start(session)  # creates the schema before the others start
        await asyncio.gather(*(d.start(session) for d in daemons[1:]))
        say(f"{count} daemon(s) ready; traffic at {args.rate:g} messages/s")

        until = CLOCK() + args.minutes * 60
        faults = Faults(state, daemons, receivers, cluster, session, fault_rng, args.gap)
        traffic = Traffic(state, daemons, args.rate, traffic_rng)
        await asyncio.gather(traffic.run(session, until), faults.run(until))
        say(f"faults over; {len(state.acked)} messages acknowledged; draining")

        expected = {(d, m) for d in DESTINATIONS for m in state.acked}
        deadline = CLOCK() + args.drain_seconds
        missing = expected
        while CLOCK() < deadline:
            missing = {(d, m) for d, m in missing if m not in receivers[d].receipts}
            if not missing:
                break
            await asyncio.sleep(0.25)
        say(f"drain ended {CLOCK() - until:.1f} s after the soak time; {len(missing)} not received")
        statuses = delivery_statuses(store_url, sorted({m for _, m in missing}))
        backwards = lanes_backwards(receivers[ORDERED].read, state)
        for d in daemons:
            if d.alive():
                code = await d.terminate()
                state.endings[d.key] = Ending("final", CLOCK())
                say(f"{d.key} stopped (exit {code})")
        result = account(state, receivers, statuses, faults.store_down)
        result["ordered_requests_read"] = len(receivers[ORDERED].read)
        result["ordered_backwards"] = len(backwards)
        result["ordered_backwards_examples"] = backwards[:20]
        return {"store": args.store, "minutes": args.minutes, "seed": seed, **result}
    finally:
        for d in daemons:
            d.ensure_stopped()
        await session.close()
        for r in receivers.values():
            await r.stop()
        if cluster is not None:
            await asyncio.to_thread(cluster.remove)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--store", choices=["sqlite", "postgresql"], required=True)
    parser.add_argument("--minutes", type=float, default=10.0)
    parser.add_argument("--seed", type=int, default=None)
    parser.add_argument("--rate", type=float, default=40.0, help="messages per second")
    parser.add_argument(
        "--gap",
        type=float,
        nargs=2,
        default=(3.0, 12.0),
        metavar=("MIN", "MAX"),
        help="seconds between fault starts, drawn uniformly",
    )
    parser.add_argument("--drain-seconds", type=float, default=180.0)
    parser.add_argument("--keep", action="store_true", help="keep the logs and the database")
    parser.add_argument(
        "--self-check",
        choices=["drop", "duplicate"],
        help="make receiver alpha mis-record its 50th delivery, to show the accounting fails",
    )
    args = parser.parse_args()
    logging.basicConfig(level=logging.CRITICAL)  # the receivers' resets are intended
    # SIGTERM (and Ctrl-C) end the soak through the same cleanup as an error.
    signal.signal(signal.SIGTERM, signal.default_int_handler)
    workdir = Path(tempfile.mkdtemp(prefix="efd-chaos-"))
    version = commit()
    ok = False
    try:
        result = asyncio.run(soak(args, workdir))
        duplicates = result.pop("_duplicates")
        for dup in duplicates:
            print(
                f"duplicate {dup['destination']}/{dup['messageId']}: first {dup['first']},"
                f" again {dup['again']}: {dup['explained'] or 'UNEXPLAINED'}"
            )
        ok = (
            result["lost"] == 0
            and result["duplicates"] == result["duplicates_explained"]
            and result["ordered_backwards"] == 0
        )
        if not ok:
            print(f"logs kept in {workdir}")
        print(json.dumps({"commit": version, **result}), flush=True)
    finally:
        if ok and not args.keep:
            shutil.rmtree(workdir, ignore_errors=True)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
