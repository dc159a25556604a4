"""What sends webhooks and actions' requests: a round's signed requests through efd's HTTP
client (http1.py: exact timeouts, verified TLS, the address guard), with the route's method,
Content-Type and outbound auth, and the answers as AttemptResults. A broker destination's
round publishes the same body and headers to its hooks' brokers instead (efd/brokers/),
one hook after the other until one confirms.

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
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from efd.brokers.failures import PublishFailed
from efd.brokers.publishers import Publishers
from efd.brokers.targets import Target
from efd.delivery import http1, netguard, outauth, proxyrules, tls, tokens
from efd.delivery.outauth import Auth, ClientCredentials
from efd.delivery.retry import (
    AttemptResult,
    Verdict,
    classify_error,
    classify_status,
    parse_retry_after,
)
from efd.observe import tracing
from efd.observe.tracing import RoundTrace
from efd.processes.pool import LOST, Pool
from efd.segment import webhooks
from efd.segment.webhooks import ClientCert, MessageKey, Route

log = logging.getLogger(__name__)

# The W3C trace headers of a round's attempt spans (efd/observe/otel.py's Wire): each
# hook's traceparent in the order of the round's URLs, and the tracestate ("" when none).
TraceHeaders = tuple[tuple[str, ...], str]
_TRACE_HEADERS = frozenset({"traceparent", "tracestate"})

# Read at most this much of a response: enough to see it is complete, never a memory risk.
_MAX_RESPONSE_BYTES = 1 << 20


# What a 401 to a cached OAuth2 token is recorded as: the request is sent again at once with
# a new token, and this attempt, like a token endpoint's failure, says nothing of the
# receiver's health (efd/delivery/circuit.py).
RENEWED = (
    "the receiver refused the token (HTTP 401): a new one was fetched and the request sent again"
)


class Sender:
    """One HTTP client (efd/delivery/http1.py) for all hooks. Concurrency is gated by the
    dispatcher before a request starts, so no request waits for a connection and the
    timeout is the receiver's time alone.

    Owns the OAuth2 token sources of the actions it sends for, one per (route, credentials),
    kept across reloads while the credentials are unchanged, and the client they ask their
    token endpoints with (the same address guard, TLS verification and timeout)."""

    def __init__(
        self,
        *,
        timeout: float,
        allowed_networks: Sequence[str],
        ca_file: str | None = None,
        response_head_bytes: int = 512,
        token_clock: Callable[[], float] = time.monotonic,
        proxy: proxyrules.Egress | None = None,
    ) -> None:
        self.timeout = timeout
        self._proxy = proxy
        self._allowed = netguard.parse_networks(allowed_networks)
        self._head_bytes = response_head_bytes
        self._ca_file = ca_file
        self._ssl = tls.verifying(ca_file)
        # Per client certificate, as loaded: a renewal (another digest) gets its own context,
        # and requests in flight keep the one they started with.
        self._presenting: dict[ClientCert, ssl.SSLContext] = {}
        self._client: http1.Client | None = None
        # Route name -> the outbound auth of its requests (DestinationConfig.auths).
        self._auths: dict[str, Auth] = {}
        self._tokens: dict[tuple[str, ClientCredentials], tokens.TokenSource] = {}
        self._token_client: http1.Client | None = None
        self._token_clock = token_clock
        # Route name -> its hook URLs' broker targets (Settings.broker_targets), and the
        # publishers that keep the brokers' connections for the sender's life.
        self._targets: dict[str, Mapping[str, Target]] = {}
        self._publishers = Publishers(timeout=timeout, allowed=self._allowed, ca_file=ca_file)
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
            proxy=self._proxy,
        )
        self._token_client = tokens.token_client(
            timeout=self.timeout, allowed=self._allowed, tls=self._ssl, proxy=self._proxy
        )

    async def close(self) -> None:
        if self._client is not None:
            await self._client.close()
            self._client = None
        if self._token_client is not None:
            await self._token_client.close()
            self._token_client = None
        await self._publishers.close()

    def configure_targets(self, targets: Mapping[str, Mapping[str, Target]]) -> None:
        """Take the broker destinations' targets (route name -> hook URL -> Target) for
        rounds that start from now on; a round of a route not among them is POSTed."""
        self._targets = dict(targets)

    def configure_auths(self, auths: Mapping[str, Auth]) -> None:
        """Take the routes' outbound auths (route name -> Auth) for rounds that start from
        now on. A token source whose route keeps the same credentials is kept, with its
        token; the others are dropped."""
        self._auths = dict(auths)
        wanted = {
            (name, auth) for name, auth in auths.items() if isinstance(auth, ClientCredentials)
        }
        self._tokens = {key: source for key, source in self._tokens.items() if key in wanted}

    def _token_source(self, route: str, credentials: ClientCredentials) -> tokens.TokenSource:
        """The token source of `route` under `credentials`, made at its first use."""
        key = (route, credentials)
        source = self._tokens.get(key)
        if source is None:
            assert self._token_client is not None, "Sender.start() was not awaited"
            source = tokens.TokenSource(credentials, self._token_client, self._token_clock)
            if self._auths.get(route) == credentials:  # not a round begun before a reload
                self._tokens[key] = source
        return source

    async def send_round(
        self,
        route: Route,
        urls: Sequence[str],
        body: str,
        webhook_id: str,
        url: str | None = None,
        trace_headers: TraceHeaders | None = None,
    ) -> list[AttemptResult]:
        """One round: the same signed body sent at once to each of `urls` (a subset of the
        route's hooks), with the route's method and Content-Type; to `url` instead when
        given (an action's delivery's own URL), the results still naming the hook.
        Standard Webhooks' timestamp is this attempt's. `trace_headers`: each of `urls`'
        traceparent, and the tracestate, in place of any the hook's static headers name."""
        data = body.encode("utf-8")
        headers = webhooks.request_headers(
            user_agent=route.user_agent,
            secret=route.secret,
            body=data,
            static={},
            webhook_id=webhook_id,
            timestamp=int(time.time()),
            standard_secrets=route.standard_secrets,
            content_type=route.content_type,
        )
        hooks = [(hook, static) for hook, static in route.hooks if hook in urls]
        if trace_headers:
            parents, state = trace_headers
            by_hook = dict(zip(urls, parents, strict=True))
            hooks = [(hook, _traced(static, by_hook[hook], state)) for hook, static in hooks]
        return await self._requests(route, hooks, data, headers, url)

    async def send_batch(
        self,
        route: Route,
        body: bytes,
        webhook_id: str,
        url: str | None = None,
        first_event: int | None = None,
    ) -> list[AttemptResult]:
        """One request of a batch (docs/actions.md#batches): its stored body, the JSON array,
        sent as it is to the action's one hook (to `url` instead when given: its first
        event's rendered URL) under the batch's webhook-id, through the action's request
        path (method, Content-Type, auth). `first_event`: the byte length of the array's
        first element when X-Signature covers only it (batch_signature = "first_event");
        None, the whole body. webhook-signature always covers the whole body."""
        headers = webhooks.request_headers(
            user_agent=route.user_agent,
            secret=route.secret if first_event is None else None,
            body=body,
            static={},
            webhook_id=webhook_id,
            timestamp=int(time.time()),
            standard_secrets=route.standard_secrets,
            content_type=route.content_type,
        )
        if first_event is not None and route.secret:
            headers[webhooks.SIGNATURE_HEADER] = webhooks.sign(
                route.secret, body[1 : 1 + first_event]
            )
        return await self._requests(route, list(route.hooks[:1]), body, headers, url)

    async def _requests(
        self,
        route: Route,
        hooks: Sequence[tuple[str, dict[str, str]]],
        data: bytes,
        headers: dict[str, str],
        url: str | None,
    ) -> list[AttemptResult]:
        """A round's requests, its headers made: published to a broker destination's hooks,
        else sent to each hook (`url` in place of an action's) with the route's auth."""
        clients = route.client_certs
        targets = self._targets.get(route.name) if self._targets else None
        if targets is not None:
            return await self._publish_round(hooks, targets, data, headers, clients)
        method = route.method
        auth = self._auths.get(route.name) if self._auths else None
        if auth is not None:
            if len(hooks) == 1:  # an action's route: its one hook
                hook, static = hooks[0]
                with_auth = _with_auth(static, headers)
                return await self._authorized(
                    route.name, auth, url or hook, hook, data, with_auth, clients.get(hook), method
                )
            rounds = await asyncio.gather(
                *(
                    self._authorized(
                        route.name, auth, url or hook, hook, data,
                        _with_auth(static, headers), clients.get(hook), method,
                    )
                    for hook, static in hooks
                )
            )  # fmt: skip
            return [result for results in rounds for result in results]
        if len(hooks) == 1:  # the common case, without gather's task per request
            hook, static = hooks[0]
            return [
                await self.post(
                    url or hook, data, {**static, **headers}, clients.get(hook), method, hook
                )
            ]
        return list(
            await asyncio.gather(
                *(
                    self.post(
                        url or hook, data, {**static, **headers}, clients.get(hook), method, hook
                    )
                    for hook, static in hooks
                )
            )
        )

    async def _publish_round(
        self,
        hooks: Sequence[tuple[str, dict[str, str]]],
        targets: Mapping[str, Target],
        body: bytes,
        headers: Mapping[str, str],
        clients: Mapping[str, ClientCert],
    ) -> list[AttemptResult]:
        """A broker destination's round: each hook in the configuration's order until one
        confirms (first success wins, and the brokers after it get no copy)."""
        results = []
        for hook, static in hooks:
            target = targets.get(hook)
            if target is None:  # not a broker hook: the route changed under a reload
                now = time.time()
                results.append(
                    self._error(hook, now, time.monotonic(), "internal", "no broker for this hook")
                )
                continue
            result = await self.publish(
                target, hook, body, {**static, **headers}, clients.get(hook)
            )
            results.append(result)
            if result.verdict is Verdict.SUCCESS:
                break
        return results

    async def publish(
        self,
        target: Target,
        hook: str,
        body: bytes,
        headers: Mapping[str, str],
        client: ClientCert | None = None,
    ) -> AttemptResult:
        """Publish once to `target` (the broker of the hook `hook`) and wait for its
        confirmation; never raises for anything the broker or network does. The broker's
        answer is kept as the attempt's response head, its refusal as the error."""
        started_at = time.time()
        clock = time.monotonic()
        try:
            answer = await self._publishers.publish(target, body, headers, client)
        except PublishFailed as failure:
            return self._error(hook, started_at, clock, failure.error_class, failure.reason)
        except Exception as error:
            log.exception("publishing to %s failed inside efd", target.label)
            return self._error(hook, started_at, clock, "internal", repr(error))
        return AttemptResult(
            hook_url=hook,
            started_at=started_at,
            duration=time.monotonic() - clock,
            verdict=Verdict.SUCCESS,
            response_head=answer[: self._head_bytes] if self._head_bytes else None,
        )

    async def _authorized(
        self,
        route: str,
        auth: Auth,
        url: str,
        hook: str,
        body: bytes,
        headers: dict[str, str],
        client: ClientCert | None,
        method: str,
    ) -> list[AttemptResult]:
        """One hook's requests under `auth`: Bearer's and Basic's fixed header; an OAuth2
        token, fetched again once and the request sent again after a 401 (the 401 is then
        an attempt of its own, recorded as RENEWED). No token: an attempt with error class
        `token`, and no request to the receiver."""
        if not isinstance(auth, ClientCredentials):
            headers["Authorization"] = auth.header()
            secrets = _auth_secrets(auth)
            return [await self.post(url, body, headers, client, method, hook, secrets)]
        source = self._token_source(route, auth)
        started_at, clock = time.time(), time.monotonic()
        try:
            token = await source.token()
        except tokens.TokenFailed as failure:
            return [self._error(hook, started_at, clock, failure.error_class, failure.message, url)]
        secrets = (*auth.secrets(), token.value)
        headers["Authorization"] = token.header()
        first = await self.post(url, body, headers, client, method, hook, secrets)
        if first.status_code != 401:
            return [first]
        first.verdict = Verdict.RETRY
        first.error_class = tokens.ERROR_CLASS
        first.error = RENEWED
        started_at, clock = time.time(), time.monotonic()
        try:
            renewed = await source.renew(token)
        except tokens.TokenFailed as failure:
            error = self._error(hook, started_at, clock, failure.error_class, failure.message, url)
            return [first, error]
        headers["Authorization"] = renewed.header()
        secrets = (*secrets, renewed.value)
        return [first, await self.post(url, body, headers, client, method, hook, secrets)]

    def start_round(
        self,
        route: Route,
        urls: Sequence[str],
        body: str,
        message: MessageKey,
        url: str | None = None,
        trace: RoundTrace | None = None,
    ) -> asyncio.Future[list[AttemptResult]]:
        """send_round as the dispatcher's `Rounds` starts it (a task in this process); its
        attempts traced when telemetry is on."""
        assert self._loop is not None, "Sender.start() was not awaited"
        webhook_id = webhooks.route_webhook_id(route, message)
        if trace is None or (tracer := tracing.current()) is None:
            return self._loop.create_task(self.send_round(route, urls, body, webhook_id, url))
        spans = tracer.round(route.name, route.method, urls, route.labels, url, trace)
        task = self._loop.create_task(
            self.send_round(route, urls, body, webhook_id, url, spans.wire)
        )
        task.add_done_callback(spans.finish_task)
        return task

    def start_batch(
        self,
        route: Route,
        body: bytes,
        webhook_id: str,
        url: str | None = None,
        first_event: int | None = None,
    ) -> asyncio.Future[list[AttemptResult]]:
        """send_batch as the batcher starts it (a task in this process)."""
        assert self._loop is not None, "Sender.start() was not awaited"
        return self._loop.create_task(self.send_batch(route, body, webhook_id, url, first_event))

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
        self,
        url: str,
        body: bytes,
        headers: dict[str, str],
        client: ClientCert | None = None,
        method: str = "POST",
        hook: str | None = None,
        secrets: tuple[str, ...] = (),
    ) -> AttemptResult:
        """Send once (a POST, or `method`) to `url`, presenting `client`'s certificate if
        given; never raises for anything the receiver or network does. The result names
        `hook` (the configured hook URL an action's own URL stands in for; `url` when not
        given); `secrets` (what the request's Authorization carries) are masked in what is
        kept of the answer, which a receiver may echo."""
        assert self._client is not None, "Sender.start() was not awaited"
        label = hook or url
        started_at = time.time()
        clock = time.monotonic()
        context: ssl.SSLContext | None = None  # None: the client's, which presents none
        if client is not None:
            try:
                context = self._client_context(client)
            except tls.ClientCertError as error:  # the files changed since the last reload
                return self._error(label, started_at, clock, "client_cert", str(error), url)
        try:
            answer = await self._client.post(url, body, headers, context, method=method)
        except http1.RequestFailed as failure:
            message = outauth.scrub(failure.message, secrets) if secrets else failure.message
            return self._error(label, started_at, clock, failure.error_class, message, url)
        except Exception as error:
            log.exception("sending to %s failed inside efd", webhooks.redact_url(url))
            message = outauth.scrub(repr(error), secrets) if secrets else repr(error)
            return self._error(label, started_at, clock, "internal", message, url)
        duration = time.monotonic() - clock
        status = answer.status
        verdict = classify_status(status)
        retry_after = None
        if verdict is Verdict.RETRY:
            retry_after = parse_retry_after(answer.retry_after, time.time())
        # A receiver may echo the URL it was called at, or the request's headers: the
        # credentials stay hidden.
        head = webhooks.scrub(answer.head.decode("utf-8", "replace"), url)
        if secrets:
            head = outauth.scrub(head, secrets)
        return AttemptResult(
            hook_url=label,
            started_at=started_at,
            duration=duration,
            verdict=verdict,
            status_code=status,
            response_head=head,
            retry_after=retry_after,
        )

    def _error(
        self,
        hook: str,
        started_at: float,
        clock: float,
        error_class: str,
        message: str,
        url: str | None = None,
    ) -> AttemptResult:
        return AttemptResult(
            hook_url=hook,
            started_at=started_at,
            duration=time.monotonic() - clock,
            verdict=classify_error(error_class),
            error_class=error_class,
            # An error may quote the URL (one that cannot be parsed, say).
            error=webhooks.scrub(message, url or hook)[:500],
        )


