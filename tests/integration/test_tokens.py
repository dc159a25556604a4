"""An action's OAuth2 token source (efd/delivery/tokens.py) against a real token endpoint on
127.0.0.1, asked with efd's own HTTP client: reuse, expiry, renewal after a 401, failures,
one fetch for concurrent deliveries, the address guard, TLS verification, and no secret in
logs or reprs."""

from __future__ import annotations

import asyncio
import base64
import logging
import ssl
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
import trustme
import uvloop
from aiohttp import web

from efd.delivery import http1, netguard, tls
from efd.delivery.outauth import ClientCredentials, Token
from efd.delivery.tokens import TokenFailed, TokenSource, token_client
from tests.conftest import Receiver, ReceiverFactory, free_port

LOOPBACK = netguard.parse_networks(["127.0.0.0/8", "::1/128"])
SECRET = "cs-9f8e7d-SECRET"
ACCESS = "at-SECRET-"  # each token the endpoint issues: this and its number


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


class Endpoint:
    """A token endpoint: issues ACCESS<n> for the n-th request with `expires_in`, or
    answers `status` and `body` as set; waits for `gate` first when one is set."""

    def __init__(self, expires_in: float | None = 100) -> None:
        self.expires_in = expires_in
        self.status = 200
        self.body: bytes | None = None
        self.gate: asyncio.Event | None = None

    async def __call__(self, _request: web.Request, n: int) -> web.StreamResponse:
        if self.gate is not None:
            await self.gate.wait()
        if self.body is not None or self.status != 200:
            return web.Response(status=self.status, body=self.body or b"")
        document: dict[str, object] = {"access_token": f"{ACCESS}{n}", "token_type": "Bearer"}
        if self.expires_in is not None:
            document["expires_in"] = self.expires_in
        return web.json_response(document)


def credentials(url: str, **changes: str) -> ClientCredentials:
    values = {"client_id": "efd", "client_secret": SECRET, "scope": "orders:write"}
    values.update(changes)
    return ClientCredentials(url.replace("/hook", "/token"), **values)  # type: ignore[arg-type]


@pytest.fixture
async def client() -> AsyncIterator[http1.Client]:
    made = token_client(timeout=5.0, allowed=LOOPBACK, tls=tls.verifying(None))
    yield made
    await made.close()


async def started(
    receiver_factory: ReceiverFactory, endpoint: Endpoint
) -> tuple[Receiver, Endpoint]:
    return await receiver_factory(endpoint), endpoint


async def failure(source: TokenSource) -> TokenFailed:
    with pytest.raises(TokenFailed) as caught:
        await source.token()
    assert caught.value.error_class == "token"
    return caught.value


async def test_the_token_is_fetched_once_and_reused(
    receiver_factory: ReceiverFactory, client: http1.Client
) -> None:
    receiver, _ = await started(receiver_factory, Endpoint())
    source = TokenSource(credentials(receiver.url), client, Clock())
    first = await source.token()
    assert first.header() == f"Bearer {ACCESS}1"
    assert (await source.token()) is first
    assert source.fetches == len(receiver.received) == 1
    request = receiver.received[0]
    assert request.path == "/token"
    assert request.body == b"grant_type=client_credentials&scope=orders%3Awrite"
    pair = base64.b64encode(f"efd:{SECRET}".encode()).decode()
    assert request.headers["Authorization"] == f"Basic {pair}"
    assert request.headers["Content-Type"] == "application/x-www-form-urlencoded"
    assert request.headers["Accept"] == "application/json"


async def test_client_secret_post_sends_the_pair_in_the_body(
    receiver_factory: ReceiverFactory, client: http1.Client
) -> None:
    receiver, _ = await started(receiver_factory, Endpoint())
    source = TokenSource(credentials(receiver.url, client_auth="post"), client, Clock())
    await source.token()
    request = receiver.received[0]
    assert "Authorization" not in request.headers
    assert request.body == (
        b"grant_type=client_credentials&scope=orders%3Awrite&client_id=efd"
        b"&client_secret=cs-9f8e7d-SECRET"
    )


async def test_the_token_is_fetched_again_once_expired_less_the_margin(
    receiver_factory: ReceiverFactory, client: http1.Client
) -> None:
    receiver, _ = await started(receiver_factory, Endpoint(expires_in=100))
    clock = Clock()
    source = TokenSource(credentials(receiver.url), client, clock)
    first = await source.token()
    clock.now += 89.9  # just before its lifetime less the margin
    assert (await source.token()) is first
    clock.now += 0.1
    second = await source.token()
    assert second.value == f"{ACCESS}2"
    assert (await source.token()) is second
    assert len(receiver.received) == 2


