"""The daemon: one process holds the ingestion API, the dispatcher and housekeeping.

`Daemon` is the list of its parts (efd.daemon.components), started in order on one exit
stack that stops them in reverse: stop accepting, finish what was accepted, give
deliveries a bounded grace, close the store. `run` serves until a signal, and applies a
new configuration on SIGHUP.
"""

from __future__ import annotations

import asyncio
import logging
import os
import signal
import socket
import uuid
from contextlib import AsyncExitStack
from typing import Any

from efd import config
from efd.config import Settings
from efd.daemon.components import (
    ChildProcesses,
    Component,
    Delivery,
    Http,
    OpenFiles,
    Services,
    Shared,
    Storage,
    Telemetry,
)
from efd.daemon.startup import StartupError, fit_open_files, reserved_files, usable_cpus
from efd.delivery.sender import SenderPool
from efd.errors import StoreError
from efd.http.server import Listener
from efd.loop import Worker
from efd.observe.metrics import Metrics
from efd.observe.stream import Hub
from efd.observe.systemd import Notifier
from efd.operations.selection import unconfigured
from efd.personas.sync import Computation, SyncResult
from efd.processes.parsers import ParserPool
from efd.services.periodic import computations
from efd.settings import Current
from efd.store.runner import AsyncStore

__all__ = ["Daemon", "StartupError", "fit_open_files", "reserved_files", "restart_needed", "run"]

log = logging.getLogger(__name__)


class Daemon:
    """One efd process: its parts, in the order they start (see efd.daemon.components),
    and the one holder of its configuration, which `reload` replaces.

    Owns the exit stack on which each part registers its stop. May not reach into a part:
    what the CLI and the tests use (the port, the store, the syncs) it hands on from the
    part that owns it.
    """

    def __init__(self, settings: Settings, *, hub: Hub | None = None) -> None:
        self.settings = Current(settings)
        self._running = settings  # what is applied of the sections a reload may not change
        self.metrics = Metrics()
        self.hub = hub or Hub()  # GET /admin/stream's subscribers
        self.owner = f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:8]}"
        self.settings.subscribe(_log_level, early=True)
        shared = Shared(
            settings=self.settings,
            metrics=self.metrics,
            hub=self.hub,
            owner=self.owner,
            cpus=usable_cpus(),
        )
        self._files = OpenFiles(shared)
        self._children = ChildProcesses(shared)
        self._storage = Storage(shared)
        self._delivery = Delivery(shared, self._children, self._storage)
        self._services = Services(shared, self._storage, self._delivery)
        self._http = Http(
            shared, self._files, self._children, self._storage, self._delivery, self._services
        )
        self.components: list[Component] = [
            Telemetry(shared),
            self._files,
            self._children,
            self._storage,
            self._delivery,
            self._services,
            self._http,
        ]
        self._started = False
        self._reloading = asyncio.Lock()
        self._stack = AsyncExitStack()
        self._stopped = False

    # -- what the parts own --------------------------------------------------------------

    @property
    def db(self) -> AsyncStore:
        return self._storage.db

    @property
    def port(self) -> int | None:
        return self._http.port

    @property
    def listener(self) -> Listener | None:
        return self._http.listener

    @property
    def max_connections(self) -> int:
        """As the open-file limit allows."""
        return self._files.max_connections

    @property
    def senders(self) -> SenderPool | None:
        return self._children.senders

    @property
    def parsers(self) -> ParserPool | None:
        return self._children.parsers

    @property
    def computations(self) -> list[Computation]:
        if self._started:
            return self._services.periodic.computations
        return computations(self.settings.value)

    # -- lifecycle -------------------------------------------------------------------------

    async def start(self) -> None:
        try:
            for component in self.components:
                await component.start(self._stack)
        except BaseException:
            await self.stop()
            raise
        self._started = True
        settings = self.settings.value
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

    async def stop(self) -> None:
        """Stop accepting, finish what was accepted, give deliveries a bounded grace."""
        if self._stopped:
            return
        self._stopped = True
        log.info("shutting down")
        await self._stack.aclose()
        log.info("stopped")

    # -- reload ------------------------------------------------------------------------------

    async def reload(self, settings: Settings) -> list[str]:
        """Apply a new configuration without dropping a request or a delivery in flight:
        sources, destinations (hooks, headers, secrets), audiences and computed traits,
        the admin token, the user agent and the log level take effect for new requests and
        rounds. Returns the changed keys that need a restart (they are not applied)."""
        async with self._reloading:
            assert self._started, "Daemon.start() did not finish"
            not_applied = restart_needed(self._running, settings)
            # The parts are told in order (efd.settings): the children and the dispatcher
            # know a new destination before ingestion routes a message to it.
            await self.settings.replace(settings)
            # What was not applied stays as it runs, so a later reload reports it again.
            unchanged = {name: getattr(self._running, name) for name in _RESTART_SECTIONS}
            self._running = settings.model_copy(update=unchanged) if not_applied else settings
            return not_applied

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
        configured = self.settings.value.route_names()
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
        return self._services.periodic.computation(name)

    async def sync(self, computation: Computation, now: float | None = None) -> SyncResult:
        return await self._services.periodic.sync(computation, now)

    async def retention(self) -> None:
        await self._services.periodic.retention()


def _log_level(settings: Settings) -> None:
    logging.getLogger().setLevel(settings.logging.level)


# Sections of which a reload applies only the keys below; a change to any other key of them
# needs a restart (the listening socket, the store, the child processes, the limits).
_RESTART_SECTIONS = ("server", "storage", "delivery", "logging", "telemetry")
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
    background: list[Worker] = []
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
        if notifier.watchdog_interval is not None:
            background.append(Worker(notifier.ping_watchdog, name="efd-watchdog"))
        if notifier.enabled:
            background.append(Worker(_StatusReport(daemon, notifier).step, name="efd-status"))
        for worker in background:
            worker.start()
        if ready is not None:
            ready(daemon)
        await stop.wait()
    finally:
        serving = False
        notifier.notify(stopping="1", status="stopping: finishing what is in flight")
        for worker in background:
            await worker.stop(interrupt=True)
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
            refused + " has %s: %s",
            config_path,
            error.count,
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


class _StatusReport:
    """STATUS= for `systemctl status`: the backlog and the delivery rate, every `every` s."""

    def __init__(self, daemon: Daemon, notifier: Notifier, every: float = 10.0) -> None:
        self._daemon = daemon
        self._notifier = notifier
        self._every = every
        self._delivered: int | None = None  # at the last report

    async def step(self) -> float:
        metrics = self._daemon.metrics
        now = sum(metrics.delivered.values())
        if self._delivered is None:  # the first step: the count to measure the rate from
            self._delivered = now
            return self._every
        rate, self._delivered = (now - self._delivered) / self._every, now
        db = self._daemon.db
        try:
            backlog = sum((await db.read(db.store.queue.backlog)).values())
        except StoreError:
            self._notifier.notify(status=f"store unreachable; {rate:.0f} deliveries/s")
            return self._every
        self._notifier.notify(status=f"{backlog} deliveries pending, {rate:.0f} delivered/s")
        return self._every
