"""Publishing to MQTT 5 (aiomqtt on paho-mqtt): one client per broker and credentials, each
message published at the hook's QoS and delivered on the broker's PUBACK (QoS 1) or PUBCOMP
(QoS 2); the headers as user properties, Content-Type as the content type."""

from __future__ import annotations

import secrets
import socket
import sys
from collections.abc import Mapping

import aiomqtt
from paho.mqtt.packettypes import PacketTypes
from paho.mqtt.properties import Properties

from efd.brokers import guard, headers
from efd.brokers.failures import AUTH, CONNECT, RESET, PublishFailed, failed
from efd.brokers.publisher import Publisher
from efd.brokers.targets import MQTT, Broker, Target
from efd.segment.webhooks import ClientCert

_NOT_AUTHORIZED = ("not authori", "bad user name or password", "bad username or password")


def _lost(client: aiomqtt.Client) -> bool:
    """Whether the client's connection ended; its end's error retrieved, so that asyncio
    never reports it as lost."""
    disconnected = client._disconnected
    if not disconnected.done():
        return False
    if not disconnected.cancelled():
        disconnected.exception()
    return True


class Mqtt(Publisher[aiomqtt.Client]):
    kind = MQTT

    async def _open(self, broker: Broker, client_cert: ClientCert | None) -> aiomqtt.Client:
        context = self.context(broker, client_cert)
        infos = await self.addresses(broker)
        client = aiomqtt.Client(
            broker.host,  # the name TLS checks; the socket goes to an address the guard allowed
            broker.port,
            username=broker.username,
            password=broker.password,
            identifier=f"efd-{secrets.token_hex(8)}",
            protocol=aiomqtt.ProtocolVersion.V5,
            tls_context=context,
            timeout=self.timeout,
        )
        # aiomqtt logs a warning at each publish while more than its threshold wait for
        # their acknowledgements; efd bounds publishes in flight itself (max_per_hook), so
        # the warning would only fill the log, once per message.
        client.pending_calls_threshold = sys.maxsize
        timeout = self.timeout

        def connect_socket() -> socket.socket:
            return guard.open_socket(broker, infos, timeout)

        # paho connects in a thread by host name; efd's socket goes to the checked address.
        setattr(client._client, "_create_socket_connection", connect_socket)  # noqa: B010
        try:
            await client.__aenter__()
        except aiomqtt.MqttCodeError as error:
            text = str(error)
            if any(words in text.lower() for words in _NOT_AUTHORIZED):
                raise failed(
                    AUTH, f"the broker refused the connection: {text}", broker.label
                ) from None
            raise failed(CONNECT, text, broker.label) from None
        except aiomqtt.MqttError as error:
            raise failed(CONNECT, error, broker.label) from None
        return client

    def _alive(self, connection: aiomqtt.Client) -> bool:
        return not _lost(connection)

    async def _close(self, connection: aiomqtt.Client) -> None:
        _lost(connection)
        await connection.__aexit__(None, None, None)

    async def _send(
        self,
        connection: aiomqtt.Client,
        target: Target,
        name: str,
        body: bytes,
        headers_: Mapping[str, str],
    ) -> str:
        mapped = headers.mqtt(headers_)
        properties = Properties(PacketTypes.PUBLISH)  # type: ignore[no-untyped-call]
        if mapped.content_type is not None:
            properties.ContentType = mapped.content_type
        if mapped.user_properties:
            properties.UserProperty = list(mapped.user_properties)
        try:
            await connection.publish(
                name, body, qos=target.qos, properties=properties, timeout=self.timeout
            )
        except aiomqtt.MqttCodeError as error:
            raise failed(RESET, f"the connection was lost: {error}", target.url) from None
        except aiomqtt.MqttError as error:
            if "timed out" in str(error):
                raise TimeoutError from None
            raise failed(RESET, error, target.url) from None
        if _lost(connection):
            raise PublishFailed(RESET, "the connection was lost before the acknowledgement")
        return "PUBACK" if target.qos == 1 else "PUBREC and PUBCOMP"
