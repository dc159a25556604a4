"""The parts of the daemon, in the order they start.

Each part takes its collaborators (the parts started before it) in its constructor and, in
`start(stack)`, starts what it owns and registers its own stop on the exit stack, so that
the stack stops everything in reverse: stop accepting, finish what was accepted, give
deliveries a bounded grace, close the store, stop the child processes. Each reads the
configuration through the one holder (efd.settings), and subscribes to it if it keeps
something derived from it.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import time
from collections.abc import Callable
from contextlib import AsyncExitStack
from dataclasses import dataclass
from typing import Any, Protocol

from aiohttp import web

from efd import __version__
from efd.config import Settings
from efd.daemon.startup import Cpus, StartupError, fit_open_files
from efd.delivery.batches import Batcher
from efd.delivery.dispatcher import SHUTDOWN_MARGIN, Dispatcher
from efd.delivery.lanes import Lanes
from efd.delivery.outauth import Auth
from efd.delivery.sender import Sender, SenderOptions, SenderPool
from efd.errors import StoreError
from efd.groupcommit import GroupCommit
from efd.http import cors
from efd.http.admin import AdminApi
from efd.http.ingest import Ingest
from efd.http.live import LiveApi
from efd.http.regulations import MAX_BODY_BYTES, RegulationsApi
from efd.http.server import Limits, Listener, name_the_server, quiet_parse_errors
from efd.http.status import Status
from efd.loop import Worker
from efd.observe import tracing
from efd.observe.metrics import Metrics
from efd.observe.stream import Hub
from efd.operations.selection import iso
from efd.personas.capture import Capture
from efd.processes.parsers import ParserPool
from efd.records import DeliveryStatus, InsertStatus, NewMessage
from efd.segment.payload import MAX_RAW_REQUEST_BYTES
from efd.services.notices import Notices
from efd.services.periodic import Periodic, computations
from efd.services.regulations import RegulationRunner
from efd.settings import Current
from efd.store import Steps, Store
from efd.store import migrate as migrations
from efd.store.computations import ComputationsStore
from efd.store.engine import DatabaseInUse, SqliteLock, normalise_url, safe_url, sqlite_path
from efd.store.health import HealthStore
from efd.store.operations import OperationsStore
from efd.store.profiles import ProfilesStore
from efd.store.regulations import Regulations, RegulationsStore
from efd.store.runner import AsyncDeliveries, AsyncPauses, AsyncStore
from efd.store.suppressions import Suppressions

log = logging.getLogger("efd.daemon")

_PARSER_STOP = 5.0  # seconds parser processes get to finish at shutdown


class Component(Protocol):
    async def start(self, stack: AsyncExitStack) -> None:
        """Start; register on `stack` what undoes it."""
        ...


@dataclass(frozen=True, slots=True)
class Shared:
    """What every part may use: the configuration's holder, the counters, the live
    stream's hub, and this process's name as a claimer of leases and jobs."""

    settings: Current[Settings]
    metrics: Metrics
    hub: Hub
    owner: str
    cpus: Cpus  # read once at start: what the helper processes' default follows


class OpenFiles:
    """Fits the open-file limit to max_connections before anything opens a file (the child
    processes inherit the raised limit). Owns nothing to stop."""

    def __init__(self, shared: Shared) -> None:
        self._shared = shared
        self.max_connections = shared.settings.value.server.max_connections

    async def start(self, stack: AsyncExitStack) -> None:
        self.max_connections = fit_open_files(self._shared.settings.value, self._shared.cpus.usable)


class Telemetry:
    """The OpenTelemetry tracer (efd/observe/tracing.py) when `[telemetry]` has an endpoint:
    started first and stopped last, so the spans of the last rounds are exported. Owns the
    tracer provider and its exporter thread; nothing of it exists when telemetry is off."""

    def __init__(self, shared: Shared) -> None:
        self._shared = shared

    async def start(self, stack: AsyncExitStack) -> None:
        config = self._shared.settings.value.telemetry
        if config.otlp_endpoint is None:
            return
        tracer = tracing.start(
            config.otlp_endpoint,
            service_name=config.service_name,
            ratio=config.sampling_ratio,
            version=__version__,
        )
        stack.push_async_callback(tracing.stop, tracer)


class ChildProcesses:
    """The sender and parser processes. Started first, so that they load while the store
    is opened and migrated; stopped last. Owns the two pools; touches nothing else."""

    def __init__(self, shared: Shared) -> None:
        self._shared = shared
        self.senders: SenderPool | None = None  # when there are sender processes
        self.parsers: ParserPool | None = None  # when there are parser processes
        self._senders_ready: asyncio.Future[None] | None = None
        self._parsers_ready: asyncio.Future[None] | None = None

    async def start(self, stack: AsyncExitStack) -> None:
        holder = self._shared.settings
        settings, delivery = holder.value, holder.value.delivery
        cpus = self._shared.cpus
        parsers, senders = settings.helpers(cpus.usable)
        if None in (settings.server.parse_processes, delivery.sender_processes):
            log.info(
                "%d sender and %d parser processes, the default where efd may use %s "
                "(delivery.sender_processes and server.parse_processes choose otherwise)",
                senders,
                parsers,
                cpus,
            )
        if senders:
            self.senders = SenderPool(
                processes=senders,
                options=sender_options(settings),
                routes=[r for d in settings.destinations for r in d.routes(delivery.user_agent)],
                log_level=settings.logging.level,
                log_format=settings.logging.format,
                auths=_auths(settings),
                targets=settings.broker_targets(),
            )
            self._senders_ready = asyncio.ensure_future(self.senders.start())
            grace = delivery.timeout_seconds + SHUTDOWN_MARGIN
            stack.push_async_callback(_stop_children, self.senders, self._senders_ready, grace)
            holder.subscribe(self._reload_senders, early=True)
        if parsers:
            self.parsers = ParserPool(
                processes=parsers,
                sources=_parser_sources(settings),
                filters=settings.filter_sets(),
                log_level=settings.logging.level,
                log_format=settings.logging.format,
                actions=settings.action_sets(),
            )
            self._parsers_ready = asyncio.ensure_future(self.parsers.start())
            stack.push_async_callback(
                _stop_children, self.parsers, self._parsers_ready, _PARSER_STOP
            )
            holder.subscribe(self._reload_parsers)

    async def senders_ready(self) -> SenderPool | None:
        await _ready(self._senders_ready)
        return self.senders

    async def parsers_ready(self) -> ParserPool | None:
        await _ready(self._parsers_ready)
        return self.parsers

    async def _reload_senders(self, settings: Settings) -> None:
        assert self.senders is not None
        routes = [r for d in settings.destinations for r in d.routes(settings.delivery.user_agent)]
        await self.senders.reload(
            routes, settings.logging.level, _auths(settings), settings.broker_targets()
        )

    async def _reload_parsers(self, settings: Settings) -> None:
        assert self.parsers is not None
        await self.parsers.reload(
            _parser_sources(settings),
            settings.filter_sets(),
            settings.logging.level,
            settings.action_sets(),
        )


class Storage:
    """The database: its lock (SQLite: one process), its migrations, the Store and the
    threads that run it, and the store's parts the services use. Owns the store's
    suppressions and profile capture (on while an audience or computed trait is
    configured). May not start any work of its own but resuming what the last process held
    (SQLite)."""

    def __init__(self, shared: Shared) -> None:
        self._shared = shared
        self._db: AsyncStore | None = None
        self._parts: _StoreParts | None = None
        # What the store's transactions do for the current settings; the store reads it
        # through the function it is built with (efd/store/steps.py), replaced as a whole.
        self._steps = Steps()
        self._suppressions: Suppressions | None = None

    @property
    def db(self) -> AsyncStore:
        assert self._db is not None, "Storage.start() did not finish"
        return self._db

    @property
    def parts(self) -> _StoreParts:
        assert self._parts is not None, "Storage.start() did not finish"
        return self._parts

    async def start(self, stack: AsyncExitStack) -> None:
        store = await self._open(stack)
        db = self._db = AsyncStore(store)
        stack.push_async_callback(asyncio.to_thread, db.close)
        suppressions = self._suppressions = await db.read(Suppressions, store)
        profiles = ProfilesStore(store)
        self._parts = _StoreParts(
            profiles=profiles,
            capture=Capture(profiles),
            regulations=RegulationsStore(store, suppressions),
            computations=ComputationsStore(store, suppressions),
            operations=OperationsStore(store),
        )
        self._steps = self._steps_for(self._shared.settings.value)
        if store.single_process:
            await self._resume()
        await self._dissolve_lanes(self._shared.settings.value)
        self._shared.settings.subscribe(self._configure)

    def _steps_for(self, settings: Settings) -> Steps:
        ordered = settings.ordered()
        return Steps(
            suppressions=self._suppressions,
            # Profiles are kept only when something computes on them.
            capture=self.parts.capture if computations(settings) else None,
            lanes=Lanes(ordered) if ordered else None,
        )

    async def _configure(self, settings: Settings) -> None:
        self._steps = self._steps_for(settings)
        await self._dissolve_lanes(settings)

    async def _dissolve_lanes(self, settings: Settings) -> None:
        """Ingestion puts the deliveries of ordered destinations in lanes, and recorded
        outcomes hand lanes on (the steps); the lanes of a destination whose ordering was
        turned off are dropped, their waiting deliveries due now (every process of a
        cluster should run the same configuration)."""
        ordered = settings.ordered()
        store = self.db.store
        try:
            released = await self.db.write(store.lanes.dissolve, ordered, time.time())
        except StoreError as error:
            log.warning("could not drop the lanes of unordered destinations: %s", error)
            return
        if released:
            log.info("%d deliveries left lanes whose destination is no longer ordered", released)

    async def _open(self, stack: AsyncExitStack) -> Store:
        storage = self._shared.settings.value.storage
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
            steps=lambda: self._steps,
        )
        if await asyncio.to_thread(HealthStore(store).autovacuum_off):
            log.warning(
                "PostgreSQL runs with autovacuum off: efd's tables get no planner statistics "
                "and keep their dead rows, so queries slow down as they grow; turn autovacuum "
                "on, or run VACUUM ANALYZE on the database regularly"
            )
        return store

    async def _resume(self) -> None:
        """SQLite: this is the only process, so what the last one held is due now."""
        db = self.db
        # Before the first request, so that it does not wait for this (and it is logged).
        await db.write(db.store.ingestion.index_recent_messages, time.time())
        released = await db.write(db.store.queue.release_all_leases, time.time())
        if released:
            log.info("resuming %d deliveries that were in flight at the last stop", released)
        batches = await db.write(db.store.batches.release_all_leases, time.time())
        if batches:
            log.info("resuming %d batches that were in flight at the last stop", batches)
        resumed = await db.write(self.parts.regulations.release_regulation_leases)
        if resumed:
            log.info("resuming %d regulations that were running at the last stop", resumed)


@dataclass(frozen=True, slots=True)
class _StoreParts:
    profiles: ProfilesStore
    capture: Capture
    regulations: Regulations
    computations: ComputationsStore
    operations: OperationsStore


class Delivery:
    """The dispatcher, with what sends its rounds (the sender processes, or a sender in
    this process) and, on PostgreSQL, the LISTEN worker that wakes it on other processes'
    work."""

    def __init__(self, shared: Shared, children: ChildProcesses, storage: Storage) -> None:
        self._shared = shared
        self._children = children
        self._storage = storage
        self._dispatcher: Dispatcher | None = None
        self._batcher: Batcher | None = None
        self._notices: Notices | None = None

    @property
    def notices(self) -> Notices:
        """The operational events' emitter (efd/services/notices.py)."""
        assert self._notices is not None, "Delivery.start() did not finish"
        return self._notices

    @property
    def dispatcher(self) -> Dispatcher:
        assert self._dispatcher is not None, "Delivery.start() did not finish"
        return self._dispatcher

    @property
    def batcher(self) -> Batcher:
        """What sends the batched actions' batches (efd/delivery/batches.py)."""
        assert self._batcher is not None, "Delivery.start() did not finish"
        return self._batcher

    def notify(self) -> None:
        """New work may be due: wake the dispatcher and the batcher."""
        self.dispatcher.notify()
        self.batcher.notify()

    async def start(self, stack: AsyncExitStack) -> None:
        shared, db = self._shared, self._storage.db
        rounds: Sender | SenderPool
        senders = await self._children.senders_ready()
        if senders is not None:
            rounds = senders
        else:
            sender = sender_options(shared.settings.value).sender()
            sender.configure_auths(_auths(shared.settings.value))
            sender.configure_targets(shared.settings.value.broker_targets())
            await sender.start()
            stack.push_async_callback(sender.close)
            shared.settings.subscribe(functools.partial(_reload_auths, sender), early=True)
            rounds = sender
        # Stopped after the dispatcher (the stack unwinds in reverse): its last events stored.
        notices = self._notices = Notices(
            db=db, settings=shared.settings, metrics=shared.metrics, on_stored=self._wake
        )
        await notices.start(stack)
        dispatcher = self._dispatcher = Dispatcher(
            deliveries=AsyncDeliveries(db),
            rounds=rounds,
            settings=shared.settings,
            metrics=shared.metrics,
            owner=shared.owner,
            hub=shared.hub,
            pauses=AsyncPauses(db),
            notices=notices,
        )
        batcher = self._batcher = Batcher(
            db=db,
            rounds=rounds,
            settings=shared.settings,
            metrics=shared.metrics,
            owner=shared.owner,
            circuits=dispatcher.circuits,
            hub=shared.hub,
            paused=dispatcher.holds,
            notices=notices,
        )
        if db.store.listener.available:
            _listen_for_work(stack, db.store, self.notify)
        await dispatcher.start(stack)
        await batcher.start(stack)

    def _wake(self) -> None:
        if self._dispatcher is not None:
            self._dispatcher.notify()


