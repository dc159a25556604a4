"""The publishers of a sender: one per broker kind, made at its first publish and kept for
the sender's life (each keeps its connections: efd/brokers/links.py), closed with it.

`publish` is what a broker destination's round does for one hook: the routing key, subject,
stream or topic made from the message, then the body and a webhook's headers published and
confirmed, or PublishFailed (efd/brokers/failures.py)."""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from typing import Any

from efd.brokers import guard
from efd.brokers.failures import INVALID_REQUEST, PublishFailed
from efd.brokers.jetstream import JetStream
from efd.brokers.mqtt import Mqtt
from efd.brokers.publisher import Publisher, name_for
from efd.brokers.rabbitmq import RabbitMQ
from efd.brokers.redis_streams import RedisStreams
from efd.brokers.targets import AMQP, MQTT, NATS, REDIS_STREAMS, Target
from efd.delivery import netguard
from efd.segment.webhooks import ClientCert

PUBLISHERS: dict[str, type[Publisher[Any]]] = {
    AMQP: RabbitMQ,
    NATS: JetStream,
    REDIS_STREAMS: RedisStreams,
    MQTT: Mqtt,
}


class Publishers:
    """One Publisher per kind, sharing the delivery timeout, the address guard's allowed
    networks and the extra CA certificates."""

    def __init__(
        self,
        *,
        timeout: float,
        allowed: Sequence[netguard.IPNetwork],
        ca_file: str | None = None,
        resolver: guard.Resolver | None = None,
    ) -> None:
        self._options: dict[str, Any] = {
            "timeout": timeout,
            "allowed": allowed,
            "ca_file": ca_file,
            "resolver": resolver,
        }
        self._publishers: dict[str, Publisher[Any]] = {}

    def of(self, kind: str) -> Publisher[Any]:
        publisher = self._publishers.get(kind)
        if publisher is None:
            publisher = self._publishers[kind] = PUBLISHERS[kind](**self._options)
        return publisher

    async def publish(
        self,
        target: Target,
        body: bytes,
        headers: Mapping[str, str],
        client_cert: ClientCert | None = None,
    ) -> str:
        """Publish a webhook's `body` (its JSON, from which the name's fields are read) with
        its `headers` to `target`; what the broker answered, or PublishFailed."""
        message: Any = None
        if target.name.fields:
            try:
                message = json.loads(body)
            except ValueError:
                raise PublishFailed(INVALID_REQUEST, "the body is not JSON") from None
        name = name_for(target, message)
        return await self.of(target.kind).publish(target, name, body, headers, client_cert)

    async def close(self) -> None:
        publishers, self._publishers = list(self._publishers.values()), {}
        for publisher in publishers:
            await publisher.close()
