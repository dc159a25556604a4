"""efd's HTTP/1.1 client for webhook POSTs and actions' PUTs and PATCHes: keep-alive
connections pooled per receiver and client certificate, the address guard at connect, one
deadline for the whole exchange.

Written here rather than taken from aiohttp because a request with a body is all delivery
sends, and aiohttp's general client (redirects, cookies, proxies, multidicts, streams) costs
several times the CPU of the bytes it moves (docs/decisions.md). What the wire format says
lives in efd/delivery/wire.py (the request) and efd/delivery/reader.py (the answer); this
module does the I/O.

Through an HTTP proxy (`delivery.proxy`, the rules in efd/delivery/proxyrules.py), an HTTPS
receiver is reached through a CONNECT tunnel with TLS to the receiver inside it, and a plain
HTTP one with the request in absolute form; the receiver's name is still judged by the address
guard first, and the proxy's own refusals are the error class `proxy`.

Every failure is a `RequestFailed` carrying the error class of docs/delivery.md; nothing
else escapes `Client.post` except cancellation and bugs.
"""

from __future__ import annotations

import asyncio
import base64
import socket
import ssl
from collections.abc import Awaitable, Callable, Coroutine, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, cast

from yarl import URL

from efd.delivery import addresses, connect, netguard, proxyrules
from efd.delivery.addresses import AddressInfo
from efd.delivery.proxyrules import Proxy
from efd.delivery.reader import Data, End, Head, ResponseReader
from efd.delivery.wire import BadHeader, request_head

GUARD_TAG = "efd address guard"
KEEPALIVE = 15.0  # seconds an idle connection is kept for the next POST (aiohttp's default)
DNS_TTL = 30.0  # seconds a name's addresses are reused before it is resolved again
_EARLY = "the receiver sent bytes before the request was written"


class RequestFailed(Exception):
    """The POST did not get a complete answer; `error_class` as in the attempts table."""

    def __init__(self, error_class: str, message: str) -> None:
        super().__init__(message)
        self.error_class = error_class
        self.message = message


@dataclass(slots=True)
class Answer:
    status: int
    retry_after: str | None  # the Retry-After header as sent, if any
    head: bytes  # the first bytes of the body, as many as the client keeps


@dataclass(frozen=True, slots=True)
class _Target:
    """What a hook URL means to the client, worked out once per URL."""

    tls: bool
    host: str  # what is resolved and connected to (IDNA, no brackets)
    port: int
    host_header: str
    path: str  # the request target: path and query, as encoded in the URL
    authorization: str | None  # Basic credentials from the URL's userinfo
    literal: tuple[tuple[Any, ...], ...]  # the address infos of an IP literal host, else ()


def parse_target(url: str) -> _Target:
    """The target of `url`; RequestFailed("invalid_url") if it is not an http(s) URL with a
    host efd connects to."""
    try:
        parsed = URL(url)
        host, port, host_header = parsed.raw_host, parsed.port, parsed.host_port_subcomponent
    except (ValueError, TypeError) as error:
        raise RequestFailed("invalid_url", f"{url}: {error}") from None
    if parsed.scheme not in ("http", "https") or not host or port is None or not host_header:
        raise RequestFailed("invalid_url", url)
    if problem := netguard.numeric_host_problem(host):
        raise RequestFailed("invalid_url", problem)
    authorization = None
    if parsed.raw_user or parsed.raw_password:
        # As aiohttp did: a URL's userinfo is sent as Basic credentials, Latin-1 encoded.
        pair = f"{parsed.user or ''}:{parsed.password or ''}".encode("latin-1", "replace")
        authorization = "Basic " + base64.b64encode(pair).decode("ascii")
    return _Target(
        tls=parsed.scheme == "https",
        host=host,
        port=port,
        host_header=host_header,
        path=parsed.raw_path_qs or "/",
        authorization=authorization,
        literal=_literal(host, port),
    )


def _literal(host: str, port: int) -> tuple[tuple[Any, ...], ...]:
    """The address info of an IP literal host, as getaddrinfo would answer; () for a name."""
    if ":" in host:
        return ((socket.AF_INET6, socket.SOCK_STREAM, socket.IPPROTO_TCP, "", (host, port)),)
    if host.replace(".", "").isdigit():  # a dotted quad: numeric_host_problem let it by
        return ((socket.AF_INET, socket.SOCK_STREAM, socket.IPPROTO_TCP, "", (host, port)),)
    return ()


