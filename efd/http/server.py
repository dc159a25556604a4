"""The HTTP server around efd's routes: the listening socket and what guards it.

No client may hold the doors shut: every connection is bounded in number and in time, in
both directions.

- At most `max_connections` connections at once; one more is answered 503 and closed.
- At most `max_per_address` of them from one client address (an IPv6 client counts by its
  /64, as it is handed a whole /64); one more from that address is answered 503 and closed,
  so that one client cannot take every connection.
- A request whose headers and body have not all arrived within `request_timeout` seconds
  of its first byte is answered 408 and closed (checked about once a second), so a slow
  client holds only its own connection. Handlers read bodies through `read_body`, which
  holds them to that deadline.
- An answer must be taken as it is written: when the client leaves efd holding bytes of an
  answer that the kernel's buffers no longer take (it does not read), and has not taken
  them `request_timeout` seconds later, the connection is closed (aborted: nothing more is
  sent). A stalled answer is found when the transport pauses writing or by the same sweep.
- At most `MAX_PIPELINED` requests in a row on one connection are answered without the
  client waiting for an answer first (HTTP/1.1 pipelining); the answer to the last of them
  closes the connection (`Connection: close`), and the client sends the rest again on a new
  one, as RFC 9112 asks of pipelining clients. Together with the deadline above, this bounds
  how long and how much a client that does not read can keep a connection busy.
- Idle keep-alive connections close after `keepalive_timeout` (aiohttp's own timer).
- A client that disconnects mid-request, speaks something other than HTTP, or sends a
  malformed request (answered 400 by aiohttp's parser) is logged in one line (info, or
  debug where aiohttp logs at debug), never as an error with a traceback.
- Every answer names the server as `efd/<version>` (SERVER), not Python's and aiohttp's
  versions.
"""

from __future__ import annotations

import asyncio
import hmac
import ipaddress
import json
import logging
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol, cast

from aiohttp import web, web_response
from aiohttp.http_exceptions import HttpProcessingError

from efd import __version__
from efd.errors import ClientError
from efd.http.responses import client_error, error_response
from efd.loop import Worker

if TYPE_CHECKING:
    from efd.config import Settings

log = logging.getLogger(__name__)

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]

# Requests answered in a row on one connection while the next was already sent; the last
# answer closes it. Clients that pipeline at all send a few; one that never reads sends all.
MAX_PIPELINED = 16
_LOG_EVERY = 10.0  # seconds between lines about refused or closed connections
SERVER = f"efd/{__version__}"  # the Server header of every answer


class Counters(Protocol):
    """Where the listener counts what it turned away (efd.observe.metrics.Metrics)."""

    connections_refused: int
    requests_timed_out: int
    responses_timed_out: int


@dataclass(frozen=True, slots=True)
class Limits:
    max_connections: int
    request_timeout: float
    keepalive_timeout: float
    max_body_bytes: int
    max_per_address: int = 0  # 0: no bound beyond max_connections


def require_admin(settings: Settings, request: web.Request) -> None:
    """Returns when the request carries the admin token as its bearer; otherwise raises the
    refusal: 403 while no [server] admin_token is configured (the admin endpoints are off),
    401 for a missing or wrong token. The regulations API, the admin API and the console
    share it."""
    token = settings.server.admin_token
    if token is None:
        raise ClientError(
            "admin_api_disabled",
            "the admin API is off: set [server] admin_token to turn it on",
            status=403,
        )
    scheme, _, given = request.headers.get("Authorization", "").partition(" ")
    expected = token.get_secret_value().encode("utf-8")
    # Constant time: the comparison must not tell how much of a guess was right.
    if scheme.lower() != "bearer" or not hmac.compare_digest(
        given.strip().encode("utf-8", "surrogateescape"), expected
    ):
        raise ClientError(
            "unauthorized",
            "a valid bearer token (admin_token) is needed",
            status=401,
            challenge="Bearer",
        )


def _raw_answer(status: str, code: str, message: str) -> bytes:
    """A complete HTTP/1.1 answer that closes the connection, for when no request (or no
    complete one) exists to answer through aiohttp."""
    body = json.dumps({"success": False, "code": code, "message": message}).encode()
    head = (
        f"HTTP/1.1 {status}\r\nServer: {SERVER}\r\nContent-Type: application/json\r\n"
        f"Content-Length: {len(body)}\r\nConnection: close\r\n\r\n"
    )
    return head.encode("ascii") + body


