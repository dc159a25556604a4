"""Wiring: one process holds the ingestion API, the dispatcher and housekeeping.

Each component starts in turn and registers its own stop on one exit stack, so `stop`
undoes exactly what `start` did, in reverse order: stop accepting, finish what was
accepted, give deliveries a bounded grace, close the store.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import signal
import socket
import threading
import time
import uuid
from collections.abc import Callable
from contextlib import AsyncExitStack
from typing import Any

from aiohttp import web

from efd import cors
from efd.batching import GroupCommit
from efd.config import Settings
from efd.dispatcher import Dispatcher, Rounds
from efd.ingest import Ingest
from efd.metrics import Metrics
from efd.parse import MAX_RAW_REQUEST_BYTES
from efd.parsers import ParserPool
from efd.periodic import Periodic, computations
from efd.personas.capture import Capture
from efd.personas.sync import Computation, SyncResult
from efd.regulations import MAX_BODY_BYTES, RegulationRunner, RegulationsApi
from efd.rows import InsertStatus, NewMessage
from efd.sender import SenderOptions, SenderPool
from efd.server import Limits, Listener, quiet_parse_errors
from efd.status import Status
from efd.store import Store
from efd.store import migrate as migrations
from efd.store.computations import ComputationsStore
from efd.store.engine import DatabaseInUse, SqliteLock, normalise_url, safe_url, sqlite_path
from efd.store.profiles import ProfilesStore
from efd.store.regulations import RegulationsStore, Suppressions
from efd.store.runner import AsyncDeliveries, AsyncStore

log = logging.getLogger(__name__)

_SHUTDOWN_MARGIN = 2.0


class StartupError(Exception):
    """efd cannot start; the message says why and what to do."""


class Daemon:
    def __init__(self, settings: Settings) -> None:
        self.settings = settings
        self.metrics = Metrics()
        self.owner = f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:8]}"
        self.port: int | None = None
        self.computations: list[Computation] = computations(settings)
        self.senders: SenderPool | None = None  # when delivery.sender_processes > 0
        self.parsers: ParserPool | None = None  # when server.parse_processes > 0
        self._db: AsyncStore | None = None
        self._periodic: Periodic | None = None
        self._stack = AsyncExitStack()
        self._stopped = False

    @property
    def db(self) -> AsyncStore:
        assert self._db is not None
        return self._db

    async def start(self) -> None:
        try:
            await self._start(self._stack)
        except BaseException:
            await self.stop()
            raise

    async def stop(self) -> None:
        """Stop accepting, finish what was accepted, give deliveries a bounded grace."""
        if self._stopped:
            return
        self._stopped = True
        log.info("shutting down")
        await self._stack.aclose()
        log.info("stopped")

    async def _start(self, stack: AsyncExitStack) -> None:
        settings, delivery = self.settings, self.settings.delivery
        grace = delivery.timeout_seconds + _SHUTDOWN_MARGIN
        # Children first: they load while the database is opened and migrated. Each pool's
        # stop is registered where its place in the shutdown order is.
        senders_ready = parsers_ready = None
        if delivery.sender_processes:
            self.senders = SenderPool(
                processes=delivery.sender_processes,
                options=self._sender_options(),
                routes=[d.route(delivery.user_agent) for d in settings.destinations],
                log_level=settings.logging.level,
                log_format=settings.logging.format,
            )
            senders_ready = asyncio.ensure_future(self.senders.start())
            stack.push_async_callback(_stop_children, self.senders, senders_ready, grace)
        if settings.server.parse_processes:
            self.parsers = ParserPool(
                processes=settings.server.parse_processes,
                sources=[
                    (s.write_key.get_secret_value(), s.name, tuple(s.destinations))
                    for s in settings.sources
                ],
                log_level=settings.logging.level,
                log_format=settings.logging.format,
            )
            parsers_ready = asyncio.ensure_future(self.parsers.start())
            stack.push_async_callback(_stop_children, self.parsers, parsers_ready, 5.0)

        store = await self._open_store(stack)
        db = self._db = AsyncStore(store)
        stack.push_async_callback(asyncio.to_thread, db.close)
        suppressions = await db.read(Suppressions, store)
        store.suppressions = suppressions
        profiles = ProfilesStore(store)
        if self.computations:  # profiles are kept only when something computes on them
            store.capture = Capture(profiles)
        regulations_store = RegulationsStore(store, suppressions)
        if store.sqlite:
            await self._resume(db, regulations_store)

        rounds: Rounds
        if self.senders is not None:
            await _ready(senders_ready)
            rounds = self.senders
        else:
            sender = self._sender_options().sender()
            await sender.start()
            stack.push_async_callback(sender.close)
            rounds = sender
        dispatcher = Dispatcher(
            deliveries=AsyncDeliveries(db),
            rounds=rounds,
            settings=settings,
            metrics=self.metrics,
            owner=self.owner,
        )
        if not store.sqlite:
            _listen_for_work(stack, store, dispatcher.notify)
        dispatcher.start()
        stack.push_async_callback(dispatcher.stop, grace)

        runner = RegulationRunner(
            db=db,
            regulations=regulations_store,
            settings=settings,
            metrics=self.metrics,
            owner=self.owner,
            on_notified=dispatcher.notify,
        )
        runner.start()
        stack.push_async_callback(runner.stop)

        self._periodic = Periodic(
            settings=settings,
            db=db,
            computations=self.computations,
            computations_store=ComputationsStore(store, suppressions),
            profiles=profiles,
            metrics=self.metrics,
            owner=self.owner,
            on_sent=dispatcher.notify,
        )
        self._periodic.start()
        stack.push_async_callback(self._periodic.stop)

        await _ready(parsers_ready)
        writer: GroupCommit[NewMessage, InsertStatus] = GroupCommit(
            self._store_messages, max_items=5000, name="efd-ingest-writer", depth=2
        )
        writer.start()
        stack.push_async_callback(writer.close)

        await self._serve(
            stack,
            ingest=Ingest(
                settings,
                writer=writer,
                metrics=self.metrics,
                on_stored=dispatcher.notify,
                parsers=self.parsers,
            ),
            regulations=RegulationsApi(
                settings, db=db, regulations=regulations_store, on_created=runner.notify
            ),
        )
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

    # -- pieces ---------------------------------------------------------------------------

    def _sender_options(self) -> SenderOptions:
        delivery = self.settings.delivery
        return SenderOptions(
            timeout=delivery.timeout_seconds,
            allowed_networks=tuple(delivery.allowed_networks),
            ca_file=delivery.ca_file,
            response_head_bytes=delivery.response_head_bytes,
        )

    async def _open_store(self, stack: AsyncExitStack) -> Store:
        storage = self.settings.storage
        database = sqlite_path(normalise_url(storage.url))
        if database is not None:
            lock = SqliteLock(database)
            try:
                lock.acquire()
            except DatabaseInUse as error:
                raise StartupError(str(error)) from None
            stack.callback(lock.release)
        log.info("store: %s", safe_url(storage.url))
        await asyncio.to_thread(migrations.upgrade, storage.url)
        return Store(
            storage.url,
            sqlite_synchronous=storage.sqlite_synchronous,
            pool_size=storage.pool_size,
        )

    @staticmethod
    async def _resume(db: AsyncStore, regulations: RegulationsStore) -> None:
        """SQLite: this is the only process, so what the last one held is due now."""
        # Before the first request, so that it does not wait for this (and it is logged).
        await db.write(db.store.index_recent_messages, time.time())
        released = await db.write(db.store.release_all_leases, time.time())
        if released:
            log.info("resuming %d deliveries that were in flight at the last stop", released)
        resumed = await db.write(regulations.release_regulation_leases)
        if resumed:
            log.info("resuming %d regulations that were running at the last stop", resumed)

    async def _serve(
        self, stack: AsyncExitStack, *, ingest: Ingest, regulations: RegulationsApi
    ) -> None:
        server = self.settings.server
        limits = Limits(
            max_connections=server.max_connections,
            request_timeout=server.request_timeout_seconds,
            keepalive_timeout=server.keepalive_timeout_seconds,
            max_body_bytes=max(MAX_RAW_REQUEST_BYTES, MAX_BODY_BYTES),
        )
        listener = Listener(limits, self.metrics)
        app = web.Application(client_max_size=limits.max_body_bytes)
        app.on_response_prepare.append(listener.response_prepared)
        ingest_routes = ingest.routes()
        app.add_routes(listener.guard_routes(ingest_routes))
        cors.install(app, [route.path for route in ingest_routes])  # web pages send too
        status = Status(self.settings, db=self.db, metrics=self.metrics)
        app.add_routes(listener.guard_routes(status.routes() + regulations.routes()))
        # efd inflates gzip bodies itself, with a bound: aiohttp would inflate without one.
        runner = web.AppRunner(
            app,
            access_log=None,
            shutdown_timeout=10,
            auto_decompress=False,
            keepalive_timeout=limits.keepalive_timeout,
            # After answering before the whole body arrived (a refusal, a 408), read and drop
            # the rest this long so the client sees the answer, then close (aiohttp: 10 s).
            lingering_time=2.0,
        )
        await runner.setup()
        stack.push_async_callback(runner.cleanup)  # lets running requests finish
        quiet_parse_errors()
        self.port = await listener.start(runner, server.host, server.port)
        stack.push_async_callback(listener.close)  # first of all: stop accepting

    async def _store_messages(self, take: Callable[[], list[NewMessage]]) -> list[InsertStatus]:
        store = self.db.store

        def write() -> list[InsertStatus]:
            rows = take()  # in the writer thread: everything that arrived until now
            return store.insert_messages(rows, time.time()) if rows else []

        return await self.db.write_later(write)

    # -- audiences and computed traits (the CLI and tests run syncs on demand) ----------------

    def computation(self, name: str) -> Computation:
        assert self._periodic is not None
        return self._periodic.computation(name)

    async def sync(self, computation: Computation, now: float | None = None) -> SyncResult:
        assert self._periodic is not None
        return await self._periodic.sync(computation, now)

    async def retention(self) -> None:
        assert self._periodic is not None
        await self._periodic.retention()


async def _ready(starting: asyncio.Future[None] | None) -> None:
    """Wait for child processes started early in Daemon.start."""
    if starting is None:
        return
    try:
        await starting
    except RuntimeError as error:
        raise StartupError(str(error)) from None


async def _stop_children(
    pool: SenderPool | ParserPool, starting: asyncio.Future[None] | None, timeout: float
) -> None:
    if starting is not None:
        starting.cancel()  # if start-up failed before they were ready
        with contextlib.suppress(BaseException):
            await starting
    await pool.close(timeout)


def _listen_for_work(stack: AsyncExitStack, store: Store, notify: Callable[[], None]) -> None:
    """PostgreSQL: LISTEN for other processes' new work, so their messages wake our
    dispatcher too."""
    loop = asyncio.get_running_loop()
    stop = threading.Event()

    def wake() -> None:
        loop.call_soon_threadsafe(notify)

    thread = threading.Thread(
        target=store.listen, args=(wake, stop.is_set), name="efd-listen", daemon=True
    )
    thread.start()

    async def join() -> None:
        stop.set()
        await asyncio.to_thread(thread.join)

    stack.push_async_callback(join)


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