class _Stale(Exception):
    """The connection ended before any byte of the answer: on a reused connection, most
    likely the server closed it while it was idle."""


class _Connection(asyncio.Protocol):
    """One keep-alive connection: the bytes it receives go to its reader, and the answer the
    reader finds goes to the request's waiter."""

    def __init__(self, loop: asyncio.AbstractEventLoop, keep: int, limit: int) -> None:
        self._loop = loop
        self._keep = keep  # body bytes kept for the answer's head
        self._reader = ResponseReader(limit)
        self.transport: asyncio.Transport | None = None
        self.closed = False
        self.reusable = True
        self.idle_since = 0.0
        self.early = False  # bytes came while no request was waiting: the framing is lost
        self._waiter: asyncio.Future[Answer] | None = None
        self._received = False
        self._head: Head | None = None
        self._kept = b""
        # The head of the latest answer, kept after it: through a proxy in absolute form, its
        # headers tell whether the proxy forwarded it.
        self.answered: Head | None = None

    # -- asyncio.Protocol ----------------------------------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        # uvloop's transports are not asyncio.Transport subclasses, only alike.
        self.transport = cast(asyncio.Transport, transport)

    def data_received(self, data: bytes) -> None:
        if self._waiter is None:  # before the request, or while idle in the pool
            self.early = True
            self.close()
            return
        self._received = True
        for event in self._reader.feed(data):
            if isinstance(event, Data):
                kept = self._kept
                if len(kept) < self._keep:
                    self._kept = kept + event.data[: self._keep - len(kept)]
            elif isinstance(event, Head):
                if not event.interim:
                    self._head = self.answered = event
            elif isinstance(event, End):
                self._finish(event)
            else:
                self._fail(RequestFailed("protocol", event.reason))

    def eof_received(self) -> bool | None:
        return None  # the transport closes; connection_lost ends a body read until close

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True
        self.reusable = False
        if self._waiter is None:
            return
        if exc is None:
            for event in self._reader.feed_eof():
                if isinstance(event, End):
                    self._finish(event)
                    return
        if not self._received:
            self._fail(_Stale(_lost_reason(exc, "before the answer")))
        else:
            self._fail(RequestFailed("reset", _lost_reason(exc, "in the middle of the answer")))

    # -- the client's side -----------------------------------------------------------------

    def send(self, request: bytes) -> asyncio.Future[Answer]:
        """Write `request`; the future is its answer."""
        assert self.transport is not None
        assert self._waiter is None
        self._waiter = waiter = self._loop.create_future()
        self._received = False
        self.transport.write(request)
        return waiter

    def expire(self) -> None:
        """The deadline passed before the answer was complete."""
        if self._waiter is not None:
            self._fail(TimeoutError())

    def abandon(self) -> None:
        """The caller stops waiting (deadline, cancellation): the answer's remains would be
        read as the next one's, so the connection goes."""
        self._waiter = None
        self.reusable = False
        self.closed = True
        if self.transport is not None:
            self.transport.abort()

    def close(self) -> None:
        self.closed = True
        self.reusable = False
        if self.transport is not None:
            self.transport.close()

    # -- the answer ------------------------------------------------------------------------

    def _finish(self, end: End) -> None:
        waiter, self._waiter = self._waiter, None
        head, self._head = self._head, None
        kept, self._kept = self._kept, b""
        if not end.reusable:
            self.reusable = False
        if waiter is not None and not waiter.done() and head is not None:
            waiter.set_result(Answer(head.status, head.retry_after, kept))

    def _fail(self, error: Exception) -> None:
        waiter, self._waiter = self._waiter, None
        self.reusable = False
        if self.transport is not None:
            self.transport.abort()
        if waiter is not None and not waiter.done():
            waiter.set_exception(error)


