"""Wiring: one process holds the ingestion API, the dispatcher and housekeeping.

Each component starts in turn and registers its own stop on one exit stack, so `stop`
undoes exactly what `start` did, in reverse order: stop accepting, finish what was
accepted, give deliveries a bounded grace, close the store.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import os
import resource
import signal
import socket
import threading
import time
import uuid
from collections.abc import Callable
from contextlib import AsyncExitStack
from dataclasses import dataclass
from typing import Any

from aiohttp import web

from efd import config
from efd.batching import GroupCommit
from efd.config import Settings
from efd.delivery.dispatcher import Dispatcher, Rounds
from efd.delivery.sender import SenderOptions, SenderPool
from efd.errors import StoreError
from efd.http import cors
from efd.http.admin import AdminApi
from efd.http.ingest import Ingest
from efd.http.live import LiveApi
from efd.http.regulations import MAX_BODY_BYTES, RegulationsApi
from efd.http.server import Limits, Listener, name_the_server, quiet_parse_errors
from efd.http.status import Status
from efd.observe.metrics import Metrics
from efd.observe.stream import Hub
from efd.observe.systemd import Notifier
from efd.personas.capture import Capture
from efd.personas.sync import Computation, SyncResult
from efd.processes.parsers import ParserPool
from efd.rows import InsertStatus, NewMessage
from efd.rules.lanes import Lanes, Ordering
from efd.rules.payload import MAX_RAW_REQUEST_BYTES
from efd.rules.selection import iso, unconfigured
from efd.services.periodic import Periodic, computations
from efd.services.regulations import RegulationRunner
from efd.store import Store
from efd.store import migrate as migrations
from efd.store.computations import ComputationsStore
from efd.store.engine import DatabaseInUse, SqliteLock, normalise_url, safe_url, sqlite_path
from efd.store.health import HealthStore
from efd.store.operations import OperationsStore
from efd.store.profiles import ProfilesStore
from efd.store.regulations import Regulations, RegulationsStore
from efd.store.runner import AsyncDeliveries, AsyncStore
from efd.store.suppressions import Suppressions

log = logging.getLogger(__name__)

_SHUTDOWN_MARGIN = 2.0
# Open files besides those the settings account for: standard streams, the listening
# socket, the event loop's own, log files, the SQLite lock, DNS lookups, imports.
_BASE_FILES = 64


class StartupError(Exception):
    """efd cannot start; the message says why and what to do."""


class Daemon:
    def __init__(self, settings: Settings) -> None:
        self.settings = settings
        self.metrics = Metrics()
        self.hub = Hub()  # GET /admin/stream's subscribers
        self.owner = f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:8]}"
        self.port: int | None = None
        self.listener: Listener | None = None  # once serving
        self.max_connections = settings.server.max_connections  # as the open-file limit allows
        self.computations: list[Computation] = computations(settings)
        self.senders: SenderPool | None = None  # when delivery.sender_processes > 0
        self.parsers: ParserPool | None = None  # when server.parse_processes > 0
        self._db: AsyncStore | None = None
        self._periodic: Periodic | None = None
        self._reloadable: _Reloadable | None = None  # set by start
        self._reloading = asyncio.Lock()
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
        # Before the children start: they inherit a raised limit.
        self.max_connections = fit_open_files(settings)
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
                sources=_parser_sources(settings),
                log_level=settings.logging.level,
                log_format=settings.logging.format,
            )
            parsers_ready = asyncio.ensure_future(self.parsers.start())
            stack.push_async_callback(_stop_children, self.parsers, parsers_ready, 5.0)

        store = await self._open_store(stack)
        db = self._db = AsyncStore(store)
        stack.push_async_callback(asyncio.to_thread, db.close)
        suppressions = await db.read(Suppressions, store)
        store.ingestion.suppressions = suppressions
        profiles = ProfilesStore(store)
        capture = Capture(profiles)
        if self.computations:  # profiles are kept only when something computes on them
            store.ingestion.capture = capture
        regulations_store = RegulationsStore(store, suppressions)
        if store.single_process:
            await self._resume(db, regulations_store)
        await self._apply_lanes(settings)

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
            hub=self.hub,
        )
        if store.listener.available:
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

        parts = self._reloadable = _Reloadable(
            ingest=Ingest(
                settings,
                writer=writer,
                metrics=self.metrics,
                on_stored=dispatcher.notify,
                parsers=self.parsers,
            ),
            dispatcher=dispatcher,
            regulations_api=RegulationsApi(
                settings, db=db, regulations=regulations_store, on_created=runner.notify
            ),
            regulation_runner=runner,
            admin_api=AdminApi(
                settings, db=db, operations=OperationsStore(store), on_due=dispatcher.notify
            ),
            live_api=LiveApi(settings, db=db, hub=self.hub, circuits=dispatcher.circuits),
            status=Status(settings, db=db, metrics=self.metrics, owner=self.owner),
            periodic=self._periodic,
            capture=capture,
        )
        await self._serve(
            stack,
            parts.ingest,
            parts.status.routes()
            + parts.regulations_api.routes()
            + parts.admin_api.routes()
            + parts.live_api.routes(),
        )
        stack.callback(self.hub.close)  # first at shutdown: open streams end, not linger
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
            log.info("regulations and admin API off: no [server] admin_token")
        await self.warn_unconfigured()

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
        store = Store(
            storage.url,
            synchronous=storage.sqlite_synchronous,
            pool_size=storage.pool_size,
        )
        if await asyncio.to_thread(HealthStore(store).autovacuum_off):
            log.warning(
                "PostgreSQL runs with autovacuum off: efd's tables get no planner statistics "
                "and keep their dead rows, so queries slow down as they grow; turn autovacuum "
                "on, or run VACUUM ANALYZE on the database regularly"
            )
        return store

    @staticmethod
    async def _resume(db: AsyncStore, regulations: Regulations) -> None:
        """SQLite: this is the only process, so what the last one held is due now."""
        # Before the first request, so that it does not wait for this (and it is logged).
        await db.write(db.store.ingestion.index_recent_messages, time.time())
        released = await db.write(db.store.queue.release_all_leases, time.time())
        if released:
            log.info("resuming %d deliveries that were in flight at the last stop", released)
        resumed = await db.write(regulations.release_regulation_leases)
        if resumed:
            log.info("resuming %d regulations that were running at the last stop", resumed)

    async def _serve(
        self, stack: AsyncExitStack, ingest: Ingest, routes: list[web.RouteDef]
    ) -> None:
        server = self.settings.server
        per_address = server.max_connections_per_address or -(-self.max_connections // 2)
        limits = Limits(
            max_connections=self.max_connections,
            request_timeout=server.request_timeout_seconds,
            keepalive_timeout=server.keepalive_timeout_seconds,
            max_body_bytes=max(MAX_RAW_REQUEST_BYTES, MAX_BODY_BYTES),
            max_per_address=min(per_address, self.max_connections),
        )
        listener = self.listener = Listener(limits, self.metrics)
        app = web.Application(client_max_size=limits.max_body_bytes)
        app.on_response_prepare.append(listener.response_prepared)
        ingest_routes = ingest.routes()
        app.add_routes(listener.guard_routes(ingest_routes))
        cors.install(app, [route.path for route in ingest_routes])  # web pages send too
        app.add_routes(listener.guard_routes(routes))
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
        name_the_server()
        self.port = await listener.start(runner, server.host, server.port)
        stack.push_async_callback(listener.close)  # first of all: stop accepting

    async def _store_messages(self, take: Callable[[], list[NewMessage]]) -> list[InsertStatus]:
        store = self.db.store

        taken: list[NewMessage] = []

        def write() -> list[InsertStatus]:
            rows = take()  # in the writer thread: everything that arrived until now
            taken.extend(rows)
            return store.ingestion.insert_messages(rows, time.time()) if rows else []

        statuses = await self.db.write_later(write)
        if self.hub.active:  # committed: the live stream may show them
            for row, status in zip(taken, statuses, strict=True):
                if status is InsertStatus.STORED:
                    self.hub.publish("message", functools.partial(_message_event, row))
        return statuses

    # -- reload ------------------------------------------------------------------------------

    async def reload(self, settings: Settings) -> list[str]:
        """Apply a new configuration without dropping a request or a delivery in flight:
        sources, destinations (hooks, headers, secrets), audiences and computed traits,
        the admin token, the user agent and the log level take effect for new requests and
        rounds. Returns the changed keys that need a restart (they are not applied)."""
        async with self._reloading:
            parts = self._reloadable
            assert parts is not None, "Daemon.start() did not finish"
            not_applied = restart_needed(self.settings, settings)
            level = settings.logging.level
            logging.getLogger().setLevel(level)
            # Children and the dispatcher know a new destination before ingestion routes a
            # message to it.
            if self.senders is not None:
                delivery = settings.delivery
                routes = [d.route(delivery.user_agent) for d in settings.destinations]
                await self.senders.reload(routes, level)
            await parts.dispatcher.reload(settings)
            if self.parsers is not None:
                await self.parsers.reload(_parser_sources(settings), level)
            parts.ingest.reload(settings)
            parts.regulations_api.reload(settings)
            parts.admin_api.reload(settings)
            parts.live_api.reload(settings)
            parts.regulation_runner.reload(settings)
            parts.status.reload(settings)
            await self._apply_lanes(settings)
            found = computations(settings)
            self.db.store.ingestion.capture = parts.capture if found else None
            parts.periodic.reload(settings, found)
            self.computations = found
            # What was not applied stays as it runs, so a later reload reports it again.
            unchanged = {name: getattr(self.settings, name) for name in _RESTART_SECTIONS}
            self.settings = settings.model_copy(update=unchanged) if not_applied else settings
            return not_applied

    async def _apply_lanes(self, settings: Settings) -> None:
        """Ingestion puts the deliveries of ordered destinations in lanes from now on; the
        lanes of a destination whose ordering was turned off are dropped, their waiting
        deliveries due now (every process of a cluster should run the same configuration)."""
        ordered = [d.name for d in settings.destinations if d.ordering is Ordering.PER_USER]
        self.db.store.ingestion.lanes = Lanes(ordered) if ordered else None
        self.db.store.queue.ordered = bool(ordered)
        try:
            released = await self.db.write(self.db.store.lanes.dissolve, ordered, time.time())
        except StoreError as error:
            log.warning("could not drop the lanes of unordered destinations: %s", error)
            return
        if released:
            log.info("%d deliveries left lanes whose destination is no longer ordered", released)

    async def warn_unconfigured(self) -> None:
        """Warn of each destination that is not configured but has pending deliveries:
        nothing sends them until it is configured again or an operator discards them."""
        try:
            backlog = await self.db.read(self.db.store.queue.backlog)
        except StoreError as error:
            log.warning(
                "could not count pending deliveries per destination: %s",
                str(error).splitlines()[0][:200],
            )
            return
        configured = {d.name for d in self.settings.destinations}
        for name, count in unconfigured(backlog, configured).items():
            log.warning(
                "destination %r is not configured but has %d pending deliveries, which are "
                "never sent: configure it again, or discard them (efd discard --destination "
                "NAME, or POST /admin/discard)",
                name,
                count,
            )

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


# Sections of which a reload applies only the keys below; a change to any other key of them
# needs a restart (the listening socket, the store, the child processes, the limits).
_RESTART_SECTIONS = ("server", "storage", "delivery", "logging")
_RELOADED_KEYS = {"server.admin_token", "delivery.user_agent", "logging.level"}


def restart_needed(running: Settings, new: Settings) -> list[str]:
    """The keys whose change a reload does not apply."""
    changed = []
    for section in _RESTART_SECTIONS:
        before, after = getattr(running, section), getattr(new, section)
        for key in type(before).model_fields:
            name = f"{section}.{key}"
            if name not in _RELOADED_KEYS and getattr(before, key) != getattr(after, key):
                changed.append(name)
    return changed


def reserved_files(settings: Settings) -> int:
    """Open files efd keeps for other things than its HTTP connections: the database's,
    outbound requests when the daemon sends them itself, pipes to child processes, and a
    margin for the rest. Counted from the configuration at start."""
    storage, delivery = settings.storage, settings.delivery
    if sqlite_path(normalise_url(storage.url)) is not None:
        database = 3 * 3  # a writer and two readers, each with the file, its WAL, its index
    else:
        database = 2 * storage.pool_size + 2  # the pool and its overflow, LISTEN, a spare
    children = 4 * (delivery.sender_processes + settings.server.parse_processes)
    outbound = 0
    if not delivery.sender_processes:  # the daemon sends itself: its sockets are ours
        urls = {hook.url for d in settings.destinations for hook in d.hooks}
        widest = max((len(d.hooks) for d in settings.destinations), default=0)
        outbound = min(delivery.max_in_flight * widest, len(urls) * delivery.max_per_hook)
    return _BASE_FILES + database + children + outbound


def fit_open_files(settings: Settings) -> int:
    """The connections efd may hold at once: max_connections, after raising the open-file
    limit (RLIMIT_NOFILE) towards its hard limit if it cannot hold them with what else efd
    keeps open; fewer, said in one line, when even the hard limit cannot. Otherwise a
    connection beyond the limit would fail to be accepted: the client would hang, unanswered
    and unlogged, instead of getting the 503 of a full server."""
    wanted = settings.server.max_connections
    reserve = reserved_files(settings)
    needed = wanted + reserve
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft == resource.RLIM_INFINITY or soft >= needed:
        return wanted
    target = needed if hard == resource.RLIM_INFINITY or hard >= needed else hard
    raised = soft
    if target > soft:
        with contextlib.suppress(ValueError, OSError):
            resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
            raised = target
    if raised >= needed:
        log.info(
            "raised the open-file limit from %d to %d: %d connections (max_connections) and "
            "%d other open files",
            soft,
            raised,
            wanted,
            reserve,
        )
        return wanted
    room = raised - reserve
    if room < 1:
        raise StartupError(
            f"the open-file limit ({raised}, hard limit {hard}) leaves no room for connections: "
            f"efd keeps {reserve} open files for the database, outbound requests and child "
            f"processes; raise LimitNOFILE= (ulimit -n) to at least {needed}"
        )
    log.warning(
        "max_connections lowered from %d to %d: the open-file limit is %d (hard limit %d) and "
        "efd keeps %d open files for the database, outbound requests and child processes; "
        "raise LimitNOFILE= (ulimit -n) to at least %d to serve %d",
        wanted,
        room,
        raised,
        hard,
        reserve,
        needed,
        wanted,
    )
    return room


def _message_event(row: NewMessage) -> dict[str, Any]:
    """A stored message as GET /admin/stream shows it."""
    return {
        "source": row.source,
        "messageId": row.message_id,
        "type": row.type,
        "userId": row.user_id,
        "event": row.event,
        "receivedAt": iso(row.received_at),
    }


def _parser_sources(settings: Settings) -> list[tuple[str, str, tuple[str, ...]]]:
    return [
        (s.write_key.get_secret_value(), s.name, tuple(s.destinations)) for s in settings.sources
    ]


@dataclass(frozen=True, slots=True)
class _Reloadable:
    """The parts a reload reconfigures."""

    ingest: Ingest
    dispatcher: Dispatcher
    regulations_api: RegulationsApi
    regulation_runner: RegulationRunner
    admin_api: AdminApi
    live_api: LiveApi
    status: Status
    periodic: Periodic
    capture: Capture


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
        target=store.listener.listen, args=(wake, stop.is_set), name="efd-listen", daemon=True
    )
    thread.start()

    async def join() -> None:
        stop.set()
        await asyncio.to_thread(thread.join)

    stack.push_async_callback(join)


async def run(settings: Settings, *, config_path: str | None = None, ready: Any = None) -> None:
    """Serve until SIGTERM or SIGINT; SIGHUP re-reads `config_path`. Tells systemd (when it
    runs efd with Type=notify) READY=1 once serving, what it is doing, STOPPING=1, and
    pings its watchdog from the event loop."""
    daemon = Daemon(settings)
    notifier = Notifier()
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    background: list[asyncio.Task[None]] = []
    serving = False
    reloads: set[asyncio.Task[None]] = set()  # held, so that none is collected mid-way

    def on_sighup() -> None:
        if not serving:  # a READY=1 from a reload would tell systemd it is up before it is
            log.warning("SIGHUP before efd is serving: ignored")
            return
        assert config_path is not None
        task = asyncio.create_task(_reload(daemon, config_path, notifier))
        reloads.add(task)
        task.add_done_callback(reloads.discard)

    if config_path is not None:
        loop.add_signal_handler(signal.SIGHUP, on_sighup)
    try:
        await daemon.start()
        serving = True
        notifier.notify(ready="1", status="serving")
        background.append(asyncio.create_task(notifier.watchdog(lambda: True)))
        background.append(asyncio.create_task(_report_status(daemon, notifier)))
        if ready is not None:
            ready(daemon)
        await stop.wait()
    finally:
        serving = False
        notifier.notify(stopping="1", status="stopping: finishing what is in flight")
        for task in background:
            task.cancel()
        await daemon.stop()
        notifier.close()


async def _reload(daemon: Daemon, config_path: str, notifier: Notifier) -> None:
    """SIGHUP: re-read the file and apply it. Whatever happens, systemd hears READY=1 after
    RELOADING=1, or it would hold the unit in "reloading" until its timeout."""
    notifier.notify(reloading="1", status="reloading the configuration")
    try:
        await _apply(daemon, config_path)
    finally:
        notifier.notify(ready="1", status="serving")


async def _apply(daemon: Daemon, config_path: str) -> None:
    refused = "reload refused, the running configuration stays: %s"
    try:
        settings = config.load(config_path)
    except config.ConfigFileError as error:
        log.error(refused, error)  # the file and why: nothing of its content
        return
    except config.ConfigError as error:
        log.error(
            refused + " has %d problems: %s",
            config_path,
            len(error.problems),
            "; ".join(error.problems),
        )
        return
    except Exception as error:
        # Its type only: an exception's text may carry the file (a decode error's does).
        log.error(refused + " could not be loaded (%s)", config_path, type(error).__name__)
        return
    try:
        not_applied = await daemon.reload(settings)
    except Exception:
        log.exception("reload failed part-way; restart efd to be sure of its configuration")
        return
    log.info(
        "reloaded %s: %d sources, %d destinations, %d audiences and computed traits",
        config_path,
        len(settings.sources),
        len(settings.destinations),
        len(daemon.computations),
    )
    if not_applied:
        log.warning("changed but not applied until a restart: %s", ", ".join(not_applied))
    await daemon.warn_unconfigured()


async def _report_status(daemon: Daemon, notifier: Notifier, every: float = 10.0) -> None:
    """STATUS= for `systemctl status`: the backlog and the delivery rate."""
    if not notifier.enabled:
        return
    delivered = sum(daemon.metrics.delivered.values())
    while True:
        await asyncio.sleep(every)
        now = sum(daemon.metrics.delivered.values())
        rate, delivered = (now - delivered) / every, now
        try:
            backlog = sum((await daemon.db.read(daemon.db.store.queue.backlog)).values())
        except StoreError:
            notifier.notify(status=f"store unreachable; {rate:.0f} deliveries/s")
            continue
        notifier.notify(status=f"{backlog} deliveries pending, {rate:.0f} delivered/s")