def address_key(peer: Any) -> str | None:
    """Whom a connection counts against for the per-address bound: its IPv4 address, or
    the /64 of its IPv6 address (an IPv4-mapped one counts as IPv4); None when the peer
    has no IP address."""
    if not isinstance(peer, tuple) or not peer or not isinstance(peer[0], str):
        return None
    host = peer[0]
    try:
        address = ipaddress.ip_address(host)
    except ValueError:
        return host
    if isinstance(address, ipaddress.IPv6Address):
        if address.ipv4_mapped is not None:
            return str(address.ipv4_mapped)
        return str(ipaddress.IPv6Network((int(address), 64), strict=False))
    return host


class _Connection(asyncio.Protocol):
    """Stands between the transport and aiohttp's protocol for one connection: notes when a
    request's first byte arrives, and answers 408 when the headers are still incomplete at
    the deadline (the body's share of it is read_body's); notes when an answer stalls, and
    closes the connection when it stays stalled past the deadline. The Listener's sweep
    checks the deadlines: one timer for all connections, not one per request."""

    def __init__(self, listener: Listener, make_inner: Callable[[], asyncio.Protocol]) -> None:
        self._listener = listener
        self._make_inner = make_inner
        self._inner: asyncio.Protocol  # aiohttp's, once admitted; else a refusal
        self._transport: asyncio.Transport | None = None
        self._address: str | None = None
        self.started: float | None = None  # loop time of the current request's first byte
        self._handling = False
        self.in_a_row = 0  # requests answered in a row, each sent before the last was answered
        self.stalled_since: float | None = None  # loop time an answer stopped moving

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        # uvloop's transports are not asyncio.Transport subclasses, only alike.
        transport = cast(asyncio.Transport, transport)
        listener = self._listener
        address = address_key(transport.get_extra_info("peername"))
        refusal = listener.admit(address)
        if refusal is not None:
            self._inner = _Refuse(refusal)
            self._inner.connection_made(transport)
            return
        self._address = address
        self._transport = transport
        listener.connections[transport] = self
        self._inner = self._make_inner()
        self._inner.connection_made(transport)

    def data_received(self, data: bytes) -> None:
        if self.started is None and not self._handling:
            self.started = self._listener.loop.time()
        self._inner.data_received(data)

    def eof_received(self) -> bool | None:
        return self._inner.eof_received()

    def pause_writing(self) -> None:
        if self.stalled_since is None:
            self.stalled_since = self._listener.loop.time()
        self._inner.pause_writing()

    def resume_writing(self) -> None:
        self._inner.resume_writing()

    def connection_lost(self, exc: Exception | None) -> None:
        if self._transport is not None:
            self._listener.connections.pop(self._transport, None)
            self._listener.release(self._address)
        self._inner.connection_lost(exc)

    def expire_if_late(self, now: float) -> None:
        transport = self._transport
        if transport is None:
            return
        timeout = self._listener.limits.request_timeout
        # An answer waits on the client while bytes remain that the kernel did not take.
        # The clock runs until none remain, not until the transport resumes: a client that
        # reads a trickle, just enough to resume it, still has to take the whole answer.
        if transport.get_write_buffer_size():
            if self.stalled_since is None:
                self.stalled_since = now
            elif now - self.stalled_since >= timeout:
                self._listener.answer_not_taken(transport, now - self.stalled_since)
                transport.abort()
                return
        else:
            self.stalled_since = None
        started = self.started
        if started is None or self._handling or now - started < timeout or transport.is_closing():
            return
        log.info(
            "request from %s timed out before its headers arrived; closing",
            transport.get_extra_info("peername"),
        )
        self._listener.counters.requests_timed_out += 1
        transport.write(
            _raw_answer(
                "408 Request Timeout",
                "request_timeout",
                f"the request did not arrive within {timeout:g} s",
            )
        )
        transport.close()

    def request_started(self) -> float:
        """The headers are in: the body must follow by the returned (loop) time."""
        self._handling = True
        started = self.started
        if started is None:  # pipelined: sent before the answer to the one before began
            self.in_a_row += 1
            started = self._listener.loop.time()
        else:
            self.in_a_row = 1
        return started + self._listener.limits.request_timeout

    def request_finished(self) -> None:
        self._handling = False
        self.started = None


class _Refuse(asyncio.Protocol):
    """Answers a connection over a limit with 503 and closes it."""

    def __init__(self, message: str) -> None:
        self._message = message

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        transport = cast(asyncio.Transport, transport)
        transport.write(
            _raw_answer("503 Service Unavailable", "too_many_connections", self._message)
        )
        transport.close()