class Services:
    """The regulation runner and the periodic jobs (retention, audience and trait syncs)."""

    def __init__(self, shared: Shared, storage: Storage, delivery: Delivery) -> None:
        self._shared = shared
        self._storage = storage
        self._delivery = delivery
        self._runner: RegulationRunner | None = None
        self._periodic: Periodic | None = None

    @property
    def runner(self) -> RegulationRunner:
        assert self._runner is not None, "Services.start() did not finish"
        return self._runner

    @property
    def periodic(self) -> Periodic:
        assert self._periodic is not None, "Services.start() did not finish"
        return self._periodic

    async def start(self, stack: AsyncExitStack) -> None:
        shared, storage = self._shared, self._storage
        notify = self._delivery.notify
        self._runner = RegulationRunner(
            db=storage.db,
            regulations=storage.parts.regulations,
            settings=shared.settings,
            metrics=shared.metrics,
            owner=shared.owner,
            on_notified=notify,
        )
        await self._runner.start(stack)
        self._periodic = Periodic(
            settings=shared.settings,
            db=storage.db,
            computations_store=storage.parts.computations,
            profiles=storage.parts.profiles,
            metrics=shared.metrics,
            owner=shared.owner,
            on_sent=notify,
            notices=self._delivery.notices,
        )
        await self._periodic.start(stack)