def _with_auth(static: Mapping[str, str], headers: Mapping[str, str]) -> dict[str, str]:
    """An authenticated request's headers but Authorization, which its auth sets in place of
    one among the static headers (in whatever case: only one is sent)."""
    merged = {name: value for name, value in static.items() if name.lower() != "authorization"}
    merged.update(headers)
    return merged


def _traced(static: Mapping[str, str], traceparent: str, state: str) -> dict[str, str]:
    """A hook's static headers with its attempt's trace headers, which replace any of the
    same names (in whatever case)."""
    merged = {name: value for name, value in static.items() if name.lower() not in _TRACE_HEADERS}
    merged["traceparent"] = traceparent
    if state:
        merged["tracestate"] = state
    return merged


def _auth_secrets(auth: outauth.Bearer | outauth.Basic) -> tuple[str, ...]:
    """What a fixed Authorization header carries that must not be kept of an answer."""
    if isinstance(auth, outauth.Bearer):
        return (auth.token,)
    return (auth.password, auth.header().removeprefix("Basic "))


# -- sender processes ------------------------------------------------------------------------

_INTERRUPTED = "the sender process exited before the answer; the outcome is unknown"
# What a batch's frame to a sender process names in place of a destination: no route's name
# holds a NUL.
BATCH = "\x00batch"

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
    proxy: proxyrules.Egress | None = None

    def sender(self) -> Sender:
        return Sender(
            timeout=self.timeout,
            allowed_networks=self.allowed_networks,
            ca_file=self.ca_file,
            response_head_bytes=self.response_head_bytes,
            proxy=self.proxy,
        )