class _Tunnel(asyncio.Protocol):
    """A connection to the proxy until its answer to CONNECT: `answer` is that answer's
    head, or a RequestFailed("proxy") when the proxy gives none efd can read."""

    def __init__(self, loop: asyncio.AbstractEventLoop, proxy: Proxy) -> None:
        self._proxy = proxy
        self.answer: asyncio.Future[proxyrules.ConnectAnswer] = loop.create_future()
        self.transport: asyncio.Transport | None = None
        self.extra = False  # bytes came after the answer, before TLS started
        self._data = b""

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = cast(asyncio.Transport, transport)

    def data_received(self, data: bytes) -> None:
        if self.answer.done():
            self.extra = True
            return
        self._data += data
        try:
            answer = proxyrules.read_connect_answer(self._data)
        except proxyrules.ProxyProtocolError as error:
            self._fail(f"proxy {self._proxy.shown} sent {error} to CONNECT")
            return
        if answer is not None:
            self._data = b""
            self.answer.set_result(answer)

    def connection_lost(self, exc: Exception | None) -> None:
        if exc is None:
            self._fail(f"proxy {self._proxy.shown} closed the connection before answering CONNECT")
        else:
            reason = str(exc) or type(exc).__name__
            self._fail(f"proxy {self._proxy.shown}: {reason} before answering CONNECT")

    def _fail(self, message: str) -> None:
        if not self.answer.done():
            self.answer.set_exception(RequestFailed(proxyrules.ERROR_CLASS, message))
        self.close()

    def close(self) -> None:
        if self.transport is not None:
            self.transport.close()


def _lost_reason(exc: Exception | None, when: str) -> str:
    if exc is None:
        return f"the server closed the connection {when}"
    return f"{str(exc) or type(exc).__name__} ({when})"


PoolKey = tuple[bool, str, int, ssl.SSLContext | None]
# What a name and port resolve to, as getaddrinfo answers for a stream socket.
Resolver = Callable[[str, int], Awaitable[Sequence[AddressInfo]]]


