"""Publishing to NATS JetStream (nats-py): one connection per server and credentials, each
message published to JetStream and delivered only on the stream's acknowledgement. A subject
no stream takes has no responder, which is a failure; `Nats-Msg-Id` is the webhook-id, so a
resend within the stream's duplicate window is acknowledged and not stored twice."""

from __future__ import annotations

import ipaddress
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import nats
import nats.errors
import nats.js.errors
from nats.aio.client import Client as NATS
from nats.js import JetStreamContext

from efd.brokers import headers
from efd.brokers.failures import AUTH, CONNECT, PROTOCOL, REFUSED, RESET, TLS, PublishFailed, failed
from efd.brokers.publisher import Publisher
from efd.brokers.targets import NATS as KIND
from efd.brokers.targets import Broker, Target
from efd.segment.webhooks import ClientCert


async def _quiet(*_: Any) -> None:
    """nats-py's callbacks: efd reports failures by what a publish raises, not by logs."""


def _server(scheme: str, address: str, port: int) -> str:
    host = f"[{address}]" if ipaddress.ip_address(address.split("%")[0]).version == 6 else address
    return f"{scheme}://{host}:{port}"


@dataclass(slots=True)
class NatsLink:
    client: NATS
    # Made once per connection: a context holds a parser, an event and a semaphore of its
    # own, too much to make again for each publish.
    js: JetStreamContext


class JetStream(Publisher[NatsLink]):
    kind = KIND

    async def _open(self, broker: Broker, client_cert: ClientCert | None) -> NatsLink:
        context = self.context(broker, client_cert)
        infos = await self.addresses(broker)
        scheme = "tls" if context is not None else "nats"
        servers = [_server(scheme, str(info[4][0]), broker.port) for info in infos]
        credentials: dict[str, Any] = {}
        if broker.username is not None and broker.password is not None:
            credentials = {"user": broker.username, "password": broker.password}
        elif broker.username is not None:
            credentials = {"token": broker.username}
        client = NATS()
        try:
            # The addresses the guard allowed, in order, and none the server tells of:
            # efd connects again itself (efd/brokers/links.py), through the guard.
            await client.connect(
                servers=servers,
                name="efd",
                allow_reconnect=False,
                dont_randomize=True,
                connect_timeout=max(1, round(self.timeout)),
                max_reconnect_attempts=0,
                tls=context,
                tls_hostname=broker.host.rstrip(".") if context is not None else None,
                error_cb=_quiet,
                disconnected_cb=_quiet,
                closed_cb=_quiet,
                **credentials,
            )
        except nats.errors.AuthorizationError as error:
            raise failed(
                AUTH, f"the server refused the credentials: {error}", broker.label
            ) from None
        except nats.errors.NoServersError:
            raise PublishFailed(CONNECT, f"no answer from {broker.host}:{broker.port}") from None
        except (nats.errors.SecureConnRequiredError, nats.errors.SecureConnWantedError) as error:
            raise failed(TLS, str(error), broker.label) from None
        except nats.errors.Error as error:
            raise failed(PROTOCOL, error, broker.label) from None
        except OSError as error:
            raise failed(CONNECT, error, broker.label) from None
        return NatsLink(client, client.jetstream())

    def _alive(self, connection: NatsLink) -> bool:
        return connection.client.is_connected

    async def _close(self, connection: NatsLink) -> None:
        await connection.client.close()

    async def _send(
        self,
        connection: NatsLink,
        target: Target,
        name: str,
        body: bytes,
        headers_: Mapping[str, str],
    ) -> str:
        try:
            ack = await connection.js.publish(
                name, body, timeout=self.timeout, headers=headers.nats(headers_)
            )
        except nats.js.errors.NoStreamResponseError:
            raise PublishFailed(REFUSED, f"no stream takes the subject {name!r}") from None
        except nats.js.errors.APIError as error:
            raise PublishFailed(
                REFUSED, f"JetStream refused it: {error.code} {error.description}"
            ) from None
        except nats.errors.BadSubjectError:
            raise PublishFailed(REFUSED, f"the server refuses the subject {name!r}") from None
        except nats.errors.MaxPayloadError as error:
            raise PublishFailed(REFUSED, f"larger than the server takes: {error}") from None
        except nats.errors.TimeoutError:
            raise TimeoutError from None  # the publisher's timeout
        except (nats.errors.ConnectionClosedError, nats.errors.StaleConnectionError) as error:
            raise failed(RESET, f"the connection was lost: {error}", target.url) from None
        except nats.errors.Error as error:
            raise failed(RESET, error, target.url) from None
        if not ack.stream:
            raise PublishFailed(REFUSED, "JetStream answered without a stream")
        duplicate = ", a duplicate" if ack.duplicate else ""
        return f"stored in the stream {ack.stream} at sequence {ack.seq}{duplicate}"