async def test_without_expires_in_the_token_is_reused_for_the_default_lifetime(
    receiver_factory: ReceiverFactory, client: http1.Client
) -> None:
    receiver, _ = await started(receiver_factory, Endpoint(expires_in=None))
    clock = Clock()
    source = TokenSource(credentials(receiver.url), client, clock)
    first = await source.token()
    clock.now += 299.9
    assert (await source.token()) is first
    clock.now += 0.1
    assert (await source.token()).value == f"{ACCESS}2"


async def test_a_401_fetches_a_new_token_once_for_every_delivery_it_refused(
    receiver_factory: ReceiverFactory, client: http1.Client
) -> None:
    receiver, endpoint = await started(receiver_factory, Endpoint())
    source = TokenSource(credentials(receiver.url), client, Clock())
    refused = await source.token()
    endpoint.gate = asyncio.Event()
    # Several deliveries sent with the same token were all refused.
    renewing = [asyncio.create_task(source.renew(refused)) for _ in range(3)]
    await receiver.wait_for(2)
    endpoint.gate.set()
    renewed = await asyncio.gather(*renewing)
    assert {t.value for t in renewed} == {f"{ACCESS}2"}
    # A late refusal of the old token, and later deliveries, use the renewed one.
    assert (await source.renew(refused)) is renewed[0]
    assert (await source.token()) is renewed[0]
    await asyncio.sleep(0.05)
    assert source.fetches == len(receiver.received) == 2


async def test_concurrent_deliveries_wait_for_one_fetch(
    receiver_factory: ReceiverFactory, client: http1.Client
) -> None:
    receiver, endpoint = await started(receiver_factory, Endpoint())
    endpoint.gate = asyncio.Event()
    source = TokenSource(credentials(receiver.url), client, Clock())
    waiting = [asyncio.create_task(source.token()) for _ in range(20)]
    await receiver.wait_for(1)
    waiting[0].cancel()  # one delivery stops waiting: the others' fetch goes on
    endpoint.gate.set()
    tokens = await asyncio.gather(*waiting[1:])
    assert {t.value for t in tokens} == {f"{ACCESS}1"}
    assert waiting[0].cancelled()
    assert source.fetches == len(receiver.received) == 1


def test_one_fetch_for_concurrent_deliveries_on_uvloop_as_in_a_sender_process() -> None:
    async def scenario() -> tuple[int, set[str]]:
        endpoint = Endpoint()
        endpoint.gate = asyncio.Event()
        receiver = await Receiver(endpoint).start()
        client = token_client(timeout=5.0, allowed=LOOPBACK, tls=tls.verifying(None))
        try:
            source = TokenSource(credentials(receiver.url), client, Clock())
            waiting = [asyncio.create_task(source.token()) for _ in range(10)]
            await receiver.wait_for(1)
            endpoint.gate.set()
            tokens = await asyncio.gather(*waiting)
            return len(receiver.received), {t.value for t in tokens}
        finally:
            await client.close()
            await receiver.stop()

    assert uvloop.run(scenario()) == (1, {f"{ACCESS}1"})


async def test_an_endpoint_that_is_down_is_a_retryable_token_failure(client: http1.Client) -> None:
    source = TokenSource(credentials(f"http://127.0.0.1:{free_port()}/hook"), client, Clock())
    failed = await failure(source)
    assert failed.message.startswith("token endpoint: connect: ")
    # Nothing is remembered of a failure: the next delivery asks again.
    assert (await failure(source)).message == failed.message
    assert source.fetches == 2


