"""What POSTs webhooks: a round's signed requests through efd's HTTP client (http1.py: exact
timeouts, verified TLS, the address guard), and the answers as AttemptResults.

`Sender` sends in this process; `SenderPool` has sender processes (efd/processes/pool.py) run
`SenderChild`, each its own Sender, so the sending runs on the machine's other cores. Both
are the dispatcher's `Rounds`.
"""

from __future__ import annotations

import asyncio
import functools
import logging
import ssl
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from efd.delivery import http1, netguard, tls
from efd.delivery.retry import (
    AttemptResult,
    Verdict,
    classify_error,
    classify_status,
    parse_retry_after,
)
from efd.processes.pool import LOST, Pool
from efd.segment import webhooks
from efd.segment.webhooks import ClientCert, MessageKey, Route

log = logging.getLogger(__name__)

# Read at most this much of a response: enough to see it is complete, never a memory risk.
_MAX_RESPONSE_BYTES = 1 << 20


class Sender:
    """One HTTP client (efd/delivery/http1.py) for all hooks. Concurrency is gated by the
    dispatcher before a request starts, so no request waits for a connection and the
    timeout is the receiver's time alone."""

    def __init__(
        self,
        *,
        timeout: float,
        allowed_networks: Sequence[str],
        ca_file: str | None = None,
        response_head_bytes: int = 512,
    ) -> None:
        self.timeout = timeout
        self._allowed = netguard.parse_networks(allowed_networks)
        self._head_bytes = response_head_bytes
        self._ca_file = ca_file
        self._ssl = tls.verifying(ca_file)
        # Per client certificate, as loaded: a renewal (another digest) gets its own context,
        # and requests in flight keep the one they started with.
        self._presenting: dict[ClientCert, ssl.SSLContext] = {}
        self._client: http1.Client | None = None
        # Held: asyncio.get_running_loop() asks the kernel for the process id at each call.
        self._loop: asyncio.AbstractEventLoop | None = None

    async def start(self) -> None:
        self._loop = asyncio.get_running_loop()
        self._client = http1.Client(
            timeout=self.timeout,
            allowed=self._allowed,
            tls=self._ssl,
            keep=self._head_bytes,
            limit=_MAX_RESPONSE_BYTES,
        )

    async def close(self) -> None:
        if self._client is not None:
            await self._client.close()
            self._client = None

    async def send_round(
        self, route: Route, urls: Sequence[str], body: str, webhook_id: str
    ) -> list[AttemptResult]:
        """One round: the same signed body POSTed at once to each of `urls` (a subset of
        the route's hooks). Standard Webhooks' timestamp is this attempt's."""
        data = body.encode("utf-8")
        headers = webhooks.request_headers(
            user_agent=route.user_agent,
            secret=route.secret,
            body=data,
            static={},
            webhook_id=webhook_id,
            timestamp=int(time.time()),
            standard_secrets=route.standard_secrets,
        )
        hooks = [(url, static) for url, static in route.hooks if url in urls]
        clients = route.client_certs
        if len(hooks) == 1:  # the common case, without gather's task per request
            url, static = hooks[0]
            return [await self.post(url, data, {**static, **headers}, clients.get(url))]
        return list(
            await asyncio.gather(
                *(
                    self.post(url, data, {**static, **headers}, clients.get(url))
                    for url, static in hooks
                )
            )
        )

    def start_round(
        self, route: Route, urls: Sequence[str], body: str, message: MessageKey
    ) -> asyncio.Future[list[AttemptResult]]:
        """send_round as the dispatcher's `Rounds` starts it (a task in this process)."""
        assert self._loop is not None, "Sender.start() was not awaited"
        return self._loop.create_task(
            self.send_round(route, urls, body, webhooks.webhook_id(*message))
        )

    def _client_context(self, client: ClientCert) -> ssl.SSLContext:
        context = self._presenting.get(client)
        if context is None:
            context = tls.presenting(client, self._ca_file)
            # A renewal replaces what the same files held before.
            files = (client.cert, client.key)
            for renewed in [c for c in self._presenting if (c.cert, c.key) == files]:
                del self._presenting[renewed]
            self._presenting[client] = context
        return context

    async def post(
        self, url: str, body: bytes, headers: dict[str, str], client: ClientCert | None = None
    ) -> AttemptResult:
        """POST once, presenting `client`'s certificate if given; never raises for anything
        the receiver or network does."""
        assert self._client is not None, "Sender.start() was not awaited"
        started_at = time.time()
        clock = time.monotonic()
        context: ssl.SSLContext | None = None  # None: the client's, which presents none
        if client is not None:
            try:
                context = self._client_context(client)
            except tls.ClientCertError as error:  # the files changed since the last reload
                return self._error(url, started_at, clock, "client_cert", str(error))
        try:
            answer = await self._client.post(url, body, headers, context)
        except http1.RequestFailed as failure:
            return self._error(url, started_at, clock, failure.error_class, failure.message)
        except Exception as error:
            log.exception("sending to %s failed inside efd", webhooks.redact_url(url))
            return self._error(url, started_at, clock, "internal", repr(error))
        duration = time.monotonic() - clock
        status = answer.status
        verdict = classify_status(status)
        retry_after = None
        if verdict is Verdict.RETRY:
            retry_after = parse_retry_after(answer.retry_after, time.time())
        return AttemptResult(
            hook_url=url,
            started_at=started_at,
            duration=duration,
            verdict=verdict,
            status_code=status,
            # A receiver may echo the URL it was called at: its credentials stay hidden.
            response_head=webhooks.scrub(answer.head.decode("utf-8", "replace"), url),
            retry_after=retry_after,
        )

    def _error(
        self, url: str, started_at: float, clock: float, error_class: str, message: str
    ) -> AttemptResult:
        return AttemptResult(
            hook_url=url,
            started_at=started_at,
            duration=time.monotonic() - clock,
            verdict=classify_error(error_class),
            error_class=error_class,
            # An error may quote the URL (one that cannot be parsed, say).
            error=webhooks.scrub(message, url)[:500],
        )


