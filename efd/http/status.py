"""GET /healthz, GET /readyz and GET /metrics: whether the daemon is alive, whether it can
take messages now, and what it did.

- /healthz (liveness): 200 while the process answers and its store answers a read; 503
  with the reason otherwise. It says nothing of writes.
- /readyz (readiness): 200 only when a write to the store succeeds now. It writes a probe
  row and answers by the outcome: 503 if the write fails, or takes longer than
  PROBE_TIMEOUT. One probe at a time, and its outcome serves every request for PROBE_EVERY
  seconds, so probing often costs the writer at most one small commit a second and a stuck
  writer does not collect probes. The writer thread notes every store error
  (efd/store/runner.py): a write that failed within FAILURE_MEMORY seconds, ingestion's
  included, makes the answer 503 at once, even when a probe's smaller write would pass.
  Other writes' successes do not count: a claim that finds nothing writes nothing to disk.
"""

from __future__ import annotations

import asyncio
import contextlib
import time

from aiohttp import web

from efd.config import Settings
from efd.errors import StoreError
from efd.http import server
from efd.http.responses import json_response
from efd.observe.metrics import CONTENT_TYPE, Metrics
from efd.operations.selection import unconfigured
from efd.settings import Current
from efd.store.health import Health, HealthStore
from efd.store.runner import AsyncStore

PROBE_EVERY = 1.0  # seconds a probe's outcome is the answer
FAILURE_MEMORY = 5.0  # seconds a failed write keeps efd unready
PROBE_TIMEOUT = 2.0  # seconds a probe write may take


class Status:
    """GET /healthz, GET /readyz and GET /metrics (see the module's description).

    Owns the readiness probe and its last outcome. May write nothing but the probe row.
    """

    def __init__(
        self, settings: Current[Settings], *, db: AsyncStore, metrics: Metrics, owner: str = ""
    ) -> None:
        self._current = settings
        self._db = db
        self._health: Health = HealthStore(db.store)
        self._metrics = metrics
        self._owner = owner
        self._probe: asyncio.Future[None] | None = None
        self._probed: tuple[float, str | None] | None = None  # (when, why unready or None)

    @property
    def _settings(self) -> Settings:
        return self._current.value

    def routes(self) -> list[web.RouteDef]:
        return [
            web.get("/healthz", self._healthz),
            web.get("/readyz", self._readyz),
            web.get("/metrics", self._render),
        ]

    async def _healthz(self, _request: web.Request) -> web.Response:
        try:
            async with asyncio.timeout(2):
                await self._db.read(self._health.ping)
        except (StoreError, TimeoutError) as error:
            return json_response({"status": "unavailable", "store": str(error)[:200]}, 503)
        return json_response({"status": "ok"})

    async def _readyz(self, _request: web.Request) -> web.Response:
        reason = await self.unready()
        if reason is None:
            return json_response({"status": "ready"})
        return json_response({"status": "unavailable", "reason": reason}, 503)

    async def unready(self) -> str | None:
        """Why efd cannot take messages now, or None when it can."""
        db, now = self._db, time.monotonic()
        failed = db.write_failed
        if failed is not None and now - failed[0] < FAILURE_MEMORY:
            return f"a write to the store failed {now - failed[0]:.1f} s ago: {failed[1]}"
        probed = self._probed
        if probed is not None and now - probed[0] < PROBE_EVERY:
            return probed[1]
        probe = self._probe
        if probe is None or probe.done():
            probe = self._probe = asyncio.ensure_future(
                db.write(db.store.jobs.write_probe, self._owner, time.time())
            )
            probe.add_done_callback(self._note)
        try:
            async with asyncio.timeout(PROBE_TIMEOUT):
                await asyncio.shield(probe)
        except TimeoutError:
            return f"the store did not complete a write within {PROBE_TIMEOUT:g} s"
        except StoreError as error:
            return f"a write to the store failed: {str(error).splitlines()[0][:200]}"
        return None

    def _note(self, probe: asyncio.Future[None]) -> None:
        """A probe's outcome, kept for PROBE_EVERY (and read even when every request that
        waited on it gave up)."""
        error = None if probe.cancelled() else probe.exception()
        reason = None
        if probe.cancelled() or error is not None:
            reason = f"a write to the store failed: {str(error).splitlines()[0][:200]}"
        self._probed = (time.monotonic(), reason)

    async def _render(self, request: web.Request) -> web.Response:
        # Open while no admin token is configured, unlike the admin endpoints: a scraper on
        # a private interface needs no secret.
        if self._settings.server.admin_token is not None:
            server.require_admin(self._settings, request)
        with contextlib.suppress(StoreError, TimeoutError):
            async with asyncio.timeout(5):
                backlog = await self._db.read(self._db.store.queue.backlog)
                # Every configured destination, and those no longer configured that still
                # have pending deliveries (never sent: see efd discard).
                configured = {name: backlog.get(name, 0) for name in self._settings.route_names()}
                self._metrics.backlog = {
                    **{(name, True): count for name, count in configured.items()},
                    **{
                        (name, False): count
                        for name, count in unconfigured(backlog, configured).items()
                    },
                }
            async with asyncio.timeout(5):
                horizon = time.time() - self._settings.storage.retention_days * 86400
                lag = await self._db.read(self._db.store.retention.lag, horizon)
            self._metrics.retention_behind = lag.behind_seconds
            self._metrics.retention_kept = lag.kept
            ordered = self._settings.ordered()
            if ordered:
                async with asyncio.timeout(5):
                    blocked = await self._db.read(self._db.store.lanes.blocked)
                self._metrics.lanes_blocked = {
                    name: blocked[name].count if name in blocked else 0 for name in ordered
                }
            else:
                self._metrics.lanes_blocked = {}
        response = web.Response(body=self._metrics.render())
        response.headers["Content-Type"] = CONTENT_TYPE
        return response
