"""What is happening now: endpoint health, the live stream, and the web console.

    GET /admin/destinations   per destination: backlog, pause; per hook: pause, circuit, last
                              error, attempts, success rate and p50/p99 over 1 h and 24 h; then
                              each destination not configured that has pending deliveries
    GET /admin/stream         server-sent events: `message`, `attempt`, `sampled`
    GET /admin/recent         the newest stored messages, each with its destinations' states
    GET /admin/rates          per destination: delivered and failed per minute, last N minutes
    GET /console              the web console (static files in efd/http/console/)

Bearer [server] admin_token (server.require_admin) for the APIs. The console's page
holds no data, but it is off like them (403 with the reason) while no token is set.

A stream was authorised by the token of its start: a reload that changes or removes the
token ends every open stream (a stream stalled on a client that does not read is cut off),
so that the subscriber has to show the new token. At most stream.MAX_SUBSCRIBERS streams are
open at once; one more is answered 503 `too_many_streams`.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from importlib import resources
from pathlib import Path
from typing import Any

from aiohttp import web
from multidict import MultiMapping

from efd.config import Settings
from efd.delivery.circuit import Circuits
from efd.delivery.pausing import Pause
from efd.errors import ClientError, StoreError
from efd.http import server
from efd.http.admin import numbered_hooks
from efd.http.responses import error_response, json_response
from efd.observe.metrics import Metrics
from efd.observe.stream import Hub
from efd.operations import pauses
from efd.operations.selection import iso, lanes_json
from efd.segment import webhooks
from efd.settings import Current
from efd.store.health import Health, HealthStore, WindowStats
from efd.store.rates import Rates
from efd.store.recent import RecentMessages
from efd.store.runner import AsyncStore

log = logging.getLogger(__name__)

WINDOWS = (("1h", 3600.0), ("24h", 86400.0))
KEEPALIVE = 15.0  # seconds between comments on a quiet stream, so proxies keep it open
_CHECK = 1.0  # seconds between looks at whether a quiet stream's client is still there
_TYPES = {".js": "text/javascript", ".css": "text/css"}
RECENT_DEFAULT, RECENT_MAX = 50, 200  # messages GET /admin/recent answers with
RATES_MAX = 60  # minutes GET /admin/rates looks back at most, and by default


def _assets() -> dict[str, str]:
    """The console's files that may be asked for, by name: its scripts (ES modules, which a
    browser runs only with a JavaScript type) and its style sheet."""
    folder = resources.files("efd.http").joinpath("console")
    kinds = {entry.name: _TYPES.get(Path(entry.name).suffix) for entry in folder.iterdir()}
    return {name: kind for name, kind in kinds.items() if kind is not None}


_ASSETS = _assets()


def _window_json(stats: WindowStats | None) -> dict[str, Any]:
    if stats is None or stats.attempts == 0:
        return {"attempts": 0, "successRate": None, "p50Ms": None, "p99Ms": None}
    return {
        "attempts": stats.attempts,
        "successRate": round(stats.successes / stats.attempts, 4),
        "p50Ms": None if stats.p50_ms is None else round(stats.p50_ms, 3),
        "p99Ms": None if stats.p99_ms is None else round(stats.p99_ms, 3),
    }


def _state(whole: Pause | None, hooks: list[Any]) -> str:
    """active, paused or disabled (the whole destination, or every hook), or partly (some
    hooks): what the console's badge shows."""
    if whole is not None:
        return whole.kind
    kinds = {h["kind"] for h in hooks if h is not None}
    if hooks and all(h is not None for h in hooks):
        return "paused" if "paused" in kinds else "disabled"
    return "partly" if kinds else "active"


def _asset(name: str) -> bytes:
    return resources.files("efd.http").joinpath("console", name).read_bytes()


