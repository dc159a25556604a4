"""GET /healthz and GET /metrics: whether the daemon can do its work, and what it did."""

from __future__ import annotations

import asyncio
import contextlib

from aiohttp import web
from sqlalchemy.exc import SQLAlchemyError

from efd import server
from efd.config import Settings
from efd.metrics import CONTENT_TYPE, Metrics
from efd.operators import unconfigured
from efd.server import json_response
from efd.store.runner import AsyncStore


class Status:
    def __init__(self, settings: Settings, *, db: AsyncStore, metrics: Metrics) -> None:
        self._settings = settings
        self._db = db
        self._metrics = metrics

    def reload(self, settings: Settings) -> None:
        self._settings = settings

    def routes(self) -> list[web.RouteDef]:
        return [web.get("/healthz", self._healthz), web.get("/metrics", self._render)]

    async def _healthz(self, _request: web.Request) -> web.Response:
        try:
            async with asyncio.timeout(2):
                await self._db.read(self._db.store.ping)
        except (SQLAlchemyError, TimeoutError) as error:
            return json_response({"status": "unavailable", "store": str(error)[:200]}, 503)
        return json_response({"status": "ok"})

    async def _render(self, request: web.Request) -> web.Response:
        # Open while no admin token is configured, unlike the admin endpoints: a scraper on
        # a private interface needs no secret.
        if self._settings.server.admin_token is not None:
            refused = server.require_admin(self._settings, request)
            if refused is not None:
                return refused
        with contextlib.suppress(SQLAlchemyError, TimeoutError):
            async with asyncio.timeout(5):
                backlog = await self._db.read(self._db.store.backlog)
                # Every configured destination, and those no longer configured that still
                # have pending deliveries (never sent: see efd discard).
                configured = {d.name: backlog.get(d.name, 0) for d in self._settings.destinations}
                self._metrics.backlog = {
                    **{(name, True): count for name, count in configured.items()},
                    **{
                        (name, False): count
                        for name, count in unconfigured(backlog, configured).items()
                    },
                }
        response = web.Response(body=self._metrics.render())
        response.headers["Content-Type"] = CONTENT_TYPE
        return response