class Client:
    """POSTs to hook URLs. Connections are pooled per (scheme, host, port, TLS context): a
    renewed client certificate is a new context, so its connections are new ones."""

    def __init__(
        self,
        *,
        timeout: float,
        allowed: Sequence[netguard.IPNetwork],
        tls: ssl.SSLContext,
        keep: int,
        limit: int,
        resolver: Resolver | None = None,
        attempt_delay: float = connect.ATTEMPT_DELAY,
        proxy: proxyrules.Egress | None = None,
    ) -> None:
        self.timeout = timeout
        # Requests go through `proxy.proxy` but to the hosts its bypass names.
        self._egress = proxy
        self._via: dict[str, Proxy | None] = {}
        # Names are resolved by `resolver` when given (a hosts table of one's own, a test's
        # names), else by the system's resolver.
        self._resolver = resolver
        self._attempt_delay = attempt_delay
        self._allowed = allowed
        self._tls = tls
        self._keep = keep
        self._limit = limit
        self._targets: dict[str, _Target] = {}
        self._idle: dict[PoolKey, list[_Connection]] = {}
        self._dns: dict[tuple[str, int], tuple[float, list[AddressInfo]]] = {}
        self._sweep_at = 0.0
        self._closed = False
        self._timed_out = f"no complete answer in {timeout:g} s"
        # Held: asyncio.get_running_loop() asks the kernel for the process id at each call.
        self._loop: asyncio.AbstractEventLoop | None = None

    async def close(self) -> None:
        self._closed = True
        for idle in self._idle.values():
            for connection in idle:
                connection.close()
        self._idle.clear()

    def target(self, url: str) -> _Target:
        target = self._targets.get(url)
        if target is None:
            if len(self._targets) >= 4096:  # hooks come and go with reloads
                self._targets.clear()
            target = self._targets[url] = parse_target(url)
        return target

    def via(self, target: _Target) -> Proxy | None:
        """The proxy `target` is reached through; None when it is reached directly."""
        egress = self._egress
        if egress is None:
            return None
        try:
            return self._via[target.host]
        except KeyError:
            if len(self._via) >= 4096:
                self._via.clear()
            via = self._via[target.host] = egress.proxy_for(target.host)
            return via

    async def post(
        self,
        url: str,
        body: bytes,
        headers: Mapping[str, str],
        context: ssl.SSLContext | None = None,
        *,
        method: str = "POST",
    ) -> Answer:
        """POST `body` to `url` and read the answer, all within the timeout. `context`: the
        TLS context to use instead of the client's (one presenting a certificate); `method`:
        an action's PUT or PATCH instead, the body framed alike (wire.METHODS)."""
        target = self.target(url)
        if target.authorization is not None:
            headers = {**headers, "Authorization": target.authorization}
        via = self.via(target) if self._egress is not None else None
        path = target.path
        forwarded = via is not None and not target.tls  # the proxy reads the request itself
        if forwarded:
            assert via is not None
            path = proxyrules.absolute_target(target.host_header, path)
            if via.authorization is not None:
                headers = {**headers, "Proxy-Authorization": via.authorization}
        try:
            request = request_head(path, target.host_header, headers, len(body), method) + body
        except BadHeader as error:
            raise RequestFailed("invalid_request", str(error)) from None
        tls = (context or self._tls) if target.tls else None
        key: PoolKey = (target.tls, target.host, target.port, tls)
        loop = self._loop
        if loop is None:
            loop = self._loop = asyncio.get_running_loop()
        now = loop.time()
        deadline = now + self.timeout
        connection = self._idle_connection(key, now)
        reused = connection is not None
        if connection is None:
            connection = await self._connect_by(deadline, target, tls, via)
        while True:
            connection.answered = None
            waiter = connection.send(request)
            # The deadline is a timer on this exchange (a new connection's connect and
            # handshake ran under the same deadline): cheaper per POST than a timeout
            # scope around the whole coroutine.
            timer = loop.call_at(deadline, connection.expire)
            try:
                answer = await waiter
            except _Stale as stale:
                if not reused:
                    raise RequestFailed("reset", str(stale)) from None
                # The server closed the pooled connection while it was idle, and its close
                # crossed this request: sent again, once, on a new connection. A server
                # that read the request and then died without a byte of answer gets it
                # twice; delivery is at-least-once (receivers deduplicate by webhook-id),
                # and the alternative is a failed attempt each time a receiver's idle
                # timeout races a POST.
                reused = False
                connection = await self._connect_by(deadline, target, tls, via)
                continue
            except TimeoutError:
                raise RequestFailed("timeout", self._timed_out) from None
            except RequestFailed:
                # A proxy may close the connection as it answers, unread body and all: an
                # answer of its own cut short by the reset is still its answer.
                if forwarded and (refused := _proxy_answer(via, connection.answered)):
                    raise RequestFailed(proxyrules.ERROR_CLASS, refused) from None
                raise
            except BaseException:  # cancelled: the answer's remains must not be read later
                connection.abandon()
                raise
            finally:
                timer.cancel()
            break
        if connection.reusable and not connection.closed and not self._closed:
            connection.idle_since = loop.time()
            idle = self._idle.get(key)
            if idle is None:
                idle = self._idle[key] = []
            idle.append(connection)
        else:
            connection.close()
        if (
            forwarded
            and answer.status != 200
            and (refused := _proxy_answer(via, connection.answered))
        ):
            raise RequestFailed(proxyrules.ERROR_CLASS, refused)
        return answer

    async def _connect_by(
        self, deadline: float, target: _Target, tls: ssl.SSLContext | None, via: Proxy | None
    ) -> _Connection:
        """A new connection, on which the receiver has not spoken first."""
        progress: list[str] = []  # how far a connection through the proxy got
        try:
            async with asyncio.timeout_at(deadline):
                if via is None:
                    connection = await self._connect(target, tls)
                else:
                    connection = await self._connect_via(via, target, tls, progress)
        except TimeoutError:
            if via is None or progress[-1:] == ["tunnel"]:
                raise RequestFailed("timeout", self._timed_out) from None
            if not progress:
                message = f"proxy {via.shown}: no connection in {self.timeout:g} s"
                raise RequestFailed(proxyrules.ERROR_CLASS, message) from None
            # The proxy may be waiting on the receiver, whose address is not answering.
            message = (
                f"no answer from proxy {via.shown} to CONNECT "
                f"{proxyrules.authority(target.host, target.port)} in {self.timeout:g} s"
            )
            raise RequestFailed("timeout", message) from None
        try:
            # One turn of the loop before the request is written: bytes the receiver sent
            # as the connection opened are read now and refused, rather than taken for
            # the answer to a request they cannot be answering.
            await asyncio.sleep(0)
        except BaseException:
            connection.close()
            raise
        if connection.early:
            raise RequestFailed("protocol", _EARLY)
        return connection

    def _idle_connection(self, key: PoolKey, now: float) -> _Connection | None:
        if now >= self._sweep_at:
            self._sweep(now)
        idle = self._idle.get(key)
        while idle:
            connection = idle.pop()  # the most recently used: the least likely to be closed
            if not connection.closed and now - connection.idle_since < KEEPALIVE:
                return connection
            connection.close()
        return None

    def _sweep(self, now: float) -> None:
        """Close connections idle past KEEPALIVE, and forget pools left empty (a hook
        removed, a client certificate renewed)."""
        self._sweep_at = now + KEEPALIVE
        for key, idle in list(self._idle.items()):
            kept = [c for c in idle if not c.closed and now - c.idle_since < KEEPALIVE]
            for connection in idle:
                if connection not in kept:
                    connection.close()
            if kept:
                self._idle[key] = kept
            else:
                del self._idle[key]

    async def _resolve(self, target: _Target) -> Sequence[AddressInfo]:
        if target.literal:
            return target.literal
        try:
            return await self._lookup(target.host, target.port)
        except OSError as error:  # socket.gaierror, or the resolver's own failure
            raise RequestFailed("dns", str(error)) from None

    async def _lookup(self, host: str, port: int) -> list[AddressInfo]:
        """The addresses of `host`, cached for DNS_TTL; OSError when there are none."""
        loop = asyncio.get_running_loop()
        key = (host, port)
        cached = self._dns.get(key)
        now = loop.time()
        if cached is not None and cached[0] > now:
            return cached[1]
        if self._resolver is None:
            infos = await loop.getaddrinfo(
                host, port, type=socket.SOCK_STREAM, flags=socket.AI_ADDRCONFIG
            )
        else:
            infos = list(await self._resolver(host, port))
        if not infos:
            raise OSError(f"no address for {host}")
        if len(self._dns) >= 4096:
            self._dns.clear()
        self._dns[key] = (now + DNS_TTL, infos)
        return infos

    async def _connect_via(
        self, via: Proxy, target: _Target, tls: ssl.SSLContext | None, progress: list[str]
    ) -> _Connection:
        """A new connection to the receiver through the proxy: to the proxy itself for plain
        HTTP, or a tunnel with the TLS handshake with the receiver done inside it. The
        receiver's name is judged first: the proxy connects wherever its own resolver says,
        so every address efd finds must be one the guard allows. The proxy's own address is
        the operator's choice and is not judged. `progress` gets "proxy" once the proxy
        accepted the connection, "connect" once CONNECT is written, "tunnel" once it is
        open."""
        for info in await self._resolve(target):
            if reason := netguard.check(str(info[4][0]), self._allowed):
                raise RequestFailed("blocked", f"{GUARD_TAG}: {reason} is not allowed")
        try:
            infos = _literal(via.host, via.port) or await self._lookup(via.host, via.port)
        except OSError as error:
            message = f"proxy {via.shown}: cannot resolve {via.host}: {error}"
            raise RequestFailed(proxyrules.ERROR_CLASS, message) from None
        loop = asyncio.get_running_loop()

        def factory() -> _Connection | _Tunnel:
            if tls is None:
                return _Connection(loop, self._keep, self._limit)
            return _Tunnel(loop, via)

        def attempt(info: AddressInfo) -> Callable[[], Coroutine[Any, Any, _Connection | _Tunnel]]:
            async def open_one() -> _Connection | _Tunnel:
                family, _type, _proto, _name, address = info
                try:
                    _, protocol = await loop.create_connection(
                        factory, host=address[0], port=address[1], family=family
                    )
                except OSError as error:
                    reason = str(error) or type(error).__name__
                    message = f"proxy {via.shown}: cannot connect: {reason}"
                    raise RequestFailed(proxyrules.ERROR_CLASS, message) from None
                return protocol

            return open_one

        opened = await connect.race(
            [attempt(info) for info in addresses.interleave(infos)],
            self._attempt_delay,
            discard=lambda protocol: protocol.close(),
            final=lambda _error: False,
        )
        progress.append("proxy")
        if isinstance(opened, _Connection):
            return opened
        try:
            return await self._tunnel(opened, via, target, tls, progress)
        except BaseException:
            opened.close()
            raise

    async def _tunnel(
        self,
        tunnel: _Tunnel,
        via: Proxy,
        target: _Target,
        tls: ssl.SSLContext | None,
        progress: list[str],
    ) -> _Connection:
        """CONNECT through `tunnel`, then TLS with the receiver inside it, its name checked."""
        assert tunnel.transport is not None
        assert tls is not None
        tunnel.transport.write(
            proxyrules.connect_request(target.host, target.port, via.authorization)
        )
        progress.append("connect")
        answer = await tunnel.answer
        if refused := proxyrules.refusal(via, answer, target.host, target.port):
            raise RequestFailed(proxyrules.ERROR_CLASS, refused)
        if answer.rest or tunnel.extra:
            message = f"proxy {via.shown} sent bytes after its answer to CONNECT"
            raise RequestFailed(proxyrules.ERROR_CLASS, message)
        progress.append("tunnel")
        connection = _Connection(asyncio.get_running_loop(), self._keep, self._limit)
        try:
            transport = await asyncio.get_running_loop().start_tls(
                tunnel.transport, connection, tls, server_hostname=target.host.rstrip(".")
            )
        except ssl.SSLCertVerificationError as error:
            raise RequestFailed("tls", f"certificate rejected: {error}") from None
        except ssl.SSLError as error:
            raise RequestFailed("connect", f"TLS handshake failed: {error}") from None
        except OSError as error:
            reason = str(error) or type(error).__name__
            raise RequestFailed("connect", f"TLS handshake failed: {reason}") from None
        if transport is None:  # the tunnel closed as the handshake began
            raise RequestFailed("connect", "TLS handshake failed: the tunnel closed")
        connection.connection_made(transport)
        return connection

    async def _connect(self, target: _Target, tls: ssl.SSLContext | None) -> _Connection:
        """A new connection, TLS handshake done, to whichever of the target's addresses the
        guard allows answers first: they are raced, each started an attempt delay after the
        one before or as soon as one fails (Happy Eyeballs)."""
        plan = addresses.plan(await self._resolve(target), self._allowed)
        if not plan.addresses:
            # Every address was one the guard refuses (refused is set: getaddrinfo never
            # answers with no address, and _resolve refuses an empty answer).
            raise RequestFailed("blocked", f"{GUARD_TAG}: {plan.refused} is not allowed")
        loop = asyncio.get_running_loop()
        # SNI and the name checked: the URL's host, as aiohttp sends it.
        hostname = target.host.rstrip(".") if tls is not None else None

        def attempt(info: AddressInfo) -> Callable[[], Coroutine[Any, Any, _Connection]]:
            async def open_one() -> _Connection:
                family, _type, _proto, _name, address = info
                try:
                    _, connection = await loop.create_connection(
                        lambda: _Connection(loop, self._keep, self._limit),
                        host=address[0],
                        port=address[1],
                        family=family,
                        ssl=tls,
                        server_hostname=hostname,
                    )
                except ssl.SSLCertVerificationError as error:
                    raise RequestFailed("tls", f"certificate rejected: {error}") from None
                except ssl.SSLError as error:
                    raise RequestFailed("connect", f"TLS handshake failed: {error}") from None
                except OSError as error:
                    raise RequestFailed("connect", str(error) or type(error).__name__) from None
                return connection

            return open_one

        return await connect.race(
            [attempt(info) for info in plan.addresses],
            self._attempt_delay,
            discard=_Connection.close,
            final=_final,
        )


def _proxy_answer(via: Proxy | None, head: Head | None) -> str | None:
    """Why `head`, the answer to a request the proxy forwarded, is the proxy's own, if it is."""
    if via is None or head is None:
        return None
    forwarded = any(name == b"via" for name, _ in head.headers)
    return proxyrules.own_answer(via, head.status, head.reason.decode("latin-1"), forwarded)


def _final(error: Exception) -> bool:
    """A certificate is refused whichever address presents it: no other address is tried."""
    return isinstance(error, RequestFailed) and error.error_class == "tls"
