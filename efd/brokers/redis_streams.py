"""Publishing to a Redis stream (redis.asyncio): one client per server, database and
credentials, each message one XADD whose field `body` holds the body and one field per
header, trimmed approximately (`MAXLEN ~`) when the hook sets `maxlen`. Delivered means
XADD's reply, the entry's id."""

from __future__ import annotations

import socket
import ssl
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import redis.asyncio as aioredis
import redis.exceptions
from redis.asyncio.connection import Connection
from redis.asyncio.retry import Retry
from redis.backoff import NoBackoff

from efd.brokers import guard, headers
from efd.brokers.failures import AUTH, CONNECT, REFUSED, RESET, PublishFailed, failed
from efd.brokers.publisher import Publisher
from efd.brokers.targets import REDIS_STREAMS, Broker, Target
from efd.segment.webhooks import ClientCert

MAX_CONNECTIONS = 64  # per client: publishes beyond it wait for a free connection


class _GuardedConnection(Connection):
    """redis-py's connection opened by efd: the guard judges the server's addresses at each
    connect, and the allowed one that answers first is connected to, TLS checked against
    the URL's host."""

    def __init__(
        self, *, efd_publisher: RedisStreams, efd_broker: Broker, efd_context: Any, **kwargs: Any
    ) -> None:
        super().__init__(**kwargs)
        self._efd_publisher = efd_publisher
        self._efd_broker = efd_broker
        self._efd_context: ssl.SSLContext | None = efd_context

    async def _connect(self) -> None:
        infos = await self._efd_publisher.addresses(self._efd_broker)
        reader, writer = await guard.open_stream(self._efd_broker, infos, self._efd_context)
        self._reader = reader
        self._writer = writer
        sock = writer.transport.get_extra_info("socket")
        if sock is not None:
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)


@dataclass(slots=True)
class RedisLink:
    client: aioredis.Redis
    alive: bool = True


def _unwrapped(error: BaseException) -> PublishFailed | None:
    """The PublishFailed of efd's connect inside redis-py's ConnectionError, if any."""
    seen: BaseException | None = error
    while seen is not None:
        if isinstance(seen, PublishFailed):
            return seen
        seen = seen.__cause__ or seen.__context__
    return None


class RedisStreams(Publisher[RedisLink]):
    kind = REDIS_STREAMS

    async def _open(self, broker: Broker, client_cert: ClientCert | None) -> RedisLink:
        pool = aioredis.ConnectionPool(
            connection_class=_GuardedConnection,
            efd_publisher=self,
            efd_broker=broker,
            efd_context=self.context(broker, client_cert),
            host=broker.host,
            port=broker.port,
            db=broker.database,
            username=broker.username,
            password=broker.password,
            client_name="efd",
            max_connections=MAX_CONNECTIONS,
            # One more try on a new connection when the kept one was found closed (the
            # server's idle timeout, a CLIENT KILL): at least once, as webhooks are.
            retry=Retry(NoBackoff(), 1),
        )
        client = aioredis.Redis.from_pool(pool)  # closing the client closes its pool
        try:
            await client.ping()
        except BaseException as error:
            await client.aclose()
            if isinstance(error, redis.exceptions.RedisError):
                raise self._failure(error, broker.label, connecting=True) from None
            raise
        return RedisLink(client)

    def _failure(
        self, error: redis.exceptions.RedisError, url: str, *, connecting: bool
    ) -> PublishFailed:
        inner = _unwrapped(error)
        if inner is not None:
            return inner
        if isinstance(
            error, redis.exceptions.AuthenticationError | redis.exceptions.NoPermissionError
        ):
            return failed(AUTH, f"the server refused the credentials: {error}", url)
        if isinstance(error, redis.exceptions.TimeoutError):
            raise TimeoutError
        if isinstance(error, redis.exceptions.ConnectionError):
            if connecting:
                return failed(CONNECT, error, url)
            return failed(RESET, f"the connection was lost: {error}", url)
        return failed(REFUSED, f"the server answered: {error}", url)

    def _alive(self, connection: RedisLink) -> bool:
        return connection.alive

    async def _close(self, connection: RedisLink) -> None:
        await connection.client.aclose()

    async def _send(
        self,
        connection: RedisLink,
        target: Target,
        name: str,
        body: bytes,
        headers_: Mapping[str, str],
    ) -> str:
        fields = headers.redis_fields(body, headers_)
        try:
            entry = await connection.client.xadd(
                name,
                fields,  # type: ignore[arg-type]
                maxlen=target.maxlen,
                approximate=True,
            )
        except redis.exceptions.RedisError as error:
            failure = self._failure(error, target.url, connecting=False)
            if failure.error_class not in (REFUSED,):
                # Connecting again goes through the link, after its back-off.
                connection.alive = False
            raise failure from None
        if not entry:
            raise PublishFailed(REFUSED, "XADD answered without an entry id")
        shown = entry.decode("ascii", "replace") if isinstance(entry, bytes) else str(entry)
        return f"XADD added the entry {shown}"