# -- sender processes ------------------------------------------------------------------------

_INTERRUPTED = "the sender process exited before the answer; the outcome is unknown"

ResultTuple = tuple[
    str, float, float, str, int | None, str | None, str | None, str | None, float | None
]


def _to_tuple(r: AttemptResult) -> ResultTuple:
    return (
        r.hook_url,
        r.started_at,
        r.duration,
        r.verdict.value,
        r.status_code,
        r.error_class,
        r.error,
        r.response_head,
        r.retry_after,
    )


_VERDICTS = {verdict.value: verdict for verdict in Verdict}  # a lookup, not Enum's __call__


def _from_tuple(t: ResultTuple) -> AttemptResult:
    url, started_at, duration, verdict, status, error_class, error, head, retry_after = t
    return AttemptResult(
        url, started_at, duration, _VERDICTS[verdict], status, error_class, error, head, retry_after
    )


@dataclass(frozen=True, slots=True)
class SenderOptions:
    timeout: float
    allowed_networks: tuple[str, ...]
    ca_file: str | None
    response_head_bytes: int

    def sender(self) -> Sender:
        return Sender(
            timeout=self.timeout,
            allowed_networks=self.allowed_networks,
            ca_file=self.ca_file,
            response_head_bytes=self.response_head_bytes,
        )


class SenderChild:
    """A sender process's handler (efd/processes/pool.py): rounds by destination name, answered
    as plain tuples."""

    def __init__(self, setup: dict[str, Any]) -> None:
        self._routes: dict[str, Route] = {route.name: route for route in setup["routes"]}
        self._sender = setup["options"].sender()

    async def start(self) -> None:
        await self._sender.start()

    def configure(self, update: dict[str, Any]) -> None:
        if "routes" in update:  # rounds in flight keep the Route they started with
            self._routes = {route.name: route for route in update["routes"]}

    async def __call__(
        self, destination: str, urls: tuple[str, ...], body: str, message: MessageKey
    ) -> Any:
        try:
            # The webhook-id is derived here, on the sender's core, not in the daemon's loop.
            results = await self._sender.send_round(
                self._routes[destination], urls, body, webhooks.webhook_id(*message)
            )
        except Exception as error:  # a bug, not the network: report it, keep serving
            log.exception("sending a round to %s failed", destination)
            now = time.time()
            results = [
                AttemptResult(
                    url,
                    now,
                    0.0,
                    Verdict.RETRY,
                    error_class="internal",
                    error=webhooks.scrub(repr(error), url),
                )
                for url in urls
            ]
        return [_to_tuple(r) for r in results]

    async def close(self) -> None:
        await self._sender.close()


class SenderPool:
    """The dispatcher's `Rounds` when rounds are sent by sender processes."""

    def __init__(
        self,
        *,
        processes: int,
        options: SenderOptions,
        routes: Sequence[Route],
        log_level: str,
        log_format: str,
    ) -> None:
        self._pool = Pool(
            "sender",
            processes,
            "efd.delivery.sender:SenderChild",
            {"options": options, "routes": list(routes)},
            log_level=log_level,
            log_format=log_format,
        )

    @property
    def pids(self) -> list[int]:
        return self._pool.pids

    async def start(self) -> None:
        await self._pool.start()

    async def close(self, timeout: float) -> None:
        await self._pool.close(timeout)

    async def reload(self, routes: Sequence[Route], log_level: str) -> None:
        await self._pool.configure({"routes": list(routes), "log_level": log_level})

    def start_round(
        self, route: Route, urls: Sequence[str], body: str, message: MessageKey
    ) -> asyncio.Future[list[AttemptResult]]:
        convert = functools.partial(_results, urls, time.time())
        return self._pool.submit(route.name, tuple(urls), body, message, convert=convert)


def _results(urls: Sequence[str], sent_at: float, answer: Any) -> list[AttemptResult]:
    """A sender process's answer as AttemptResults; LOST when it died mid-round."""
    if answer is LOST:  # the process died mid-round: nobody knows what the receivers saw
        duration = time.time() - sent_at
        return [
            AttemptResult(
                url,
                sent_at,
                duration,
                Verdict.RETRY,
                error_class="interrupted",
                error=_INTERRUPTED,
            )
            for url in urls
        ]
    return [_from_tuple(r) for r in answer]