class Http:
    """The listening socket and what answers on it: ingestion (with its group-commit
    writer), status, the regulations API, the admin API and the live views. Started last,
    stopped first: it stops accepting, then lets running requests finish."""

    def __init__(
        self,
        shared: Shared,
        files: OpenFiles,
        children: ChildProcesses,
        storage: Storage,
        delivery: Delivery,
        services: Services,
    ) -> None:
        self._shared = shared
        self._files = files
        self._children = children
        self._storage = storage
        self._delivery = delivery
        self._services = services
        self.port: int | None = None
        self.listener: Listener | None = None  # once serving

    async def start(self, stack: AsyncExitStack) -> None:
        shared, storage = self._shared, self._storage
        db, notify = storage.db, self._delivery.notify
        parsers = await self._children.parsers_ready()
        writer: GroupCommit[NewMessage, InsertStatus] = GroupCommit(
            self._store_messages, max_items=5000, name="efd-ingest-writer", depth=2
        )
        writer.start()
        stack.push_async_callback(writer.close)
        ingest = Ingest(
            shared.settings,
            writer=writer,
            metrics=shared.metrics,
            parsers=parsers,
        )
        regulations = RegulationsApi(
            shared.settings,
            db=db,
            regulations=storage.parts.regulations,
            on_created=self._services.runner.notify,
        )
        admin = AdminApi(
            shared.settings,
            db=db,
            operations=storage.parts.operations,
            on_due=notify,
            on_paused=self._delivery.dispatcher.pauses_changed,
            notices=self._delivery.notices,
        )
        live = LiveApi(
            shared.settings,
            db=db,
            hub=shared.hub,
            circuits=self._delivery.dispatcher.circuits,
            metrics=shared.metrics,
        )
        status = Status(shared.settings, db=db, metrics=shared.metrics, owner=shared.owner)
        routes = status.routes() + regulations.routes() + admin.routes() + live.routes()
        await self._serve(stack, ingest, routes)
        stack.callback(shared.hub.close)  # first at shutdown: open streams end, not linger

    async def _serve(
        self, stack: AsyncExitStack, ingest: Ingest, routes: list[web.RouteDef]
    ) -> None:
        server = self._shared.settings.value.server
        most = self._files.max_connections
        per_address = server.max_connections_per_address or -(-most // 2)
        limits = Limits(
            max_connections=most,
            request_timeout=server.request_timeout_seconds,
            keepalive_timeout=server.keepalive_timeout_seconds,
            max_body_bytes=max(MAX_RAW_REQUEST_BYTES, MAX_BODY_BYTES),
            max_per_address=min(per_address, most),
        )
        listener = self.listener = Listener(limits, self._shared.metrics)
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
        db, hub = self._storage.db, self._shared.hub
        store = db.store
        dispatcher = self._delivery.dispatcher
        taken: list[NewMessage] = []
        grant = dispatcher.room.grant()  # deliveries the dispatcher takes without a claim

        def write() -> list[InsertStatus]:
            rows = take()  # in the writer thread: everything that arrived until now
            taken.extend(rows)
            if not rows:
                return []
            return store.ingestion.insert_messages(rows, time.time(), handoff=grant)

        try:
            statuses = await db.write_later(write)
        except BaseException:
            grant.settle()
            raise
        dispatcher.hand_over(grant)
        if taken:
            self._delivery.batcher.notify()  # batched routes' events wait to be formed
        if hub.active:  # committed: the live stream may show them
            for row, status in zip(taken, statuses, strict=True):
                if status is InsertStatus.STORED:
                    hub.publish("message", functools.partial(_message_event, row))
        return statuses


def _auths(settings: Settings) -> dict[str, Auth]:
    """Route name -> the outbound auth of its requests, over every destination."""
    return {name: auth for d in settings.destinations for name, auth in d.auths().items()}


async def _reload_auths(sender: Sender, settings: Settings) -> None:
    sender.configure_auths(_auths(settings))
    sender.configure_targets(settings.broker_targets())


def sender_options(settings: Settings) -> SenderOptions:
    delivery = settings.delivery
    return SenderOptions(
        timeout=delivery.timeout_seconds,
        allowed_networks=tuple(delivery.allowed_networks),
        ca_file=delivery.ca_file,
        response_head_bytes=delivery.response_head_bytes,
        proxy=delivery.egress(),
    )


def _message_event(row: NewMessage) -> dict[str, Any]:
    """A stored message as GET /admin/stream shows it."""
    return {
        "source": row.source,
        "messageId": row.message_id,
        "type": row.type,
        "userId": row.user_id,
        "event": row.event,
        "receivedAt": iso(row.received_at),
        # Each destination's delivery as stored, as GET /admin/recent shows it.
        "destinations": dict(sorted(_initial_states(row).items())),
    }


def _initial_states(row: NewMessage) -> dict[str, str]:
    states = dict.fromkeys(row.destinations, DeliveryStatus.PENDING.value)
    for destination, _body, filtered in row.shaped:
        states[destination] = (
            DeliveryStatus.PENDING if filtered is None else DeliveryStatus.FILTERED
        ).value
    for route, _body, _url, error in row.mapped:
        states[route] = (DeliveryStatus.PENDING if error is None else DeliveryStatus.FAILED).value
    return states


def _parser_sources(settings: Settings) -> list[tuple[str, str, tuple[str, ...]]]:
    return [
        (s.write_key.get_secret_value(), s.name, tuple(s.destinations)) for s in settings.sources
    ]


async def _ready(starting: asyncio.Future[None] | None) -> None:
    """Wait for child processes started early (ChildProcesses.start)."""
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
    dispatcher too. A lost connection is opened again after the Worker's back-off."""

    async def listen() -> float:
        await store.listener.listen(notify)
        return 0.0  # the server ended the connection: listen again at once

    worker = Worker(listen, name="efd-listen")
    worker.start()
    stack.push_async_callback(functools.partial(worker.stop, interrupt=True))
