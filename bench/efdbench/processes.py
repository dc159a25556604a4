"""The processes a run starts: pipe-driven workers, efd daemons, and py-spy."""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import socket
import sqlite3
import subprocess
import sys
import time
import urllib.request
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from efdbench.bodies import SECRET, WRITE_KEY


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


# How the daemons' destination signs (`bench/run.py --signing`): the configuration lines.
_WHSEC = (
    "whsec_" + "MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw",
    "whsec_" + "c2Vjb25kLWJlbmNoLXNlY3JldC0wMTIzNDU2Nzg5",
)
SIGNING = {
    "none": [],
    "x-signature": [f'shared_secret = "{SECRET}"'],
    "both": [
        f'shared_secret = "{SECRET}"',
        'signing = ["x-signature", "standard-webhooks"]',
        f'standard_webhooks_secrets = ["{_WHSEC[0]}", "{_WHSEC[1]}"]',
    ],
}


class Daemon:
    """`python -m efd serve` in its own directory, on a fresh SQLite database there or on
    `storage_url` (a PostgreSQL database that several daemons may share)."""

    signing = "x-signature"  # the run's --signing

    def __init__(
        self,
        name: str,
        root: Path,
        delivery: dict[str, Any],
        hook_url: str,
        storage_url: str | None = None,
        signing: str | None = None,
        server: dict[str, Any] | None = None,
        storage: dict[str, Any] | None = None,
        db: Path | None = None,
        destination: list[str] | None = None,
    ) -> None:
        signing = signing or Daemon.signing
        self.name = name
        self.dir = root / name
        self.dir.mkdir(parents=True)
        self.db = db or self.dir / "efd.db"
        self.storage_url = storage_url
        self.port = free_port()
        self.log_path = self.dir / "efd.log"
        lines = [
            "[server]",
            'host = "127.0.0.1"',
            f"port = {self.port}",
            *(f"{k} = {json.dumps(v)}" for k, v in (server or {}).items()),
            "[storage]",
            f'url = "{storage_url or f"sqlite:///{self.db}"}"',
            *(f"{k} = {json.dumps(v)}" for k, v in (storage or {}).items()),
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
            *SIGNING[signing],
            *(
                destination
                if destination is not None
                else ['type = "webhooks"', "[[destinations.hooks]]", f'url = "{hook_url}"']
            ),
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

    def _metrics(self) -> str:
        try:
            with urllib.request.urlopen(
                f"http://127.0.0.1:{self.port}/metrics", timeout=5
            ) as response:
                return str(response.read().decode())
        except OSError:
            return ""

    def circuit_open(self) -> bool:
        """Whether any hook's circuit is open, from the daemon's /metrics."""
        return any(
            line.startswith("efd_circuit_open{") and float(line.rsplit(" ", 1)[1]) > 0
            for line in self._metrics().splitlines()
        )

    def handed_over(self) -> tuple[float, float]:
        """(deliveries handed over at ingestion, deliveries delivered) so far."""
        return (
            self.counter("efd_deliveries_handed_over_total"),
            self.counter("efd_deliveries_delivered_total"),
        )

    def handed_over_share(self, since: tuple[float, float] = (0.0, 0.0)) -> float | None:
        """Of the deliveries the daemon delivered since `since` (a `handed_over()`), the
        share started without a claim (efd/delivery/handoff.py); None where it counts
        neither."""
        handed, delivered = self.handed_over()
        if delivered <= since[1]:
            return None
        return round((handed - since[0]) / (delivered - since[1]), 3)

    def counter(self, name: str) -> float:
        """The sum of a counter's samples over its labels, from the daemon's /metrics (0 if
        the daemon has no such counter)."""
        return sum(
            float(line.rsplit(" ", 1)[1])
            for line in self._metrics().splitlines()
            if line.startswith((name + "{", name + " "))
        )

    def pending(self) -> int:
        query = "SELECT count(*) FROM deliveries WHERE status = 'pending'"
        if self.storage_url is not None:
            import psycopg

            with psycopg.connect(self.storage_url.replace("+psycopg", "")) as pg:
                row = pg.execute(query).fetchone()
                return int(row[0]) if row else 0
        with contextlib.closing(sqlite3.connect(f"file:{self.db}?mode=ro", uri=True)) as db:
            db.execute("PRAGMA busy_timeout=10000")
            return int(db.execute(query).fetchone()[0])

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
                "--format", "raw", "-o", str(raw), "--subprocesses",
                *(["--gil"] if self.gil else []),
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


def db_bytes(db: Path) -> int:
    return sum(p.stat().st_size for p in db.parent.glob(db.name + "*") if p.is_file())