class LiveApi:
    """GET /admin/destinations, GET /admin/stream and the console.

    Owns the open streams' connections, and ends them when a reload changes the admin
    token. Reads the store's health queries and the dispatcher's circuits; may not change
    either.
    """

    def __init__(
        self,
        settings: Current[Settings],
        *,
        db: AsyncStore,
        hub: Hub,
        circuits: Circuits,
        metrics: Metrics | None = None,
    ) -> None:
        self._current = settings
        self._metrics = metrics or Metrics()
        self._token = settings.value.server.admin_token
        settings.subscribe(self._configure)
        self._db = db
        self._health: Health = HealthStore(db.store)
        self._recent = RecentMessages(db.store)
        self._rates = Rates(db.store)
        self._hub = hub
        self._circuits = circuits
        self._streams: set[asyncio.Transport] = set()  # connections of open streams

    @property
    def _settings(self) -> Settings:
        return self._current.value

    def _configure(self, settings: Settings) -> None:
        changed = settings.server.admin_token != self._token
        self._token = settings.server.admin_token
        if changed and self._streams:
            log.info(
                "admin token changed: ending %d open streams of GET /admin/stream",
                len(self._streams),
            )
            self._hub.close()
            for transport in list(self._streams):
                # Blocked writing to a client that does not read: it would not see the end.
                if transport.get_write_buffer_size():
                    transport.abort()

    def routes(self) -> list[web.RouteDef]:
        return [
            web.get("/admin/destinations", self._destinations),
            web.get("/admin/stream", self._stream),
            web.get("/admin/recent", self._recent_messages),
            web.get("/admin/rates", self._rates_per_minute),
            web.get("/console", self._console),
            web.get("/console/{asset}", self._console_asset),
        ]

    # -- health --------------------------------------------------------------------------

    async def _destinations(self, request: web.Request) -> web.Response:
        server.require_admin(self._settings, request)
        now = time.time()
        # Each hook as the attempts table names it (its label: credentials and query values
        # hidden), for the circuit lookups its configured URL.
        routes = [
            (destination, name, hooks)
            for destination in self._settings.destinations
            for name, hooks in destination.route_hooks()
        ]
        labels = {
            name: webhooks.hook_labels(hook.url for hook in hooks) for _, name, hooks in routes
        }
        # Keyed by destination and hook: two destinations may post to one URL.
        hooks = sorted(
            {(name, label) for name, named in labels.items() for label in named.values()}
        )
        try:
            backlog = await self._db.read(self._health.backlog)
            windows = {
                label: await self._db.read(self._health.window, hooks, now - seconds)
                for label, seconds in WINDOWS
            }
            errors = await self._db.read(self._health.last_errors, hooks, now - 86400)
            ordered = bool(self._settings.ordered())
            blocked = await self._db.read(self._db.store.lanes.blocked) if ordered else {}
            horizon = now - self._settings.storage.retention_days * 86400
            lag = await self._db.read(self._db.store.retention.lag, horizon)
            paused = [Pause(*row) for row in await self._db.read(self._db.store.pauses.all)]
        except StoreError as error:
            log.error("admin API: the store is unavailable: %s", str(error).splitlines()[0][:200])
            return error_response("storage_unavailable", "the store is unavailable; retry", 503)
        result = []
        numbers = {
            (route, id(hook)): n
            for numbered in numbered_hooks(self._settings).values()
            for n, (route, hook) in enumerate(numbered, 1)
        }
        # An actions destination is listed as its routes, one per action (destination/action).
        for destination, name, route_hooks in routes:
            pending, oldest = backlog.get(name, (0, None))
            whole = pauses.of_destination(paused, destination.name)
            hook_list = []
            for hook in route_hooks:
                url = labels[name][hook.url]
                number = numbers[(name, id(hook))]
                own = pauses.of_hook(paused, destination.name, number)
                last = errors.get((name, url))
                limit = hook.limit()
                hook_list.append(
                    {
                        "url": url,
                        # Its number in pauses (from 1), and its own pause or disable.
                        "hook": number,
                        "pause": None if own is None else pauses.pause_json(own),
                        "circuit": "open" if self._circuits.is_open(hook.url) else "closed",
                        # Redacted again: attempts written before errors were scrubbed.
                        "lastError": None if last is None else webhooks.redact_urls(last.error),
                        "lastErrorAt": None if last is None else iso(last.at),
                        "window": {
                            label: _window_json(windows[label].get((name, url)))
                            for label, _ in WINDOWS
                        },
                        # Its rate limit, and the rounds it held back (this process's count).
                        "maxPerSecond": None if limit is None else limit[0],
                        "burst": None if limit is None else limit[1],
                        "heldBack": self._metrics.held_back.get((name, url), 0),
                    }
                )
            result.append(
                {
                    "name": name,
                    "configured": True,
                    "backlog": pending,
                    "oldestPendingAt": iso(oldest),
                    # The configured destination's name, which pauses name (an action's
                    # route is listed under destination/action).
                    "destination": destination.name,
                    "pause": None if whole is None else pauses.pause_json(whole),
                    # paused: the whole destination, or every hook; partly: some hooks.
                    "state": _state(whole, [h["pause"] for h in hook_list]),
                    "ordering": destination.ordering.value,
                    # Ordered: its blocked lanes (efd/delivery/lanes.py); else null.
                    "lanes": lanes_json(blocked.get(name))
                    if destination.ordering == "per_user"
                    else None,
                    "hooks": hook_list,
                }
            )
        # Removed from the configuration with deliveries still pending: never sent, until
        # it is configured again or an operator discards them.
        configured = self._settings.route_names()
        for name in sorted(backlog):
            pending, oldest = backlog[name]
            if name not in configured and pending:
                result.append(
                    {
                        "name": name,
                        "configured": False,
                        "backlog": pending,
                        "oldestPendingAt": iso(oldest),
                        "destination": name,
                        "pause": None,
                        "state": "active",
                        "ordering": None,
                        "lanes": None,
                        "hooks": [],
                    }
                )
        return json_response(
            {
                "destinations": result,
                # How far behind retention's purge is (efd/store/retention.py).
                "retention": {
                    "horizon": iso(horizon),
                    "oldestUnpurgedAt": iso(lag.oldest_at),
                    "behindSeconds": round(lag.behind_seconds, 3),
                    "kept": lag.kept,
                },
            }
        )

    # -- recent messages -----------------------------------------------------------------

    async def _recent_messages(self, request: web.Request) -> web.Response:
        server.require_admin(self._settings, request)
        limit = recent_limit(request.query)
        try:
            found = await self._db.read(self._recent.newest, limit)
        except StoreError as error:
            log.error("admin API: the store is unavailable: %s", str(error).splitlines()[0][:200])
            return error_response("storage_unavailable", "the store is unavailable; retry", 503)
        return json_response(
            {
                "messages": [
                    {
                        "source": m.source,
                        "messageId": m.message_id,
                        "type": m.type,
                        "userId": m.user_id,
                        "event": m.event,
                        "receivedAt": iso(m.received_at),
                        "destinations": m.states,
                    }
                    for m in found
                ]
            }
        )

    async def _rates_per_minute(self, request: web.Request) -> web.Response:
        server.require_admin(self._settings, request)
        minutes = whole_number(request.query, "minutes", RATES_MAX, RATES_MAX)
        now = time.time()
        # Whole minutes, the current one last.
        start = (now // 60 - minutes + 1) * 60
        try:
            found = await self._db.read(self._rates.per_minute, start)
        except StoreError as error:
            log.error("admin API: the store is unavailable: %s", str(error).splitlines()[0][:200])
            return error_response("storage_unavailable", "the store is unavailable; retry", 503)
        names = sorted(set(self._settings.route_names()) | set(found))
        return json_response(
            {
                "minutes": [iso(start + 60 * i) for i in range(minutes)],
                "destinations": {
                    name: {
                        status: [
                            found.get(name, {}).get(i, {}).get(status, 0) for i in range(minutes)
                        ]
                        for status in ("delivered", "failed")
                    }
                    for name in names
                },
            }
        )

    # -- stream --------------------------------------------------------------------------

    async def _stream(self, request: web.Request) -> web.StreamResponse:
        server.require_admin(self._settings, request)
        transport = request.transport

        def drop() -> None:
            log.info("admin stream: a subscriber fell behind and was dropped")
            if transport is not None:
                transport.abort()

        subscriber = self._hub.subscribe(drop)
        if subscriber is None:
            return error_response(
                "too_many_streams",
                f"the live stream has as many subscribers as it takes "
                f"({self._hub.max_subscribers}); close one, or retry later",
                503,
            )
        response = web.StreamResponse(
            headers={
                "Content-Type": "text/event-stream",
                "Cache-Control": "no-store",
                "X-Accel-Buffering": "no",  # nginx: pass each event on at once
            }
        )
        response.force_close()  # the connection ends with the stream
        if transport is not None:
            self._streams.add(transport)
        try:
            await response.prepare(request)
            await response.write(b": efd live stream\n\n")
            quiet_since = time.monotonic()
            while (items := await subscriber.next(_CHECK)) is not None:
                if not items:
                    # aiohttp does not cancel a handler whose client left: look for it.
                    if transport is None or transport.is_closing():
                        break
                    if time.monotonic() - quiet_since >= KEEPALIVE:
                        await response.write(b": keepalive\n\n")
                        quiet_since = time.monotonic()
                    continue
                quiet_since = time.monotonic()
                chunk = "".join(f"event: {kind}\ndata: {data}\n\n" for kind, data in items)
                await response.write(chunk.encode())
        except ConnectionError:
            return response  # the subscriber went away, or was dropped
        finally:
            self._hub.unsubscribe(subscriber)
            if transport is not None:
                self._streams.discard(transport)
        with contextlib.suppress(ConnectionError):
            await response.write_eof()  # closed by the daemon's shutdown
        return response

    # -- console -------------------------------------------------------------------------

    async def _console(self, _request: web.Request) -> web.Response:
        if self._settings.server.admin_token is None:
            raise ClientError(
                "admin_api_disabled",
                "the console is off: set [server] admin_token to turn it on",
                status=403,
            )
        response = web.Response(body=_asset("console.html"), content_type="text/html")
        response.headers["Cache-Control"] = "no-store"
        response.headers["Content-Security-Policy"] = (
            "default-src 'self'; script-src 'self'; style-src 'self'; "
            "connect-src 'self'; img-src 'self' data:; frame-ancestors 'none'"
        )
        response.headers["X-Content-Type-Options"] = "nosniff"
        return response

    async def _console_asset(self, request: web.Request) -> web.Response:
        name = request.match_info["asset"]
        if self._settings.server.admin_token is None:
            raise ClientError(
                "admin_api_disabled",
                "the console is off: set [server] admin_token to turn it on",
                status=403,
            )
        content_type = _ASSETS.get(name)
        if content_type is None:
            raise ClientError("not_found", f"no console file {name!r}", status=404)
        response = web.Response(body=_asset(name), content_type=content_type)
        response.headers["Cache-Control"] = "no-store"
        response.headers["X-Content-Type-Options"] = "nosniff"
        return response


def recent_limit(query: MultiMapping[str]) -> int:
    """GET /admin/recent's `limit`: a whole number from 1 to RECENT_MAX; no other key."""
    return whole_number(query, "limit", RECENT_MAX, RECENT_DEFAULT)


def whole_number(query: MultiMapping[str], name: str, most: int, default: int) -> int:
    """The one parameter `name`: a whole number from 1 to `most`, `default` when absent."""
    for key in query:
        if key != name:
            raise ClientError("invalid_field", f"{key} is not a parameter here", field=key)
    if len(query.getall(name, [])) > 1:
        raise ClientError("invalid_field", f"{name} is given more than once", field=name)
    raw = query.get(name)
    if raw is None:
        return default
    if not raw.isascii() or not raw.isdigit() or not 1 <= int(raw) <= most:
        raise ClientError(
            "invalid_field", f"{name} must be a whole number from 1 to {most}", field=name
        )
    return int(raw)