class Listener:
    """The listening socket: aiohttp's protocol behind the connection limit and the
    request clock."""

    def __init__(self, limits: Limits, counters: Counters) -> None:
        self._runner: web.AppRunner | None = None
        self.limits = limits
        self.connections: dict[asyncio.Transport, _Connection] = {}
        self.by_address: dict[str, int] = {}  # open connections per address_key
        self.counters = counters
        self._last_refusal_log = 0.0
        self._last_address_log = 0.0
        self._last_stall_log = 0.0
        self._server: asyncio.Server | None = None
        self._sweeper: Worker | None = None
        self.loop = asyncio.get_event_loop()

    def _protocol(self) -> asyncio.Protocol:
        server = self._runner.server if self._runner is not None else None
        assert server is not None, "Listener.start() was not awaited"
        return _Connection(self, server)

    def admit(self, address: str | None) -> str | None:
        """Count one more connection (from `address`), or say why it is refused. Counted
        as each connection is made, not as its protocol is created: several connections
        accepted at once are all created before the first is made."""
        if len(self.connections) >= self.limits.max_connections:
            self.counters.connections_refused += 1
            now = time.monotonic()
            if now - self._last_refusal_log >= _LOG_EVERY:
                self._last_refusal_log = now
                log.warning(
                    "refusing connections: %d open, the limit ([server] max_connections); "
                    "%d refused so far",
                    len(self.connections),
                    self.counters.connections_refused,
                )
            return "the server has as many connections as it takes; retry shortly"
        if address is None:
            return None
        held = self.by_address.get(address, 0)
        bound = self.limits.max_per_address
        if bound and held >= bound:
            self.counters.connections_refused += 1
            now = time.monotonic()
            if now - self._last_address_log >= _LOG_EVERY:
                self._last_address_log = now
                log.warning(
                    "refusing connections from %s: it holds %d, the limit for one address "
                    "([server] max_connections_per_address); %d refused so far in all",
                    address,
                    held,
                    self.counters.connections_refused,
                )
            return "this address holds as many connections as one address may; retry shortly"
        self.by_address[address] = held + 1
        return None

    def release(self, address: str | None) -> None:
        if address is None:
            return
        held = self.by_address.get(address, 0) - 1
        if held > 0:
            self.by_address[address] = held
        else:
            self.by_address.pop(address, None)

    def answer_not_taken(self, transport: asyncio.Transport, seconds: float) -> None:
        self.counters.responses_timed_out += 1
        now = time.monotonic()
        if now - self._last_stall_log >= _LOG_EVERY:
            self._last_stall_log = now
            log.info(
                "closing the connection from %s: it left its answer untaken for %.0f s "
                "(request_timeout_seconds); %d closed so far",
                transport.get_extra_info("peername"),
                seconds,
                self.counters.responses_timed_out,
            )

    async def start(self, runner: web.AppRunner, host: str, port: int) -> int:
        """Listen for `runner` (set up, its routes guarded and `response_prepared` among
        its application's on_response_prepare); return the bound port (for port 0)."""
        self._runner = runner
        self.loop = asyncio.get_running_loop()
        self._server = await self.loop.create_server(
            self._protocol, host, port, reuse_address=True, backlog=1024
        )
        self._sweeper = Worker(self._sweep, name="efd-request-clock")
        self._sweeper.start()
        return int(self._server.sockets[0].getsockname()[1])

    async def _sweep(self) -> float:
        """Close the connections past their deadline; the wait until the next look."""
        now = self.loop.time()
        for connection in list(self.connections.values()):
            connection.expire_if_late(now)
        return min(1.0, self.limits.request_timeout / 4)

    async def close(self) -> None:
        """Stop accepting; connections already open finish through the runner's cleanup."""
        if self._server is not None:
            self._server.close()
            self._server = None
        if self._sweeper is not None:
            await self._sweeper.stop()
            self._sweeper = None

    def guard(self, handler: Handler) -> Handler:
        """`handler` with the request clock: it runs once the headers are in, and its
        body must arrive by the request's deadline (`read_body`). A `ClientError` raised
        below it is answered here, the one place (responses.client_error). Every route is
        guarded (a wrapper rather than an aiohttp middleware, which costs several times
        more)."""

        async def guarded(request: web.Request) -> web.StreamResponse:
            connection = self.connections.get(request.transport)  # type: ignore[arg-type]
            if connection is not None:
                request[_DEADLINE] = connection.request_started()
            else:
                request[_DEADLINE] = self.loop.time() + self.limits.request_timeout
            try:
                response = await handler(request)
            except ClientError as error:
                # The client's mistake: answered, and the connection serves on.
                response = client_error(error)
            except _BodyTimeout:
                self.counters.requests_timed_out += 1
                log.info("request from %s: its body did not arrive in time", request.remote)
                return _closing(
                    error_response(
                        "request_timeout",
                        f"the request did not arrive within {self.limits.request_timeout:g} s",
                        408,
                    )
                )
            except _BodyTooLarge as error:
                return _closing(
                    client_error(
                        ClientError(
                            "request_too_large", f"a request body may be at most {error} bytes"
                        )
                    )
                )
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
            if connection is not None and connection.in_a_row >= MAX_PIPELINED:
                response.force_close()  # the client sends the rest on a new connection
            return response

        return guarded

    def guard_routes(self, routes: list[web.RouteDef]) -> list[web.RouteDef]:
        return [web.RouteDef(r.method, r.path, self.guard(r.handler), r.kwargs) for r in routes]

    async def response_prepared(self, request: web.Request, _response: web.StreamResponse) -> None:
        """(on_response_prepare) The request is over: the connection's clock starts again
        at the next request's first byte."""
        connection = self.connections.get(request.transport)  # type: ignore[arg-type]
        if connection is not None:
            connection.request_finished()


