"""The interface every broker's publisher has, and what they share: connections kept per
broker, credentials and client certificate (efd/brokers/links.py), the address guard before
each connect (efd/brokers/guard.py), TLS verified as HTTPS is (efd/delivery/tls.py), and one
timeout for connecting, publishing and the broker's confirmation together.

A publish returns once the broker confirmed the message, and raises PublishFailed otherwise
(efd/brokers/failures.py); nothing else escapes it but cancellation and bugs.
"""

from __future__ import annotations

import asyncio
import ssl
from abc import ABC, abstractmethod
from collections.abc import Mapping, Sequence
from typing import Any, ClassVar, Generic, TypeVar

from efd.brokers import guard
from efd.brokers.failures import INVALID_REQUEST, TIMEOUT, PublishFailed
from efd.brokers.headers import HeaderError
from efd.brokers.links import Link
from efd.brokers.targets import Broker, Target
from efd.brokers.templates import TemplateError
from efd.delivery import netguard, tls
from efd.segment.webhooks import ClientCert

C = TypeVar("C")
LinkKey = tuple[Broker, str]  # the broker (credentials included) and the client cert's digest


def name_for(target: Target, message: Any) -> str:
    """The routing key, subject, stream or topic of `target` for `message`; PublishFailed
    `invalid_request` when the broker could not take it (too long)."""
    try:
        return target.name.render(message)
    except TemplateError as error:
        raise PublishFailed(INVALID_REQUEST, "; ".join(error.problems)) from None


class Publisher(ABC, Generic[C]):
    """Publishes to the brokers of one kind; `C` is its kept connection."""

    kind: ClassVar[str]

    def __init__(
        self,
        *,
        timeout: float,
        allowed: Sequence[netguard.IPNetwork],
        ca_file: str | None = None,
        resolver: guard.Resolver | None = None,
    ) -> None:
        self.timeout = timeout
        self._allowed = allowed
        self._ca_file = ca_file
        self._resolver = resolver
        self._links: dict[LinkKey, Link[C]] = {}
        self._contexts: dict[str, ssl.SSLContext] = {}
        self._timed_out = f"no confirmation within {timeout:g} s"

    def link(self, broker: Broker, client_cert: ClientCert | None = None) -> Link[C]:
        key = (broker, client_cert.digest if client_cert is not None else "")
        link = self._links.get(key)
        if link is None:

            async def opener() -> C:
                return await self._open(broker, client_cert)

            link = self._links[key] = Link(opener, self._alive, self._close)
        return link

    def context(self, broker: Broker, client_cert: ClientCert | None) -> ssl.SSLContext | None:
        """The TLS context of a connection to `broker`, None when its URL is not a TLS one."""
        if not broker.tls:
            return None
        key = client_cert.digest if client_cert is not None else ""
        context = self._contexts.get(key)
        if context is None:
            try:
                context = (
                    tls.presenting(client_cert, self._ca_file)
                    if client_cert is not None
                    else tls.verifying(self._ca_file)
                )
            except tls.ClientCertError as error:
                raise PublishFailed("client_cert", str(error)) from None
            self._contexts[key] = context
        return context

    async def addresses(self, broker: Broker) -> tuple[Any, ...]:
        return await guard.allowed_addresses(broker, self._allowed, self._resolver)

    async def publish(
        self,
        target: Target,
        name: str,
        body: bytes,
        headers: Mapping[str, str],
        client_cert: ClientCert | None = None,
    ) -> str:
        """Publish `body` with `headers` (a webhook's: efd/segment/webhooks.py's
        request_headers) to `name` (name_for) at `target`, and wait for the broker's
        confirmation, all within the timeout; what the broker answered, in a few words."""
        if target.kind != self.kind:
            raise ValueError(f"a {target.kind} target given to the {self.kind} publisher")
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self.timeout
        connection = await self.link(target.broker, client_cert).get(deadline)
        try:
            async with asyncio.timeout_at(deadline):
                return await self._send(connection, target, name, body, headers)
        except TimeoutError:
            raise PublishFailed(TIMEOUT, self._timed_out) from None
        except HeaderError as error:
            raise PublishFailed(INVALID_REQUEST, str(error)) from None

    async def close(self) -> None:
        links, self._links = list(self._links.values()), {}
        await asyncio.gather(*(link.close() for link in links))

    @abstractmethod
    async def _open(self, broker: Broker, client_cert: ClientCert | None) -> C:
        """A new connection, the guard passed and the broker's handshake done; PublishFailed
        saying why not."""

    @abstractmethod
    def _alive(self, connection: C) -> bool: ...

    @abstractmethod
    async def _close(self, connection: C) -> None: ...

    @abstractmethod
    async def _send(
        self, connection: C, target: Target, name: str, body: bytes, headers: Mapping[str, str]
    ) -> str:
        """Publish and wait for the confirmation, and say what it was; PublishFailed saying
        what the broker did."""
