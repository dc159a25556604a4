"""The admin API: what happened to a message, which deliveries match, send them again.

    GET  /admin/messages/{source}/{messageId}   the message, its deliveries and attempts
    GET  /admin/deliveries?…                    filtered, newest first, by cursor
    POST /admin/redrive                         failed/expired -> pending, fresh window
    POST /admin/replay                          a message again, as new deliveries
    POST /admin/discard                         pending -> discarded, for a destination
                                                no longer configured
    POST /admin/destinations/{name}/pause       send a destination, or one hook, nothing
    POST /admin/destinations/{name}/resume      send to it again; its deliveries due now
    GET  /openapi.json                          the API's description (no token needed)

Bearer [server] admin_token (server.require_admin). The rules and the JSON shapes are
efd/operations/selection.py's, shared with the CLI; the SQL is efd/store/operations.py's.
A redrive or a replay wakes this process's dispatcher at once (PostgreSQL's NOTIFY wakes
the others).

A redrive reads the ids it moves, then moves them REDRIVE_CHUNK at a time, each chunk its
own job for the writer thread: ingestion's commits run between them, so a redrive of
millions never stalls it. The answer counts every delivery moved; should the store fail
part-way, the 503 says how many were moved before it did.
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Awaitable, Callable
from typing import Any

from aiohttp import web

from efd import __version__, jsonjs
from efd.config import Settings
from efd.config.models import HookConfig
from efd.delivery.pausing import Pause, target_name
from efd.errors import ClientError, StoreError
from efd.http import openapi, server
from efd.http.responses import error_response, json_response
from efd.operations import events, pauses, selection
from efd.operations.events import Sink
from efd.settings import Current
from efd.store import operations
from efd.store.operations import Operations
from efd.store.runner import AsyncStore

log = logging.getLogger(__name__)

# The bodies are a handful of fields of at most selection.MAX_TEXT characters each, which
# JSON may escape to twelve bytes a character.
MAX_BODY_BYTES = 64 * 1024


def numbered_hooks(settings: Settings) -> dict[str, list[tuple[str, HookConfig]]]:
    """Each configured destination's hooks as pauses number them (from 1): (route name,
    hook), its hooks in order, or an actions destination's actions."""
    return {
        d.name: [(name, hook) for name, hooks in d.route_hooks() for hook in hooks]
        for d in settings.destinations
    }


def _unavailable(error: StoreError) -> web.Response:
    log.error("admin API: the store is unavailable: %s", str(error).splitlines()[0][:200])
    return error_response("storage_unavailable", "the store is unavailable; retry", 503)


