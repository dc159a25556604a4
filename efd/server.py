"""The HTTP server around efd's routes: the listening socket and what guards it.

- At most `max_connections` connections at once; one more is answered 503 and closed.
- A request whose headers and body have not all arrived within `request_timeout` seconds
  of its first byte is answered 408 and closed, so a slow client holds only its own
  connection. The body is read here, before the route's handler runs, so no handler
  waits on a client.
- Idle keep-alive connections close after `keepalive_timeout` (aiohttp's own timer).
- A client that disconnects mid-request, or speaks something other than HTTP, is logged
  in one line (info, or debug for aiohttp's parser), never as an error with a traceback.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any, cast

from aiohttp import web

log = logging.getLogger(__name__)

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


@dataclass(frozen=True, slots=True)
class Limits:
    max_connections: int
    request_timeout: float
    keepalive_timeout: float
    max_body_bytes: int


def json_response(body: dict[str, Any], status: int = 200) -> web.Response:
    return web.Response(
        body=json.dumps(body).encode(), status=status, content_type="application/json"
    )


def error_response(code: str, message: str, status: int) -> web.Response:
    return json_response({"success": False, "code": code, "message": message}, status)


def _raw_answer(status: str, code: str, message: str) -> bytes:
    """A complete HTTP/1.1 answer that closes the connection, for when no request (or no
    complete one) exists to answer through aiohttp."""
    body = json.dumps({"success": False, "code": code, "message": message}).encode()
    head = (
        f"HTTP/1.1 {status}\r\nContent-Type: application/json\r\n"
        f"Content-Length: {len(body)}\r\nConnection: close\r\n\r\n"
    )
    return head.encode("ascii") + body


class _Connection(asyncio.Protocol):
    """Stands between the transport and aiohttp's protocol for one connection: starts a
    request's clock at its first byte, and answers 408 when the headers are still
    incomplete at the deadline (the body's share of the deadline is the middleware's)."""

    def __init__(self, listener: Listener, inner: asyncio.Protocol) -> None:
        self._listener = listener
        self._inner = inner
        self._transport: asyncio.Transport | None = None
        self._timer: asyncio.TimerHandle | None = None
        self._deadline: float | None = None
        self._handling = False

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        # uvloop's transports are not asyncio.Transport subclasses, only alike.
        transport = cast(asyncio.Transport, transport)
        self._transport = transport
        self._listener.connections[transport] = self
        self._inner.connection_made(transport)

    def data_received(self, data: bytes) -> None:
        if self._deadline is None and not self._handling:
            loop = asyncio.get_running_loop()
            self._deadline = loop.time() + self._listener.limits.request_timeout
            self._timer = loop.call_at(self._deadline, self._expired)
        self._inner.data_received(data)

    def eof_received(self) -> bool | None:
        return self._inner.eof_received()

    def pause_writing(self) -> None:
        self._inner.pause_writing()

    def resume_writing(self) -> None:
        self._inner.resume_writing()

    def connection_lost(self, exc: Exception | None) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        if self._transport is not None:
            self._listener.connections.pop(self._transport, None)
        self._inner.connection_lost(exc)

    def _expired(self) -> None:
        self._timer = None
        if self._handling or self._transport is None or self._transport.is_closing():
            return
        peer = self._transport.get_extra_info("peername")
        log.info("request from %s timed out before its headers arrived; closing", peer)
        self._listener.timed_out += 1
        self._transport.write(
            _raw_answer(
                "408 Request Timeout",
                "request_timeout",
                f"the request did not arrive within {self._listener.limits.request_timeout:g} s",
            )
        )
        self._transport.close()

    def request_started(self) -> float:
        """The headers are in: the body must follow by the returned (loop) time."""
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        self._handling = True
        deadline = self._deadline
        if deadline is None:  # a pipelined request, already buffered
            deadline = asyncio.get_running_loop().time() + self._listener.limits.request_timeout
        return deadline

    def request_finished(self) -> None:
        self._handling = False
        self._deadline = None


class _Refuse(asyncio.Protocol):
    """Answers a connection over the limit with 503 and closes it."""

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        transport = cast(asyncio.Transport, transport)
        transport.write(
            _raw_answer(
                "503 Service Unavailable",
                "too_many_connections",
                "the server has as many connections as it takes; retry shortly",
            )
        )
        transport.close()


class Listener:
    """The listening socket: aiohttp's protocol behind the connection limit and the
    request clock."""

    def __init__(self, limits: Limits) -> None:
        self._runner: web.AppRunner | None = None
        self.limits = limits
        self.connections: dict[asyncio.Transport, _Connection] = {}
        self.refused = 0  # connections turned away at the limit
        self.timed_out = 0  # requests answered 408
        self._last_refusal_log = 0.0
        self._server: asyncio.Server | None = None

    def _protocol(self) -> asyncio.Protocol:
        if len(self.connections) >= self.limits.max_connections:
            self.refused += 1
            now = time.monotonic()
            if now - self._last_refusal_log >= 10.0:
                self._last_refusal_log = now
                log.warning(
                    "refusing connections: %d open, the limit ([server] max_connections); "
                    "%d refused so far",
                    len(self.connections),
                    self.refused,
                )
            return _Refuse()
        server = self._runner.server if self._runner is not None else None
        assert server is not None, "Listener.start() was not awaited"
        return _Connection(self, server())

    async def start(self, runner: web.AppRunner, host: str, port: int) -> int:
        """Listen for `runner` (set up, with `middleware` outermost in its application);
        return the bound port (useful with port 0)."""
        self._runner = runner
        loop = asyncio.get_running_loop()
        self._server = await loop.create_server(
            self._protocol, host, port, reuse_address=True, backlog=1024
        )
        return int(self._server.sockets[0].getsockname()[1])

    async def close(self) -> None:
        """Stop accepting; connections already open finish through the runner's cleanup."""
        if self._server is not None:
            self._server.close()
            self._server = None

    @web.middleware
    async def middleware(self, request: web.Request, handler: Handler) -> web.StreamResponse:
        connection = self.connections.get(request.transport)  # type: ignore[arg-type]
        loop = asyncio.get_running_loop()
        if connection is not None:
            deadline = connection.request_started()
        else:
            deadline = loop.time() + self.limits.request_timeout
        try:
            try:
                if request.body_exists:
                    if (request.content_length or 0) > self.limits.max_body_bytes:
                        raise web.HTTPRequestEntityTooLarge(
                            max_size=self.limits.max_body_bytes,
                            actual_size=request.content_length or 0,
                        )
                    async with asyncio.timeout_at(deadline):
                        await request.read()  # kept by aiohttp: the handler's read() is free
            except TimeoutError:
                self.timed_out += 1
                log.info("request from %s: its body did not arrive in time", request.remote)
                response = error_response(
                    "request_timeout",
                    f"the request did not arrive within {self.limits.request_timeout:g} s",
                    408,
                )
                response.force_close()
                return response
            except web.HTTPRequestEntityTooLarge:
                response = error_response(
                    "request_too_large",
                    f"a request body may be at most {self.limits.max_body_bytes} bytes",
                    400,
                )
                response.force_close()
                return response
            return await handler(request)
        except ConnectionResetError as error:
            # Nobody is left to answer: say so once, quietly.
            log.info(
                "%s %s from %s: the client went away (%s)",
                request.method,
                request.path,
                request.remote,
                error,
            )
            return web.Response(status=400)
        finally:
            if connection is not None:
                connection.request_finished()


class OneLineParseErrors(logging.Filter):
    """aiohttp logs a request it cannot parse (not HTTP, a TLS hello on the plain port) at
    debug with a traceback. Keep the line, drop the traceback."""

    def filter(self, record: logging.LogRecord) -> bool:
        if record.levelno < logging.WARNING and record.exc_info:
            error = record.exc_info[1]
            reason = " ".join(str(error).split()) if error is not None else ""
            record.msg = f"{record.getMessage()}: {type(error).__name__}: {reason}"
            record.args = None
            record.exc_info = None
            record.exc_text = None
        return True


def quiet_parse_errors() -> None:
    logger = logging.getLogger("aiohttp.server")
    if not any(isinstance(f, OneLineParseErrors) for f in logger.filters):
        logger.addFilter(OneLineParseErrors())
