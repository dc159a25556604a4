"""Wiring: one process holds the ingestion API, the dispatcher and housekeeping."""

from __future__ import annotations

import asyncio
import contextlib
import fcntl
import hmac
import logging
import math
import os
import signal
import socket
import threading
import time
import uuid
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import IO, Any

from aiohttp import web
from apscheduler.schedulers.asyncio import AsyncIOScheduler
from sqlalchemy.exc import SQLAlchemyError

from efd import cors
from efd.batching import GroupCommit
from efd.config import Settings
from efd.dispatcher import Dispatcher, Rounds
from efd.ingest import MAX_RAW_REQUEST_BYTES, Ingest
from efd.metrics import Metrics
from efd.personas.sync import (
    Computation,
    SyncResult,
    computations,
    longest_lookback,
    run_sync_async,
)
from efd.regulations import RegulationRunner, RegulationsApi
from efd.sender import Route, Sender
from efd.server import Limits, Listener, json_response, quiet_parse_errors
from efd.store import NewMessage, Store
from efd.store import migrate as migrations
from efd.store.engine import normalise_url, safe_url, sqlite_path
from efd.store.personas import PersonasStore
from efd.store.runner import AsyncStore
from efd.workers import ParserPool, SenderOptions, SenderPool

log = logging.getLogger(__name__)

_RETENTION_BATCH = 1000
_RETENTION_EVERY = 600.0  # seconds
_SHUTDOWN_MARGIN = 2.0
_FIRST_SYNC_DELAY = 1.0  # seconds after start-up
_EVENT_MARGIN = 3600.0  # events are kept this much longer than the longest lookback


class StartupError(Exception):
    """efd cannot start; the message says why and what to do."""