class AdminApi:
    """The /admin/* operator endpoints (see the module's description) and /openapi.json.

    Owns nothing but the rendered OpenAPI document: it reads and moves deliveries through
    OperationsStore and wakes the dispatcher. May not send, and may not change a delivery
    another process holds a lease on (the store's fences see to it).
    """

    def __init__(
        self,
        settings: Current[Settings],
        *,
        db: AsyncStore,
        operations: Operations,
        on_due: Callable[[], None],
        on_paused: Callable[[], Awaitable[None]] | None = None,
        notices: Sink | None = None,
    ) -> None:
        self._current = settings
        self._notices = notices  # hook.paused, hook.resumed (efd/operations/events.py)
        self._db = db
        self._ops = operations
        self._on_due = on_due  # new work is due now: the dispatcher's notify
        # A pause or resume was written: this process's dispatcher applies it at once.
        self._on_paused = on_paused
        self._openapi = json.dumps(openapi.document(__version__)).encode()

    @property
    def _settings(self) -> Settings:
        return self._current.value

    def routes(self) -> list[web.RouteDef]:
        return [
            web.get("/admin/messages/{source}/{message_id}", self._admin(self._message)),
            web.get("/admin/deliveries", self._admin(self._deliveries)),
            web.post("/admin/redrive", self._admin(self._redrive)),
            web.post("/admin/replay", self._admin(self._replay)),
            web.post("/admin/discard", self._admin(self._discard)),
            web.post("/admin/destinations/{name}/pause", self._admin(self._pause)),
            web.post("/admin/destinations/{name}/resume", self._admin(self._resume)),
            web.get("/openapi.json", self._openapi_json),
        ]

    async def _openapi_json(self, _request: web.Request) -> web.Response:
        return web.Response(body=self._openapi, content_type="application/json")

    def _admin(
        self, handler: Callable[[web.Request], Awaitable[web.Response]]
    ) -> Callable[[web.Request], Awaitable[web.Response]]:
        async def checked(request: web.Request) -> web.Response:
            server.require_admin(self._settings, request)
            try:
                return await handler(request)
            except StoreError as error:
                return _unavailable(error)

        return checked

    @property
    def _window(self) -> float:
        return self._settings.delivery.retry_window_seconds

    @property
    def _ordered(self) -> frozenset[str]:
        return self._settings.ordered()

    @property
    def _configured(self) -> set[str]:
        return self._settings.route_names()

    async def _body(self, request: web.Request) -> Any:
        raw = await server.read_body(request, MAX_BODY_BYTES)
        if not raw.strip():
            return {}
        try:
            return jsonjs.loads(raw)
        except jsonjs.TooDeep:
            raise ClientError("too_deep", "the body is nested too deeply", field="body") from None
        except jsonjs.OutOfRange as error:
            field = jsonjs.field_name(error.path) or "body"
            raise ClientError("invalid_field", str(error), field=field) from None
        except (ValueError, UnicodeDecodeError) as error:
            raise ClientError(
                "invalid_json", f"the body is not valid JSON: {error}", field="body"
            ) from None

    async def _message(self, request: web.Request) -> web.Response:
        source = selection.text(request.match_info["source"], "source")
        message_id = selection.text(request.match_info["message_id"], "messageId")
        found = await self._db.read(self._ops.message, source, message_id)
        if found is None:
            raise ClientError(
                "not_found",
                f"no message {message_id!r} from source {source!r} is stored",
                status=404,
            )
        return json_response(selection.message_json(found, self._window))

    async def _deliveries(self, request: web.Request) -> web.Response:
        params: dict[str, str] = {}
        for key, value in request.query.items():
            if key in params:
                raise ClientError("invalid_field", f"{key} is given more than once", field=key)
            params[key] = value
        query, limit, cursor = selection.list_query(params, time.time())
        found = await self._db.read(self._ops.deliveries, query, limit=limit + 1, before=cursor)
        return json_response(selection.page_json(found, limit, self._window))

    async def _redrive(self, request: web.Request) -> web.Response:
        query, dry_run = selection.redrive_query(
            await self._body(request), time.time(), self._configured
        )
        if dry_run:
            return json_response({"count": await self._db.read(self._ops.count_redrivable, query)})
        ids = await self._db.read(self._ops.redrivable_ids, query)
        size, now, count = operations.REDRIVE_CHUNK, time.time(), 0
        try:
            for start in range(0, len(ids), size):
                moved = await self._db.write(
                    self._ops.redrive_ids, query, ids[start : start + size], now
                )
                count += moved
                if moved:
                    self._on_due()  # the first chunks go out while the rest are moved
        except StoreError as error:
            log.error(
                "redrive stopped after %d deliveries: the store is unavailable: %s",
                count,
                str(error).splitlines()[0][:200],
            )
            return json_response(
                {
                    "success": False,
                    "code": "storage_unavailable",
                    "message": f"the store is unavailable; {count} deliveries were redriven "
                    "before it failed: redrive again to move the rest",
                    "count": count,
                },
                503,
            )
        if count:
            log.info("redrive: %d deliveries are due again", count)
        return json_response({"count": count})

    async def _discard(self, request: web.Request) -> web.Response:
        query, dry_run = selection.discard_query(
            await self._body(request), time.time(), self._configured
        )
        if dry_run:
            return json_response({"count": await self._db.read(self._ops.count_discardable, query)})
        count = 0
        now = time.time()
        while marked := await self._db.write(
            self._ops.discard, query, now, selection.DISCARD_CHUNK
        ):
            count += marked
            if marked < selection.DISCARD_CHUNK:
                break
        if count:
            log.info(
                "discard: %d pending deliveries to %s, which is not configured, are discarded",
                count,
                query.destinations[0],
            )
        return json_response({"count": count})

    def _target(
        self, name: str, payload: Any, *, resume: bool
    ) -> tuple[str, int | None, str | None]:
        counts = {d: len(h) for d, h in numbered_hooks(self._settings).items()}
        return pauses.target(name, payload, counts, resume=resume)

    async def _pause(self, request: web.Request) -> web.Response:
        destination, hook, reason = self._target(
            request.match_info["name"], await self._body(request), resume=False
        )
        row = Pause(
            *await self._db.write(
                self._db.store.pauses.pause, destination, hook, reason, time.time()
            )
        )
        log.info("pause: %s, by the admin API%s", _named(row), f" ({reason})" if reason else "")
        if self._on_paused is not None:
            await self._on_paused()
        if self._notices is not None:
            self._notices.emit(
                events.hook_paused(
                    destination,
                    hook,
                    reason=row.reason,
                    since=row.since,
                    by=events.BY_ADMIN_API,
                    at=time.time(),
                )
            )
        return json_response({"pause": pauses.pause_json(row)})

    async def _resume(self, request: web.Request) -> web.Response:
        destination, hook, _ = self._target(
            request.match_info["name"], await self._body(request), resume=True
        )
        routes = numbered_hooks(self._settings)[destination]
        names = list(dict.fromkeys(name for name, _ in routes))
        found, due = await self._db.write(
            self._db.store.pauses.resume, destination, hook, names, time.time()
        )
        if found is not None:
            log.info(
                "resume: %s, by the admin API; %d deliveries due now", _named(Pause(*found)), due
            )
            if self._on_paused is not None:
                await self._on_paused()
            self._on_due()
            if self._notices is not None:
                lifted = Pause(*found)
                self._notices.emit(
                    events.hook_resumed(
                        destination,
                        hook,
                        was=lifted.kind,
                        since=lifted.since,
                        due=due,
                        by=events.BY_ADMIN_API,
                        at=time.time(),
                    )
                )
        return json_response(
            {
                "resumed": None if found is None else pauses.pause_json(Pause(*found)),
                "due": due,
            }
        )

    async def _replay(self, request: web.Request) -> web.Response:
        source, message_id, destination = selection.replay_request(await self._body(request))
        found = await self._db.read(self._ops.replay_sources, source, message_id)
        if found is None:
            raise ClientError(
                "not_found",
                f"no message {message_id!r} from source {source!r} is stored",
                status=404,
            )
        pk, kept, originals = found
        if not kept:
            raise ClientError(
                "message_purged",
                "a deletion request purged this message's payload; it cannot be sent again",
                status=409,
            )
        targets = selection.replay_targets(originals, destination, self._configured)
        created = await self._db.write(self._ops.replay, pk, targets, time.time())
        if created is None:
            raise ClientError(
                "not_found",
                f"no message {message_id!r} from source {source!r} is stored",
                status=404,
            )
        log.info(
            "replay of message %s from %s to %s",
            message_id,
            source,
            ", ".join(name for _, name in created),
        )
        self._on_due()
        # Sent at once, not through its lane: out of order on an ordered destination.
        return json_response(selection.replay_json(created, self._ordered), 201)


def _named(pause: Pause) -> str:
    return target_name(pause.destination, pause.hook)