class SenderChild:
    """A sender process's handler (efd/processes/pool.py): rounds by destination name, answered
    as plain tuples."""

    def __init__(self, setup: dict[str, Any]) -> None:
        self._routes: dict[str, Route] = {route.name: route for route in setup["routes"]}
        self._sender = setup["options"].sender()
        self._sender.configure_auths(setup.get("auths", {}))
        self._sender.configure_targets(setup.get("targets", {}))

    async def start(self) -> None:
        await self._sender.start()

    def configure(self, update: dict[str, Any]) -> None:
        if "routes" in update:  # rounds in flight keep the Route they started with
            self._routes = {route.name: route for route in update["routes"]}
        if "auths" in update:  # and the auth; unchanged credentials keep their token
            self._sender.configure_auths(update["auths"])
        if "targets" in update:  # the brokers' connections stay with the publishers
            self._sender.configure_targets(update["targets"])

    async def __call__(
        self,
        destination: str,
        urls: tuple[str, ...],
        body: str,
        message: MessageKey,
        url: str | None = None,
        trace_headers: TraceHeaders | None = None,
    ) -> Any:
        if destination == BATCH:  # a batch's request: SenderPool.start_batch's frame
            return await self._batch(urls)
        try:
            # The webhook-id is derived here, on the sender's core, not in the daemon's loop.
            route = self._routes[destination]
            results = await self._sender.send_round(
                route, urls, body, webhooks.route_webhook_id(route, message), url, trace_headers
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

    async def _batch(self, frame: tuple[Any, ...]) -> Any:
        destination, body, webhook_id, url, first_event = frame
        try:
            route = self._routes[destination]
            results = await self._sender.send_batch(route, body, webhook_id, url, first_event)
        except Exception as error:  # a bug, not the network: report it, keep serving
            log.exception("sending a batch to %s failed", destination)
            hook = url or destination
            results = [
                AttemptResult(
                    hook,
                    time.time(),
                    0.0,
                    Verdict.RETRY,
                    error_class="internal",
                    error=webhooks.scrub(repr(error), hook),
                )
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
        auths: Mapping[str, Auth] | None = None,
        targets: Mapping[str, Mapping[str, Target]] | None = None,
    ) -> None:
        self._pool = Pool(
            "sender",
            processes,
            "efd.delivery.sender:SenderChild",
            {
                "options": options,
                "routes": list(routes),
                "auths": dict(auths or {}),
                "targets": dict(targets or {}),
            },
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

    async def reload(
        self,
        routes: Sequence[Route],
        log_level: str,
        auths: Mapping[str, Auth] | None = None,
        targets: Mapping[str, Mapping[str, Target]] | None = None,
    ) -> None:
        await self._pool.configure(
            {
                "routes": list(routes),
                "auths": dict(auths or {}),
                "targets": dict(targets or {}),
                "log_level": log_level,
            }
        )

    def start_round(
        self,
        route: Route,
        urls: Sequence[str],
        body: str,
        message: MessageKey,
        url: str | None = None,
        trace: RoundTrace | None = None,
    ) -> asyncio.Future[list[AttemptResult]]:
        convert = functools.partial(_results, urls, time.time())
        if trace is not None and (tracer := tracing.current()) is not None:
            # The spans are the daemon's: the process sends their headers, and exports none.
            spans = tracer.round(route.name, route.method, urls, route.labels, url, trace)
            return self._pool.submit(
                route.name,
                tuple(urls),
                body,
                message,
                url,
                spans.wire,
                convert=functools.partial(_finished, convert, spans.finish),
            )
        if url is None:  # a webhook's round: the frame a byte shorter
            return self._pool.submit(route.name, tuple(urls), body, message, convert=convert)
        return self._pool.submit(route.name, tuple(urls), body, message, url, convert=convert)

    def start_batch(
        self,
        route: Route,
        body: bytes,
        webhook_id: str,
        url: str | None = None,
        first_event: int | None = None,
    ) -> asyncio.Future[list[AttemptResult]]:
        """Sender.start_batch in a sender process."""
        convert = functools.partial(_results, [route.hooks[0][0]], time.time())
        frame = (route.name, body, webhook_id, url, first_event)
        return self._pool.submit(BATCH, frame, "", None, convert=convert)


def _finished(
    convert: Callable[[Any], list[AttemptResult]],
    finish: Callable[[list[AttemptResult]], None],
    answer: Any,
) -> list[AttemptResult]:
    """A traced round's results, its spans ended with them."""
    results = convert(answer)
    finish(results)
    return results


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