class _SqliteLock:
    """One efd process per SQLite file: leases there are released at start-up, which is
    only safe when no other process can be delivering from the same file."""

    def __init__(self, database: Path) -> None:
        self.path = database.with_name(database.name + ".lock")
        self._handle: IO[str] | None = None

    def acquire(self) -> None:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        handle = self.path.open("a+")
        try:
            fcntl.flock(handle.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            handle.close()
            raise StartupError(
                f"another efd process is using {self.path.with_suffix('')}; "
                "SQLite serves one process (use PostgreSQL to run several)"
            ) from None
        self._handle = handle

    def release(self) -> None:
        if self._handle is not None:
            fcntl.flock(self._handle.fileno(), fcntl.LOCK_UN)
            self._handle.close()
            self._handle = None


class Daemon:
    def __init__(self, settings: Settings) -> None:
        self.settings = settings
        self.metrics = Metrics()
        self.owner = f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:8]}"
        self.port: int | None = None
        self._lock: _SqliteLock | None = None
        self._db: AsyncStore | None = None
        self._runner: web.AppRunner | None = None
        self._listener: Listener | None = None
        self._writer: GroupCommit[NewMessage, str] | None = None
        self._dispatcher: Dispatcher | None = None
        self.computations: list[Computation] = computations(settings)
        self._personas: PersonasStore | None = None
        self._regulations: RegulationRunner | None = None
        self._sync_locks: dict[str, asyncio.Lock] = {}
        self._sync_tasks: set[asyncio.Task[Any]] = set()
        self._sender: Sender | None = None  # sending from this process
        self._senders: SenderPool | None = None  # or from sender processes
        self._senders_ready: asyncio.Future[None] | None = None
        self._parsers: ParserPool | None = None  # large request bodies parsed there
        self._parsers_ready: asyncio.Future[None] | None = None
        self._scheduler: AsyncIOScheduler | None = None
        self._notifications: threading.Thread | None = None
        self._notifications_stop = threading.Event()
        self._stopped = False

    @property
    def senders(self) -> SenderPool | None:
        """The sender processes, when `delivery.sender_processes` > 0."""
        return self._senders

    @property
    def parsers(self) -> ParserPool | None:
        """The parser processes, when `server.parse_processes` > 0."""
        return self._parsers

    @property
    def db(self) -> AsyncStore:
        assert self._db is not None
        return self._db

    @property
    def personas(self) -> PersonasStore:
        assert self._personas is not None
        return self._personas

    def _sender_options(self) -> SenderOptions:
        delivery = self.settings.delivery
        return SenderOptions(
            timeout=delivery.timeout_seconds,
            allowed_networks=tuple(delivery.allowed_networks),
            ca_file=delivery.ca_file,
            response_head_bytes=delivery.response_head_bytes,
        )

    async def start(self) -> None:
        settings = self.settings
        delivery = settings.delivery
        if delivery.sender_processes:
            # Started first: they load while the database is opened and migrated.
            self._senders = SenderPool(
                processes=delivery.sender_processes,
                options=self._sender_options(),
                routes=[Route.of(d, delivery.user_agent) for d in settings.destinations],
                log_level=settings.logging.level,
                log_format=settings.logging.format,
            )
            self._senders_ready = asyncio.ensure_future(self._senders.start())
        if settings.server.parse_processes:
            self._parsers = ParserPool(
                processes=settings.server.parse_processes,
                sources=[
                    (s.write_key.get_secret_value(), s.name, tuple(s.destinations))
                    for s in settings.sources
                ],
                log_level=settings.logging.level,
                log_format=settings.logging.format,
            )
            self._parsers_ready = asyncio.ensure_future(self._parsers.start())
        url = settings.storage.url
        database = sqlite_path(normalise_url(url))
        if database is not None:
            self._lock = _SqliteLock(database)
            self._lock.acquire()
        log.info("store: %s", safe_url(url))
        await asyncio.to_thread(migrations.upgrade, url)
        store = Store(
            url,
            sqlite_synchronous=settings.storage.sqlite_synchronous,
            pool_size=settings.storage.pool_size,
        )
        self._db = AsyncStore(store)
        # Profiles are captured only when something computes on them.
        self._personas = await self.db.read(
            lambda: PersonasStore(store, capture=bool(self.computations))
        )
        if store.sqlite:
            # Before the first request, so that it does not wait for this (and it is logged).
            await self.db.write(store.index_recent_messages, time.time())
            released = await self.db.write(store.release_all_leases, time.time())
            if released:
                log.info("resuming %d deliveries that were in flight at the last stop", released)
            resumed = await self.db.write(self.personas.release_regulation_leases)
            if resumed:
                log.info("resuming %d regulations that were running at the last stop", resumed)

        await _children_ready(self._parsers_ready)
        rounds: Rounds
        if self._senders is not None:
            await _children_ready(self._senders_ready)
            rounds = self._senders
        else:
            self._sender = self._sender_options().sender()
            await self._sender.start()
            rounds = self._sender
        self._dispatcher = Dispatcher(
            db=self.db,
            rounds=rounds,
            settings=settings,
            metrics=self.metrics,
            owner=self.owner,
        )
        self._writer = GroupCommit(
            self._store_messages, max_items=5000, name="efd-ingest-writer", depth=2
        )
        self._writer.start()
        self._dispatcher.start()
        self._regulations = RegulationRunner(
            db=self.db,
            personas=self.personas,
            settings=settings,
            metrics=self.metrics,
            owner=self.owner,
            on_notified=self._dispatcher.notify,
        )
        self._regulations.start()
        if not store.sqlite:
            self._start_notifications(store)

        self._scheduler = AsyncIOScheduler()
        self._scheduler.add_job(
            self._retention,
            "interval",
            seconds=_RETENTION_EVERY,
            id="retention",
            misfire_grace_time=60,
        )
        first = datetime.now(UTC) + timedelta(seconds=_FIRST_SYNC_DELAY)
        for computation in self.computations:
            self._scheduler.add_job(
                self._sync_job,
                "interval",
                seconds=computation.interval,
                args=[computation],
                id=f"sync:{computation.store_key}",
                next_run_time=first,
                misfire_grace_time=max(60, math.ceil(computation.interval)),
                coalesce=True,
            )
        self._scheduler.start()

        server = settings.server
        limits = Limits(
            max_connections=server.max_connections,
            request_timeout=server.request_timeout_seconds,
            keepalive_timeout=server.keepalive_timeout_seconds,
            max_body_bytes=max(MAX_RAW_REQUEST_BYTES, 1024**2),
        )
        self._listener = Listener(limits)
        app = web.Application(client_max_size=limits.max_body_bytes)
        app.on_response_prepare.append(self._listener.response_prepared)
        ingest = Ingest(
            settings,
            writer=self._writer,
            metrics=self.metrics,
            on_stored=self._dispatcher.notify,
            parsers=self._parsers,
        )
        ingest_routes = ingest.routes()
        guard = self._listener.guard_routes
        app.add_routes(guard(ingest_routes))
        cors.install(app, [route.path for route in ingest_routes])  # web pages send too
        app.add_routes(
            guard([web.get("/healthz", self._healthz), web.get("/metrics", self._metrics)])
        )
        app.add_routes(
            guard(
                RegulationsApi(
                    settings,
                    db=self.db,
                    personas=self.personas,
                    on_created=self._regulations.notify,
                ).routes()
            )
        )
        # efd inflates gzip bodies itself, with a bound: aiohttp would inflate without one.
        self._runner = web.AppRunner(
            app,
            access_log=None,
            shutdown_timeout=10,
            auto_decompress=False,
            keepalive_timeout=limits.keepalive_timeout,
        )
        await self._runner.setup()
        quiet_parse_errors()
        self.port = await self._listener.start(self._runner, server.host, server.port)
        log.info(
            "efd listening on http://%s:%s (%d sources, %d destinations)",
            settings.server.host,
            self.port,
            len(settings.sources),
            len(settings.destinations),
        )
        if self.computations:
            log.info(
                "profiles on: %d audiences, %d computed traits",
                len(settings.audiences),
                len(settings.computed_traits),
            )
        if settings.server.admin_token is None:
            log.info("regulations API off: no [server] admin_token")

    async def stop(self) -> None:
        """Stop accepting, finish what was accepted, give deliveries a bounded grace."""
        if self._stopped:
            return
        self._stopped = True
        log.info("shutting down")
        if self._listener is not None:
            await self._listener.close()  # stop accepting
        if self._runner is not None:
            await self._runner.cleanup()  # lets running requests finish
        if self._writer is not None:
            await self._writer.close()
        await _stop_children(self._parsers, self._parsers_ready, 5.0)
        if self._scheduler is not None:
            self._scheduler.shutdown(wait=False)
        for task in list(self._sync_tasks):
            task.cancel()  # each committed chunk is consistent; the next sync carries on
        if self._sync_tasks:
            await asyncio.wait(list(self._sync_tasks))
        if self._regulations is not None:
            await self._regulations.stop()
        if self._dispatcher is not None:
            grace = self.settings.delivery.timeout_seconds + _SHUTDOWN_MARGIN
            await self._dispatcher.stop(grace)
        if self._notifications is not None:
            self._notifications_stop.set()
            await asyncio.to_thread(self._notifications.join)
        if self._sender is not None:
            await self._sender.close()
        await _stop_children(
            self._senders,
            self._senders_ready,
            self.settings.delivery.timeout_seconds + _SHUTDOWN_MARGIN,
        )
        if self._db is not None:
            await asyncio.to_thread(self._db.close)
        if self._lock is not None:
            self._lock.release()
        log.info("stopped")

    # -- pieces ---------------------------------------------------------------------------

    def _start_notifications(self, store: Store) -> None:
        """LISTEN for other processes' new work, so their messages wake our dispatcher too."""
        assert self._dispatcher is not None
        loop = asyncio.get_running_loop()
        notify = self._dispatcher.notify

        def wake() -> None:
            loop.call_soon_threadsafe(notify)

        self._notifications = threading.Thread(
            target=store.listen,
            args=(wake, self._notifications_stop.is_set),
            name="efd-listen",
            daemon=True,
        )
        self._notifications.start()

    async def _store_messages(self, take: Callable[[], list[NewMessage]]) -> list[str]:
        store = self.db.store

        def write() -> list[str]:
            rows = take()  # in the writer thread: everything that arrived until now
            return store.insert_messages(rows, time.time()) if rows else []

        return await self.db.write_later(write)

    async def _healthz(self, _request: web.Request) -> web.Response:
        try:
            async with asyncio.timeout(2):
                await self.db.read(self.db.store.ping)
        except (SQLAlchemyError, TimeoutError) as error:
            return json_response({"status": "unavailable", "store": str(error)[:200]}, 503)
        return json_response({"status": "ok"})

    async def _metrics(self, request: web.Request) -> web.Response:
        token = self.settings.server.admin_token
        if token is not None:
            expected = f"Bearer {token.get_secret_value()}".encode()
            given = request.headers.get("Authorization", "").encode("utf-8", "surrogateescape")
            if not hmac.compare_digest(given, expected):
                return json_response(
                    {"success": False, "code": "unauthorized", "message": "bearer token needed"},
                    401,
                )
        with contextlib.suppress(SQLAlchemyError, TimeoutError):
            async with asyncio.timeout(5):
                await self._refresh_backlog()
        return web.Response(text=self.metrics.render(), content_type="text/plain")

    async def _refresh_backlog(self) -> None:
        backlog = await self.db.read(self.db.store.backlog)
        self.metrics.backlog = {d.name: backlog.get(d.name, 0) for d in self.settings.destinations}

    async def _retention(self) -> None:
        store = self.db.store
        now = time.time()
        if not await self.db.write(
            store.claim_job, "retention", interval=_RETENTION_EVERY, owner=self.owner, now=now
        ):
            return  # another process of the cluster has this turn
        before = now - self.settings.storage.retention_days * 86400
        total = 0
        # Small batches, each its own transaction, so ingestion never waits long.
        while purged := await self.db.write(self.db.store.purge_finished, before, _RETENTION_BATCH):
            total += purged
            await asyncio.sleep(0.05)
        if total:
            log.info(
                "retention: purged %d messages older than %s days",
                total,
                self.settings.storage.retention_days,
            )
        # Events: kept as long as the longest lookback needs; forever when one has none.
        lookback = longest_lookback(self.computations)
        if lookback is None:
            return
        events_before = now - lookback - _EVENT_MARGIN
        total = 0
        while purged := await self.db.write(
            self.personas.purge_events, events_before, _RETENTION_BATCH
        ):
            total += purged
            await asyncio.sleep(0.05)
        if total:
            log.info("retention: purged %d events beyond the longest lookback", total)

    # -- audiences and computed traits ------------------------------------------------------

    def computation(self, name: str) -> Computation:
        for computation in self.computations:
            if name in (computation.name, computation.key, computation.store_key):
                return computation
        raise KeyError(name)

    async def sync(self, computation: Computation, now: float | None = None) -> SyncResult:
        """Run one sync of `computation` now (never two of the same at once here)."""
        lock = self._sync_locks.setdefault(computation.store_key, asyncio.Lock())
        task = asyncio.current_task()
        if task is not None:
            self._sync_tasks.add(task)
        try:
            async with lock:
                assert self._dispatcher is not None
                result = await run_sync_async(
                    self.db, self.personas, computation, now, on_sent=self._dispatcher.notify
                )
        finally:
            if task is not None:
                self._sync_tasks.discard(task)
        self.metrics.personas_sent[computation.store_key] += result.sent
        log.info(
            "sync %s: %d profiles, %d identify messages, %d rows read, %.2f s",
            computation.store_key,
            result.evaluated,
            result.sent,
            result.rows_read,
            result.seconds,
        )
        return result

    async def _sync_job(self, computation: Computation) -> None:
        """The periodic sync: once per cluster per interval."""
        try:
            if not await self.db.write(
                self.db.store.claim_job,
                f"sync:{computation.store_key}",
                interval=computation.interval,
                owner=self.owner,
                now=time.time(),
            ):
                return  # another process of the cluster has this turn
            await self.sync(computation)
        except asyncio.CancelledError:
            raise
        except Exception as error:
            log.exception("sync %s failed", computation.store_key)
            with contextlib.suppress(SQLAlchemyError):
                await self.db.write(
                    self.personas.fail_sync, computation.store_key, f"{error}"[:1000]
                )


async def _children_ready(starting: asyncio.Future[None] | None) -> None:
    """Wait for child processes started early in Daemon.start (None: there are none)."""
    if starting is None:
        return
    try:
        await starting
    except RuntimeError as error:
        raise StartupError(str(error)) from None


async def _stop_children(
    pool: SenderPool | ParserPool | None, starting: asyncio.Future[None] | None, timeout: float
) -> None:
    if starting is not None:
        starting.cancel()  # if start-up failed before they were ready
        with contextlib.suppress(BaseException):
            await starting
    if pool is not None:
        await pool.close(timeout)


async def run(settings: Settings, *, ready: Any = None) -> None:
    """Serve until SIGTERM or SIGINT."""
    daemon = Daemon(settings)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    try:
        await daemon.start()
        if ready is not None:
            ready(daemon)
        await stop.wait()
    finally:
        await daemon.stop()
