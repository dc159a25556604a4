"""Publishing to RabbitMQ (AMQP 0-9-1, aiormq, the protocol library under aio-pika, whose
message and exchange objects a publisher has no use for): one connection per broker and credentials,
one channel on it in publisher-confirm mode, every message `mandatory` and persistent.
Delivered means the broker's basic.ack; a message no queue is bound for comes back
(basic.return) and is a failure, as is a basic.nack."""

from __future__ import annotations

import asyncio
import ssl
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import aiormq
import aiormq.abc
import aiormq.connection
from aiormq import exceptions as amqp_errors
from pamqp import commands as spec
from yarl import URL

from efd.brokers import guard, headers
from efd.brokers.failures import AUTH, PROTOCOL, REFUSED, RESET, PublishFailed, failed
from efd.brokers.publisher import Publisher
from efd.brokers.targets import AMQP, Broker, Target
from efd.segment.webhooks import ClientCert

PERSISTENT = 2  # delivery_mode: the broker writes the message to disk in a durable queue


@dataclass(slots=True)
class AmqpLink:
    connection: aiormq.Connection
    channel: aiormq.abc.AbstractChannel | None = None
    lock: asyncio.Lock = field(default_factory=asyncio.Lock)


class _GuardedTransport(aiormq.connection.TransportFactory):
    """aiormq's connection opened by efd: the guard judges the broker's addresses, and the
    allowed one that answers first is connected to, TLS checked against the URL's host."""

    def __init__(
        self, broker: Broker, infos: tuple[Any, ...], context: ssl.SSLContext | None
    ) -> None:
        self._broker = broker
        self._infos = infos
        self._context = context

    async def create(
        self, url: URL, **kwargs: Any
    ) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
        return await guard.open_stream(self._broker, self._infos, self._context)


def _url(broker: Broker) -> URL:
    # The credentials as given (none: the client's guest/guest); the virtual host as the
    # path, "/" as aiormq reads it.
    return URL.build(
        scheme="amqp",
        host=broker.host,
        port=broker.port,
        user=broker.username,
        password=broker.password,
        path="/" if broker.vhost == "/" else "/" + broker.vhost,
    )


def _close_reason(error: BaseException) -> str:
    """The broker's words for a closed channel or connection: code and reply text."""
    args: tuple[Any, ...] = tuple(getattr(error, "args", ()))
    if len(args) >= 2 and isinstance(args[0], int):
        return f"{args[0]} {args[1]}"
    return str(error) or type(error).__name__


class RabbitMQ(Publisher[AmqpLink]):
    kind = AMQP

    async def _open(self, broker: Broker, client_cert: ClientCert | None) -> AmqpLink:
        context = self.context(broker, client_cert)
        # Judged before aiormq starts, so that a refused address is efd's failure alone.
        infos = await self.addresses(broker)
        connection = aiormq.Connection(
            _url(broker),
            client_properties={"connection_name": "efd"},
            transport_factory=_GuardedTransport(broker, infos, context),
        )
        try:
            await connection.connect()
        except PublishFailed:
            raise
        except (amqp_errors.AuthenticationError, amqp_errors.ProbableAuthenticationError) as error:
            raise failed(
                AUTH, f"the broker refused the credentials: {error}", broker.label
            ) from None
        except amqp_errors.ConnectionNotAllowed as error:
            raise failed(REFUSED, _close_reason(error), broker.label) from None
        except amqp_errors.AMQPError as error:
            raise failed(PROTOCOL, _close_reason(error), broker.label) from None
        except (ConnectionError, OSError, EOFError) as error:
            raise failed(
                RESET, f"the broker closed the connection: {error}", broker.label
            ) from None
        return AmqpLink(connection)

    def _alive(self, connection: AmqpLink) -> bool:
        return not connection.connection.is_closed

    async def _close(self, connection: AmqpLink) -> None:
        await connection.connection.close()

    async def _channel(self, link: AmqpLink) -> aiormq.abc.AbstractChannel:
        """The link's channel, opened again after the broker closed it (a missing exchange
        closes it with 404 NOT_FOUND)."""
        channel = link.channel
        if channel is None or channel.is_closed:
            async with link.lock:
                channel = link.channel
                if channel is None or channel.is_closed:
                    channel = link.channel = await link.connection.channel(
                        publisher_confirms=True, on_return_raises=True
                    )
        return channel

    async def _send(
        self,
        connection: AmqpLink,
        target: Target,
        name: str,
        body: bytes,
        headers_: Mapping[str, str],
    ) -> str:
        properties = headers.amqp(headers_)
        basic = spec.Basic.Properties(
            headers=dict(properties.headers),
            content_type=properties.content_type,
            message_id=properties.message_id,
            delivery_mode=PERSISTENT,
        )
        exchange_shown = repr(target.exchange) if target.exchange else "the default exchange"
        try:
            channel = await self._channel(connection)
            confirmation = await channel.basic_publish(
                body,
                exchange=target.exchange,
                routing_key=name,
                properties=basic,
                mandatory=True,
            )
        except amqp_errors.PublishError as error:
            returned = error.message.delivery if error.message is not None else None
            reply = f"{getattr(returned, 'reply_code', '')} {getattr(returned, 'reply_text', '')}"
            raise PublishFailed(
                REFUSED,
                f"unroutable: {exchange_shown} routes the routing key {name!r} to no queue "
                f"(the broker returned it: {reply.strip()})",
            ) from None
        except amqp_errors.DeliveryError as error:
            raise PublishFailed(
                REFUSED, f"the broker did not take the message ({error.frame.name})"
            ) from None
        except amqp_errors.ChannelAccessRefused as error:
            raise failed(AUTH, _close_reason(error), target.url) from None
        except amqp_errors.ChannelClosed as error:
            # A missing exchange closes the channel (404 NOT_FOUND): the next publish opens
            # another on the same connection.
            raise failed(REFUSED, _close_reason(error), target.url) from None
        except amqp_errors.ChannelInvalidStateError as error:
            raise failed(RESET, f"the connection was lost: {error}", target.url) from None
        except (amqp_errors.AMQPConnectionError, ConnectionError, OSError, EOFError) as error:
            raise failed(
                RESET, f"the connection was lost: {_close_reason(error)}", target.url
            ) from None
        if not isinstance(confirmation, spec.Basic.Ack):
            shown = type(confirmation).__name__ if confirmation is not None else "nothing"
            raise PublishFailed(REFUSED, f"the broker did not take the message ({shown})")
        return "basic.ack (publisher confirm)"
