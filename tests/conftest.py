"""Shared fixtures: real databases, real receivers on 127.0.0.1, real daemons.

Every test that touches storage runs once on a SQLite file and once on an empty PostgreSQL
database with the migrated schema (a copy of a migrated template, emptied and reused by the
worker for its next test: pg_database). Set EFD_TEST_DB=sqlite to skip PostgreSQL
locally; the README's test command sets EFD_REQUIRE_PG=1 so CI cannot skip it silently.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import itertools
import json
import os
import re
import shutil
import signal
import socket
import ssl
import subprocess
import sys
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

import aiohttp
import psycopg
import pytest
from aiohttp import web
from sqlalchemy import create_engine, text

from efd import config
from efd.daemon import Daemon
from efd.store import migrate

PG_ADMIN_URL = os.environ.get("EFD_TEST_PG", "postgresql://postgres@127.0.0.1:5432/postgres")
WRITE_KEY = "wk_test"
SECRET = "test-secret"
ROOT = Path(__file__).resolve().parents[1]


# -- databases --------------------------------------------------------------------------


def _backends() -> list[str]:
    return [b.strip() for b in os.environ.get("EFD_TEST_DB", "sqlite,postgresql").split(",")]


def _pg_available() -> bool:
    try:
        with psycopg.connect(PG_ADMIN_URL, connect_timeout=3):
            return True
    except psycopg.Error:
        return False


@pytest.fixture(scope="session")
def pg_template() -> Iterator[str]:
    """A migrated template database; tests get copies of it (pg_database)."""
    if not _pg_available():
        if os.environ.get("EFD_REQUIRE_PG") == "1":
            pytest.fail(f"PostgreSQL is required but not reachable at {PG_ADMIN_URL}")
        pytest.skip(f"PostgreSQL not reachable at {PG_ADMIN_URL}")
    name = f"efd_template_{os.getpid()}"
    with psycopg.connect(PG_ADMIN_URL, autocommit=True) as conn:
        conn.execute(f'DROP DATABASE IF EXISTS "{name}"')
        conn.execute(f'CREATE DATABASE "{name}"')
    url = _pg_url(name)
    migrate.upgrade(url)
    with psycopg.connect(url) as conn:
        _template_shape[name] = _shape(conn)
    yield name
    with psycopg.connect(PG_ADMIN_URL, autocommit=True) as conn:
        for spare in [*_spare, name]:
            conn.execute(f'DROP DATABASE IF EXISTS "{spare}" WITH (FORCE)')
    _spare.clear()


def _pg_url(database: str) -> str:
    base = PG_ADMIN_URL.rsplit("/", 1)[0]
    return f"{base}/{database}"


# A copy of the template costs PostgreSQL about a quarter of a CPU-second (CREATE DATABASE
# writes every page of it through the WAL, DROP removes the files again); emptying a database
# a test has used costs a fraction of that. So each worker keeps the databases its finished
# tests used, each emptied at once (sessions ended, every table but alembic_version
# truncated, sequences restarted), and hands them to its next tests. A database whose schema
# a test changed (a migration test, a downgrade) is dropped instead: only the template's own
# shape is reused.
_spare: list[str] = []
_template_shape: dict[str, str] = {}

_SHAPE = """
SELECT string_agg(item, E'\\n' ORDER BY item) FROM (
  SELECT 'rel ' || n.nspname || '.' || c.relname || ' ' || c.relkind::text
    FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
   WHERE n.nspname NOT IN ('pg_catalog', 'information_schema') AND n.nspname NOT LIKE 'pg_toast%'
  UNION ALL
  SELECT 'col ' || table_schema || '.' || table_name || '.' || column_name || ' ' || data_type
         || ' ' || is_nullable || ' ' || coalesce(column_default, '')
    FROM information_schema.columns
   WHERE table_schema NOT IN ('pg_catalog', 'information_schema')
  UNION ALL
  SELECT 'con ' || conrelid::regclass::text || ' ' || conname || ' ' || pg_get_constraintdef(oid)
    FROM pg_constraint WHERE connamespace = 'public'::regnamespace
  UNION ALL
  SELECT 'idx ' || indexname || ' ' || indexdef FROM pg_indexes
   WHERE schemaname NOT IN ('pg_catalog', 'information_schema')
  UNION ALL
  SELECT 'fn ' || p.oid::regprocedure::text FROM pg_proc p
   WHERE p.pronamespace = 'public'::regnamespace
  UNION ALL
  SELECT 'trg ' || tgname FROM pg_trigger WHERE NOT tgisinternal
  UNION ALL
  SELECT 'ext ' || extname FROM pg_extension
  UNION ALL
  SELECT 'ver ' || version_num FROM alembic_version
) AS shape(item)
"""


def _shape(conn: psycopg.Connection[Any]) -> str:
    row = conn.execute(_SHAPE).fetchone()
    return str(row[0] if row else "")


def _empty(name: str, template: str) -> bool:
    """Whether `name` is again as the template left it (else it is to be dropped)."""
    try:
        with psycopg.connect(PG_ADMIN_URL, autocommit=True) as admin:
            admin.execute(
                "SELECT pg_terminate_backend(pid) FROM pg_stat_activity"
                " WHERE datname = %s AND pid <> pg_backend_pid()",
                [name],
            )
        with psycopg.connect(_pg_url(name), autocommit=True) as conn:
            conn.execute("SET lock_timeout = '10s'")
            if _shape(conn) != _template_shape.get(template):
                return False
            # TRUNCATE keeps the planner's statistics (a test's ANALYZE, or autovacuum's):
            # a test that needs none could not have them.
            [(analyzed,)] = conn.execute(
                "SELECT EXISTS (SELECT 1 FROM pg_stats WHERE schemaname = 'public')"
            ).fetchall()
            if analyzed:
                return False
            tables = [
                f'"{schema}"."{table}"'
                for schema, table in conn.execute(
                    "SELECT schemaname, tablename FROM pg_tables"
                    " WHERE schemaname NOT IN ('pg_catalog', 'information_schema')"
                    " AND tablename <> 'alembic_version'"
                )
            ]
            if tables:
                conn.execute(f"TRUNCATE {', '.join(tables)} RESTART IDENTITY CASCADE")
        return True
    except psycopg.Error:
        return False


@contextlib.contextmanager
def pg_database(template: str, prefix: str = "efd_test") -> Iterator[str]:
    """The URL of a PostgreSQL database with the template's schema and no rows, for one
    test: a spare one this worker emptied, or a new copy of the template."""
    if _spare:
        name = _spare.pop()
    else:
        name = f"{prefix}_{uuid.uuid4().hex[:12]}"
        with psycopg.connect(PG_ADMIN_URL, autocommit=True) as conn:
            conn.execute(f'CREATE DATABASE "{name}" TEMPLATE "{template}"')
    try:
        yield _pg_url(name)
    finally:
        if _empty(name, template):
            _spare.append(name)
        else:
            with psycopg.connect(PG_ADMIN_URL, autocommit=True) as conn:
                conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


@pytest.fixture(params=_backends())
def db_url(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[str]:
    if request.param == "sqlite":
        yield f"sqlite:///{tmp_path / 'efd.db'}"
        return
    with pg_database(request.getfixturevalue("pg_template")) as url:
        yield url


@pytest.fixture
def sqlite_url(tmp_path: Path) -> str:
    """A store for whole-process tests of what does not depend on it (signals, the watchdog,
    reloading the configuration, child processes): they run once, on SQLite; the storage
    paths they pass through are tested on both backends elsewhere."""
    return f"sqlite:///{tmp_path / 'efd.db'}"


def sql(url: str, statement: str, **params: Any) -> list[Any]:
    """Run one query the way an operator would, and return its rows."""
    from efd.store.engine import normalise_url

    engine = create_engine(normalise_url(url))
    try:
        with engine.begin() as conn:
            result = conn.execute(text(statement), params)
            return list(result.all()) if result.returns_rows else []
    finally:
        engine.dispose()


# -- receivers --------------------------------------------------------------------------


@dataclass
class Received:
    path: str
    headers: dict[str, str]
    body: bytes
    at: float
    method: str = "POST"
    target: str = ""  # the request target as sent: path and query, still percent-encoded
    # Every header line as sent, in order (`headers` keeps one of each name).
    header_lines: list[tuple[str, str]] = field(default_factory=list)

    def json(self) -> Any:
        return json.loads(self.body)


Behaviour = Callable[[web.Request, int], Awaitable[web.StreamResponse]]


async def ok(_request: web.Request, _n: int) -> web.StreamResponse:
    return web.json_response({"ok": True})


@dataclass
class Receiver:
    """A real HTTP server on 127.0.0.1. `behaviour(request, n)` answers the n-th request."""

    behaviour: Behaviour = ok
    received: list[Received] = field(default_factory=list)
    url: str = ""
    _runner: web.AppRunner | None = None
    _event: asyncio.Event = field(default_factory=asyncio.Event)

    async def start(self, ssl_context: ssl.SSLContext | None = None, port: int = 0) -> Receiver:
        async def handle(request: web.Request) -> web.StreamResponse:
            body = await request.read()
            lines = [(k.decode("latin-1"), v.decode("latin-1")) for k, v in request.raw_headers]
            self.received.append(
                Received(
                    request.path,
                    dict(request.headers),
                    body,
                    time.time(),
                    request.method,
                    request.raw_path,
                    lines,
                )
            )
            self._event.set()
            return await self.behaviour(request, len(self.received))

        app = web.Application()
        app.router.add_route("*", "/{tail:.*}", handle)
        self._runner = web.AppRunner(app, access_log=None, shutdown_timeout=0.5)
        await self._runner.setup()
        site = web.TCPSite(self._runner, "127.0.0.1", port, ssl_context=ssl_context)
        await site.start()
        bound = int(self._runner.addresses[0][1])
        scheme = "https" if ssl_context else "http"
        host = "localhost" if ssl_context else "127.0.0.1"
        self.url = f"{scheme}://{host}:{bound}/hook"
        return self

    async def stop(self) -> None:
        if self._runner is not None:
            await self._runner.cleanup()

    async def wait_for(self, count: int, timeout: float = 10.0) -> list[Received]:
        deadline = time.monotonic() + timeout
        while len(self.received) < count:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise AssertionError(
                    f"expected {count} requests at {self.url}, got {len(self.received)}"
                )
            self._event.clear()
            try:
                async with asyncio.timeout(min(remaining, 0.2)):
                    await self._event.wait()
            except TimeoutError:
                pass
        return self.received


class ReceiverFactory(Protocol):
    """The receiver_factory fixture: a started Receiver, stopped after the test."""

    async def __call__(
        self,
        behaviour: Behaviour = ...,
        *,
        ssl_context: ssl.SSLContext | None = ...,
        port: int = ...,
    ) -> Receiver: ...


@pytest.fixture
async def receiver_factory() -> AsyncIterator[ReceiverFactory]:
    started: list[Receiver] = []

    async def make(
        behaviour: Behaviour = ok, *, ssl_context: ssl.SSLContext | None = None, port: int = 0
    ) -> Receiver:
        receiver = await Receiver(behaviour).start(ssl_context, port)
        started.append(receiver)
        return receiver

    yield make
    for receiver in started:
        await receiver.stop()


_ports = itertools.count()


def free_port() -> int:
    """A port for a process a test starts. Each pytest-xdist worker takes its own range,
    below the kernel's ephemeral ports, so no other worker (nor any port 0 bind) can take
    it between this check and the process binding it."""
    worker = int(os.environ.get("PYTEST_XDIST_WORKER", "gw0").removeprefix("gw") or 0)
    # EFD_TEST_PORT_BASE: runs of the suite side by side on one machine take apart ranges.
    base = int(os.environ.get("EFD_TEST_PORT_BASE", "20000"))
    while True:
        port = base + worker * 1000 + next(_ports) % 1000
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", port))
            except OSError:
                continue  # taken (a process of this worker's still holds it)
            return port


# -- daemons ----------------------------------------------------------------------------


def settings_dict(db_url: str, hooks: list[str] | None = None, **sections: Any) -> dict[str, Any]:
    """A configuration: one source `web` -> one destination `hooks` with the given URLs."""
    delivery = {
        "timeout_seconds": 5,
        "retry_initial_seconds": 0.05,
        "retry_max_seconds": 0.2,
        "retry_window_seconds": 30,
        "allowed_networks": ["127.0.0.0/8"],
        # No sender or parser process: each would cost a Python start-up per daemon, and
        # the suite starts hundreds. tests/integration/test_workers.py covers them.
        "sender_processes": 0,
        # A receiver slowed by a loaded machine can open a hook's circuit; the tests' short
        # back-offs call for a probe as short, or the backlog waits the default 30 s.
        "circuit_probe_seconds": 1,
    }
    delivery.update(sections.pop("delivery", {}))
    result: dict[str, Any] = {
        "server": {"host": "127.0.0.1", "port": 0, "parse_processes": 0},
        "storage": {"url": db_url},
        "delivery": delivery,
        "sources": [{"name": "web", "write_key": WRITE_KEY, "destinations": ["hooks"]}],
        "destinations": [
            {
                "name": "hooks",
                "type": "webhooks",
                "shared_secret": SECRET,
                "hooks": [{"url": url} for url in (hooks or ["http://127.0.0.1:9/unused"])],
            }
        ],
    }
    result.update(sections)
    return result


class StartedDaemon(Daemon):
    """A Daemon daemon_factory has started, so its port is bound."""

    @property
    def port(self) -> int:
        port = super().port
        assert port is not None, "the daemon is not listening"
        return port


# The daemon_factory fixture: a started daemon for the settings, stopped after the test.
DaemonFactory = Callable[[dict[str, Any]], Awaitable[StartedDaemon]]


@pytest.fixture
async def daemon_factory() -> AsyncIterator[DaemonFactory]:
    started: list[Daemon] = []

    async def make(settings: dict[str, Any]) -> StartedDaemon:
        daemon = StartedDaemon(config.load(None, **settings))
        started.append(daemon)
        await daemon.start()
        return daemon

    yield make
    for daemon in started:
        await daemon.stop()


def basic(write_key: str = WRITE_KEY) -> dict[str, str]:
    token = base64.b64encode(f"{write_key}:".encode()).decode()
    return {"Authorization": f"Basic {token}"}


async def post(
    port: int, path: str, payload: Any, headers: dict[str, str] | None = None
) -> tuple[int, Any]:
    data = payload if isinstance(payload, bytes) else json.dumps(payload).encode()
    async with (
        aiohttp.ClientSession() as session,
        session.post(
            f"http://127.0.0.1:{port}{path}",
            data=data,
            headers={"Content-Type": "application/json", **basic(), **(headers or {})},
        ) as response,
    ):
        return response.status, await response.json(content_type=None)


def content_length(head: bytes) -> int:
    """The Content-Length of a response's head, read off the wire."""
    found = re.search(rb"Content-Length: (\d+)", head)
    assert found is not None, head
    return int(found[1])