@pytest.mark.parametrize(
    ("status", "body", "message"),
    [
        (500, b"<h1>down</h1>", "HTTP 500"),
        (503, b'{"error":"temporarily_unavailable"}', "HTTP 503: temporarily_unavailable"),
        (200, b"not json", "HTTP 200: the answer is not a JSON object"),
        (200, b'{"token_type":"Bearer"}', "HTTP 200: no access_token in the answer"),
        (200, b'{"access_token":"x","token_type":"MAC"}', "token_type 'MAC' is not Bearer"),
        (401, b'{"error":"invalid_client","error_description":"secret cs-9f8e7d-SECRET is wrong"}',
         "HTTP 401: invalid_client (secret *** is wrong)"),
    ],
)  # fmt: skip
async def test_an_endpoint_without_a_usable_token_is_a_token_failure_with_the_reason(
    receiver_factory: ReceiverFactory,
    client: http1.Client,
    status: int,
    body: bytes,
    message: str,
) -> None:
    receiver, endpoint = await started(receiver_factory, Endpoint())
    endpoint.status, endpoint.body = status, body
    source = TokenSource(credentials(receiver.url), client, Clock())
    assert (await failure(source)).message == "token endpoint: " + message
    endpoint.status, endpoint.body = 200, None  # the endpoint recovers: the next delivery gets one
    assert (await source.token()).value == f"{ACCESS}2"


async def test_a_token_answer_longer_than_a_hook_answer_is_read_whole(
    receiver_factory: ReceiverFactory, client: http1.Client
) -> None:
    long_token = "eyJ" + "a" * 4000  # JWTs are often longer than what is kept of a hook's answer
    endpoint = Endpoint()
    endpoint.body = f'{{"access_token":"{long_token}","token_type":"Bearer"}}'.encode()
    receiver, _ = await started(receiver_factory, endpoint)
    source = TokenSource(credentials(receiver.url), client, Clock())
    assert (await source.token()).value == long_token


async def test_the_address_guard_refuses_a_private_token_endpoint_unless_allowed(
    receiver_factory: ReceiverFactory, client: http1.Client
) -> None:
    receiver, _ = await started(receiver_factory, Endpoint())
    guarded = token_client(timeout=5.0, allowed=(), tls=tls.verifying(None))
    try:
        source = TokenSource(credentials(receiver.url), guarded, Clock())
        failed = await failure(source)
        assert failed.message == (
            "token endpoint: blocked: efd address guard: loopback address 127.0.0.1 is not allowed"
        )
        assert receiver.received == []
        allowed = TokenSource(credentials(receiver.url), client, Clock())  # loopback allowed
        assert (await allowed.token()).value == f"{ACCESS}1"
    finally:
        await guarded.close()


@pytest.fixture
def authority(tmp_path: Path) -> tuple[trustme.CA, Path]:
    ca = trustme.CA()
    ca_file = tmp_path / "ca.pem"
    ca.cert_pem.write_to_path(str(ca_file))
    return ca, ca_file


async def test_tls_verification_refuses_an_endpoint_whose_ca_is_not_trusted(
    receiver_factory: ReceiverFactory, authority: tuple[trustme.CA, Path]
) -> None:
    ca, ca_file = authority
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    ca.issue_cert("localhost").configure_cert(context)
    receiver = await receiver_factory(Endpoint(), ssl_context=context)
    assert receiver.url.startswith("https://localhost:")
    untrusting = token_client(timeout=5.0, allowed=LOOPBACK, tls=tls.verifying(None))
    trusting = token_client(timeout=5.0, allowed=LOOPBACK, tls=tls.verifying(str(ca_file)))
    try:
        failed = await failure(TokenSource(credentials(receiver.url), untrusting, Clock()))
        assert failed.message.startswith("token endpoint: tls: certificate rejected: ")
        assert receiver.received == []
        token = await TokenSource(credentials(receiver.url), trusting, Clock()).token()
        assert token.value == f"{ACCESS}1"
    finally:
        await untrusting.close()
        await trusting.close()


async def test_no_secret_or_token_in_logs_reprs_or_reasons(
    receiver_factory: ReceiverFactory, client: http1.Client, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG)
    receiver, endpoint = await started(receiver_factory, Endpoint())
    source = TokenSource(credentials(receiver.url), client, Clock())
    token: Token = await source.token()
    shown = [repr(source), repr(token), str(token), repr(credentials(receiver.url).request())]
    endpoint.status, endpoint.body = (
        401,
        b'{"error":"invalid_client","error_description":"%s"}' % (SECRET.encode()),
    )
    failed = await failure(TokenSource(credentials(receiver.url), client, Clock()))
    shown += [failed.message, repr(failed), str(failed)]
    logging.getLogger("efd").info("source %r token %r failed %s", source, token, failed)
    text = caplog.text + " ".join(shown)
    assert "source TokenSource(ClientCredentials(" in text  # the log line above was captured
    assert SECRET not in text
    assert ACCESS not in text