def _closing(response: web.StreamResponse) -> web.StreamResponse:
    """`response`, closing the connection after it: the body was not read to its end."""
    response.force_close()
    return response


class _BodyTimeout(Exception):
    pass


class _BodyTooLarge(Exception):
    pass


_DEADLINE = web.RequestKey("efd.deadline", float)


async def read_body(request: web.Request, max_bytes: int) -> bytes:
    """The request's whole body, arrived by its deadline (set by `Listener.guard`), at most
    `max_bytes` (and the application's client_max_size); otherwise the guard answers 408
    or 400."""
    if not request.body_exists:
        return b""
    if (request.content_length or 0) > max_bytes:
        raise _BodyTooLarge(max_bytes)
    try:
        if request.content.is_eof():  # most bodies arrive with their headers: no clock
            return await request.read()
        async with asyncio.timeout_at(request[_DEADLINE]):
            return await request.read()
    except TimeoutError:
        raise _BodyTimeout from None
    except web.HTTPRequestEntityTooLarge:
        raise _BodyTooLarge(max_bytes) from None


class OneLineParseErrors(logging.Filter):
    """aiohttp logs a request it cannot parse with a traceback: at debug when the first
    bytes are not HTTP (a TLS hello on the plain port), as an error for every other
    malformed request (an over-long line, too many headers, a bad chunk, ...). Each is the
    client's mistake, answered 400 by aiohttp: log it at info, in one line."""

    def filter(self, record: logging.LogRecord) -> bool:
        error = record.exc_info[1] if record.exc_info else None
        if isinstance(error, HttpProcessingError) and record.levelno >= logging.WARNING:
            if not logging.getLogger(record.name).isEnabledFor(logging.INFO):
                return False
            record.levelno, record.levelname = logging.INFO, logging.getLevelName(logging.INFO)
            peer = record.args[0] if isinstance(record.args, tuple) and record.args else "?"
            # Its lines joined, without the caret that points into the line above it.
            lines = (line.strip() for line in str(error.message).splitlines())
            reason = " ".join(line for line in lines if line not in ("", "^"))[:300]
            record.msg = "malformed request from %s refused with %s: %s: %s"
            record.args = (peer, error.code, type(error).__name__, reason)
            record.exc_info = None
            record.exc_text = None
        elif record.levelno < logging.WARNING and record.exc_info:
            reason = " ".join(str(error).split()) if error is not None else ""
            record.msg = f"{record.getMessage()}: {type(error).__name__}: {reason}"
            record.args = None
            record.exc_info = None
            record.exc_text = None
        return True


def name_the_server() -> None:
    """Make aiohttp's default Server header efd's. aiohttp has no setting for it, and its
    own answers to requests it cannot parse run no application signal, so its module
    default is the one place that reaches every answer."""
    web_response.SERVER_SOFTWARE = SERVER  # type: ignore[attr-defined]  # not re-exported


def quiet_parse_errors() -> None:
    logger = logging.getLogger("aiohttp.server")
    if not any(isinstance(f, OneLineParseErrors) for f in logger.filters):
        logger.addFilter(OneLineParseErrors())