async def eventually(
    check: Callable[[], Any], timeout: float = 10.0, interval: float = 0.05
) -> Any:
    """Poll `check` until it returns a truthy value; fail with the last value otherwise."""
    deadline = time.monotonic() + timeout
    value = None
    while time.monotonic() < deadline:
        value = check()
        if value:
            return value
        await asyncio.sleep(interval)
    raise AssertionError(f"condition not met within {timeout} s (last value: {value!r})")


# -- processes --------------------------------------------------------------------------


def file_permissions_apply() -> list[str]:
    """A command prefix under which file permissions hold for this process's children: root
    reads any file through CAP_DAC_OVERRIDE, so as root the child runs without it (setpriv),
    still as root, so it can read what the test made. Skips when that cannot be done."""
    if os.geteuid() != 0:
        return []
    if shutil.which("setpriv") is None:
        pytest.skip("running as root and setpriv (util-linux) is missing")
    caps = "-dac_override,-dac_read_search"
    return ["setpriv", f"--bounding-set={caps}", f"--inh-caps={caps}", "--"]


class DaemonProcess:
    """`python -m efd serve` in a real process, for kill -9 and SIGTERM tests."""

    def __init__(
        self,
        config_path: Path,
        port: int,
        log_path: Path,
        *,
        own_group: bool = False,
        env: dict[str, str] | None = None,
        prefix: list[str] | None = None,
        preexec_fn: Callable[[], None] | None = None,
    ) -> None:
        self.config_path = config_path
        self.port = port
        self.log_path = log_path
        self.own_group = own_group  # its own process group, to signal it like systemd does
        self.env = env  # added to this process's environment
        self.prefix = prefix or []  # a command the daemon runs under (file_permissions_apply)
        self.preexec_fn = preexec_fn  # run in the child before efd starts (resource limits)
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self, timeout: float = 60.0) -> DaemonProcess:
        with self.log_path.open("ab") as log:
            self.proc = subprocess.Popen(
                [
                    *self.prefix,
                    *(sys.executable, "-m", "efd", "serve", "--config", str(self.config_path)),
                ],
                stdout=log,
                stderr=subprocess.STDOUT,
                cwd=ROOT,
                start_new_session=self.own_group,
                env={**os.environ, **self.env} if self.env else None,
                preexec_fn=self.preexec_fn,
            )
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise AssertionError(f"daemon exited early:\n{self.log()}")
            try:
                with socket.create_connection(("127.0.0.1", self.port), timeout=0.2):
                    return self
            except OSError:
                time.sleep(0.05)
        self.proc.kill()  # never left running behind a failed start
        self.proc.wait(10)
        raise AssertionError(f"daemon did not start:\n{self.log()}")

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")

    def kill(self) -> None:
        assert self.proc is not None
        self.proc.kill()
        self.proc.wait(10)

    def terminate(self, timeout: float = 30.0) -> int:
        assert self.proc is not None
        self.proc.terminate()
        return self.proc.wait(timeout)

    def signal_group(self, sig: int) -> None:
        """Signal the daemon and its sender processes at once (needs own_group)."""
        assert self.proc is not None
        assert self.own_group
        os.killpg(self.proc.pid, sig)

    def ensure_stopped(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            if self.own_group:
                os.killpg(self.proc.pid, signal.SIGKILL)
            else:
                self.proc.kill()
            self.proc.wait(10)


def write_toml(path: Path, settings: dict[str, Any]) -> Path:
    """Render the settings dict as TOML (enough of TOML for our configs)."""

    def value(v: Any) -> str:
        if isinstance(v, bool):
            return "true" if v else "false"
        if isinstance(v, int | float):
            return repr(v)
        if isinstance(v, str):
            return json.dumps(v)
        if isinstance(v, list):
            return "[" + ", ".join(value(x) for x in v) + "]"
        if isinstance(v, dict):
            return "{ " + ", ".join(f"{json.dumps(k)} = {value(x)}" for k, x in v.items()) + " }"
        raise TypeError(v)

    lines: list[str] = []
    for section in ("server", "storage", "delivery", "logging"):
        if section in settings:
            lines.append(f"[{section}]")
            lines += [f"{k} = {value(v)}" for k, v in settings[section].items()]
    for source in settings.get("sources", []):
        lines.append("[[sources]]")
        lines += [f"{k} = {value(v)}" for k, v in source.items()]
    for destination in settings.get("destinations", []):
        lines.append("[[destinations]]")
        lines += [f"{k} = {value(v)}" for k, v in destination.items() if k != "hooks"]
        for hook in destination.get("hooks", []):
            lines.append("[[destinations.hooks]]")
            lines += [f"{k} = {value(v)}" for k, v in hook.items()]
    path.write_text("\n".join(lines) + "\n")
    return path


async def metrics_text(port: int, token: str | None = None) -> str:
    """A daemon's GET /metrics (with the admin token, where the daemon has one)."""
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    async with (
        aiohttp.ClientSession() as session,
        session.get(f"http://127.0.0.1:{port}/metrics", headers=headers) as response,
    ):
        assert response.status == 200
        return await response.text()


def metric(text: str, name: str, **labels: str) -> float | None:
    """The value of one sample in Prometheus exposition text, or None when absent."""
    from prometheus_client.parser import text_string_to_metric_families

    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name == name and sample.labels == labels:
                return float(sample.value)
    return None


# -- CPU per test ------------------------------------------------------------------------------
# EFD_TEST_CPU_LOG=path appends "seconds<TAB>test id" per test: the CPU the test's worker and
# the child processes it waited for (daemons, the CLI, go, node) spent on it. Wall-clock
# durations say little on a loaded 2-core machine; CPU says what a test costs the suite.

_CPU_LOG = os.environ.get("EFD_TEST_CPU_LOG")


def _cpu_seconds() -> float:
    import resource

    own, children = (
        resource.getrusage(resource.RUSAGE_SELF),
        resource.getrusage(resource.RUSAGE_CHILDREN),
    )
    return own.ru_utime + own.ru_stime + children.ru_utime + children.ru_stime


@pytest.hookimpl(wrapper=True)
def pytest_runtest_protocol(item: pytest.Item, nextitem: pytest.Item | None) -> Any:
    if _CPU_LOG is None:
        return (yield)
    before = _cpu_seconds()
    try:
        return (yield)
    finally:
        with open(_CPU_LOG, "a", encoding="utf-8") as log:
            log.write(f"{_cpu_seconds() - before:.2f}\t{item.nodeid}\n")


# -- order ---------------------------------------------------------------------------------
# The whole-process tests (daemons killed and restarted, soaks, a booted systemd, generated
# API calls) take seconds to a minute each. Spread evenly over the first part of the run, they
# overlap with the thousands of short tests, which fill the end; left where they fall
# alphabetically, several run at once and the suite ends waiting for the last of them.
# Tests marked `slow` count too. Files are moved whole where a module-scoped fixture (one
# daemon for the file) would otherwise be set up again for each piece.
_LONG = (
    "tests/acceptance/",  # every whole-process run
    "tests/integration/test_audiences_cli.py",
    "tests/integration/test_cli.py",
    "tests/integration/test_go_client.py",
    "tests/integration/test_regulations.py",
    "tests/integration/test_workers.py",
)
_LONG_FILES = ("tests/integration/test_openapi.py",)
_FIRST = "tests/acceptance/test_systemd_install.py"  # the longest: it starts the run
_LONG_SPAN = 0.7  # the share of the run over which they are spread


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    files: dict[str, list[pytest.Item]] = {}
    for item in items:
        files.setdefault(item.nodeid.split("::")[0], []).append(item)
    long: list[list[pytest.Item]] = []
    short: list[list[pytest.Item]] = []
    for path, tests in files.items():
        if path in _LONG_FILES:
            long.append(tests)
            continue
        rest: list[pytest.Item] = []
        for test in tests:
            if path.startswith(_LONG) or test.get_closest_marker("slow") is not None:
                long.append([test])
            else:
                rest.append(test)
        if rest:
            short.append(rest)
    if not long or not short:
        return
    long.sort(key=lambda unit: not unit[0].nodeid.startswith(_FIRST))
    step = _LONG_SPAN * len(items) / len(long)
    ordered: list[pytest.Item] = []
    for i, unit in enumerate(long):
        while short and len(ordered) < i * step:
            ordered.extend(short.pop(0))
        ordered.extend(unit)
    for tests in short:
        ordered.extend(tests)
    items[:] = ordered
