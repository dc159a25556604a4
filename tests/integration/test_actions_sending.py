"""The sending side of an action (docs/actions.md#sending) against real receivers and a real
OAuth2 token endpoint on 127.0.0.1: PUT and PATCH to the delivery's own URL with the exact
body, its Content-Type and both signatures; Bearer, Basic and client-credentials auth, in
this process and in a sender process, on start and on reload; the token's reuse, its renewal
after a 401, an endpoint that is down (a retry of class `token`, the receiver's circuit
untouched) and the address guard on the token URL; no secret or token in the logs or the
attempts table."""

from __future__ import annotations

import base64
import hashlib
import hmac
import json
import logging
from collections.abc import AsyncIterator
from typing import Any

import pytest
from aiohttp import web
from standardwebhooks.webhooks import Webhook

from efd.delivery import outauth
from efd.delivery.outauth import Basic, Bearer, ClientCredentials
from efd.delivery.retry import AttemptResult, Verdict
from efd.delivery.sender import RENEWED, Sender, SenderOptions, SenderPool
from efd.segment import webhooks
from efd.segment.webhooks import Route
from tests.conftest import (
    DaemonFactory,
    Received,
    Receiver,
    ReceiverFactory,
    eventually,
    free_port,
    post,
    settings_dict,
    sql,
)

SHARED = "s3cret-shared"
WHSEC = "whsec_" + base64.b64encode(b"standard-webhooks-key-32-bytes!!").decode()
CLIENT_SECRET = "cs-77aa-CLIENT-SECRET"
ACCESS = "at-TOKEN-"  # each token the endpoint issues: this and its number
BEARER = "static-BEARER-token-0042"
PASSWORD = "pw-BASIC-password-9"
MESSAGE = (17, "web", "m-17", 1_700_000_000.5)  # a stored message's key: its webhook-id
JSON_BODY = '{"order_id":"o-17","email":"ann@x.com","summary":"u 1 paid 19.5","n":1e+21}'
FORM_BODY = "order_id=o-17&email=ann%40x.com&summary=u+1+paid+19.5&items=%5B1%5D"
TARGET = "/users/u%201%2F2/orders?ref=o-17&q=a%26b%3Dc"  # the rendered path and query
JSON = "application/json"
FORM = "application/x-www-form-urlencoded"


def route(hook: str, method: str = "POST", content_type: str = JSON, **static: str) -> Route:
    return Route(
        name="crm/orders",
        hooks=((hook, {"X-Source": "efd", **static}),),
        secret=SHARED,
        user_agent="efd/1.0",
        standard_secrets=(webhooks.standard_secret(WHSEC),),
        method=method,
        content_type=content_type,
    )


def own_url(receiver: Receiver) -> str:
    """The URL rendered for the delivery: the hook's origin, the message's path and query."""
    return receiver.url.removesuffix("/hook") + TARGET


def assert_signed(got: Received, body: bytes) -> None:
    """Both signatures cover exactly the bytes received, computed here from the secrets."""
    expected = hmac.new(SHARED.encode(), body, hashlib.sha1).hexdigest()
    assert got.headers["X-Signature"] == expected
    webhook_id = webhooks.webhook_id(*MESSAGE)
    assert got.headers["webhook-id"] == webhook_id
    signed = f"{webhook_id}.{got.headers['webhook-timestamp']}.".encode() + body
    key = webhooks.standard_secret(WHSEC)
    mac = base64.b64encode(hmac.new(key, signed, hashlib.sha256).digest()).decode()
    assert got.headers["webhook-signature"] == f"v1,{mac}"
    Webhook(WHSEC).verify(got.body, got.headers, json_parse=False)  # the stock library agrees


def authorizations(got: Received) -> list[str]:
    return [value for name, value in got.header_lines if name.lower() == "authorization"]


@pytest.fixture
async def sender() -> AsyncIterator[Sender]:
    made = Sender(timeout=5, allowed_networks=["127.0.0.0/8"])
    await made.start()
    yield made
    await made.close()


async def one_round(
    sender: Sender | SenderPool, r: Route, body: str, url: str | None
) -> list[AttemptResult]:
    hook = r.hooks[0][0]
    return await sender.start_round(r, [hook], body, MESSAGE, url)


# -- method, URL, headers, body, signatures ----------------------------------------------------


@pytest.mark.parametrize("method", ["PUT", "PATCH", "POST"])
@pytest.mark.parametrize(("content_type", "body"), [(JSON, JSON_BODY), (FORM, FORM_BODY)])
async def test_the_request_goes_to_the_deliverys_own_url_as_the_route_says(
    receiver_factory: ReceiverFactory,
    sender: Sender,
    method: str,
    content_type: str,
    body: str,
) -> None:
    receiver = await receiver_factory()
    r = route(receiver.url, method, content_type)
    [result] = await one_round(sender, r, body, own_url(receiver))
    [got] = receiver.received
    assert got.method == method
    assert got.target == TARGET
    assert got.body == body.encode()
    assert got.headers["Content-Type"] == content_type
    assert got.headers["X-Source"] == "efd"
    assert got.headers["User-Agent"] == "efd/1.0"
    assert got.headers["Content-Length"] == str(len(body))
    assert authorizations(got) == []  # no auth configured: none from efd
    assert_signed(got, body.encode())
    # The attempt names the configured hook, not the URL it went to.
    assert (result.hook_url, result.verdict, result.status_code) == (
        receiver.url,
        Verdict.SUCCESS,
        200,
    )


async def test_without_an_own_url_the_hooks_url_is_used(
    receiver_factory: ReceiverFactory, sender: Sender
) -> None:
    receiver = await receiver_factory()
    [result] = await one_round(sender, route(receiver.url, "PUT"), JSON_BODY, None)
    [got] = receiver.received
    assert (got.method, got.target, result.verdict) == ("PUT", "/hook", Verdict.SUCCESS)


async def test_a_sender_process_sends_the_same_request_with_auth_from_start_and_reload(
    receiver_factory: ReceiverFactory,
) -> None:
    receiver = await receiver_factory()
    patch = route(receiver.url, "PATCH", FORM)
    pool = SenderPool(
        processes=1,
        options=SenderOptions(5, ("127.0.0.0/8",), None, 512),
        routes=[patch],
        log_level="WARNING",
        log_format="text",
        auths={patch.name: Bearer(BEARER)},
    )
    await pool.start()
    try:
        [first] = await one_round(pool, patch, FORM_BODY, own_url(receiver))
        put = route(receiver.url, "PUT", JSON)
        await pool.reload([put], "WARNING", {put.name: Basic("efd", PASSWORD)})
        [second] = await one_round(pool, put, JSON_BODY, own_url(receiver))
        await pool.reload([put], "WARNING", {})
        [third] = await one_round(pool, put, JSON_BODY, None)
    finally:
        await pool.close(5)
    assert [r.hook_url for r in (first, second, third)] == [receiver.url] * 3
    assert [r.status_code for r in (first, second, third)] == [200] * 3
    one, two, three = receiver.received
    assert (one.method, one.target, one.body) == ("PATCH", TARGET, FORM_BODY.encode())
    assert one.headers["Content-Type"] == FORM
    assert authorizations(one) == [f"Bearer {BEARER}"]
    assert_signed(one, FORM_BODY.encode())
    assert (two.method, two.target, two.headers["Content-Type"]) == ("PUT", TARGET, JSON)
    pair = base64.b64encode(f"efd:{PASSWORD}".encode()).decode()
    assert authorizations(two) == [f"Basic {pair}"]
    assert_signed(two, JSON_BODY.encode())
    assert (three.target, authorizations(three)) == ("/hook", [])


# -- fixed auth ------------------------------------------------------------------------------


async def test_bearer_and_basic_replace_a_static_authorization_and_a_401_is_final(
    receiver_factory: ReceiverFactory, sender: Sender
) -> None:
    async def refuse(_request: web.Request, _n: int) -> web.StreamResponse:
        return web.Response(status=401)

    receiver = await receiver_factory(refuse)
    r = route(receiver.url, "PUT", authorization="Bearer from-the-static-headers")
    sender.configure_auths({r.name: Bearer(BEARER)})
    [result] = await one_round(sender, r, JSON_BODY, own_url(receiver))
    assert (result.status_code, result.verdict, result.error_class) == (401, Verdict.FAIL, None)
    sender.configure_auths({r.name: Basic("efd user", PASSWORD)})
    await one_round(sender, r, JSON_BODY, own_url(receiver))
    bearer, basic = receiver.received  # one request each: no renewal for a fixed credential
    assert authorizations(bearer) == [f"Bearer {BEARER}"]
    pair = base64.b64encode(f"efd user:{PASSWORD}".encode()).decode()
    assert authorizations(basic) == [f"Basic {pair}"]


# -- OAuth2 client credentials ---------------------------------------------------------------


class Clock:
    def __init__(self) -> None:
        self.now = 5000.0

    def __call__(self) -> float:
        return self.now


class Endpoint:
    """A token endpoint: ACCESS<n> for the n-th request, with `expires_in`; `status` other
    than 200 answers that instead."""

    def __init__(self, expires_in: float = 100) -> None:
        self.expires_in = expires_in
        self.status = 200

    async def __call__(self, request: web.Request, n: int) -> web.StreamResponse:
        if self.status != 200:
            return web.json_response({"error": "temporarily_unavailable"}, status=self.status)
        form = await request.post()
        assert form["grant_type"] == "client_credentials"
        return web.json_response(
            {"access_token": f"{ACCESS}{n}", "token_type": "Bearer", "expires_in": self.expires_in}
        )


def credentials(token_url: str, scope: str = "orders:write") -> ClientCredentials:
    return ClientCredentials(token_url, "efd", CLIENT_SECRET, scope)


def token_url(receiver: Receiver) -> str:
    return receiver.url.removesuffix("/hook") + "/oauth/token"


async def oauth_sender(clock: Clock, allowed: list[str] | None = None) -> Sender:
    made = Sender(timeout=5, allowed_networks=allowed or ["127.0.0.0/8"], token_clock=clock)
    await made.start()
    return made


async def test_the_token_is_reused_until_shortly_before_it_expires(
    receiver_factory: ReceiverFactory,
) -> None:
    endpoint = await receiver_factory(Endpoint(expires_in=100))
    receiver = await receiver_factory()
    clock = Clock()
    sender = await oauth_sender(clock)
    r = route(receiver.url, "PUT")
    sender.configure_auths({r.name: credentials(token_url(endpoint))})
    try:
        await one_round(sender, r, JSON_BODY, own_url(receiver))
        clock.now += 89.9  # its 100 s less a tenth
        await one_round(sender, r, JSON_BODY, own_url(receiver))
        clock.now += 0.1
        await one_round(sender, r, JSON_BODY, own_url(receiver))
    finally:
        await sender.close()
    assert [authorizations(got) for got in receiver.received] == [
        [f"Bearer {ACCESS}1"],
        [f"Bearer {ACCESS}1"],
        [f"Bearer {ACCESS}2"],
    ]
    assert [got.target for got in endpoint.received] == ["/oauth/token"] * 2
    assert endpoint.received[0].body == b"grant_type=client_credentials&scope=orders%3Awrite"


async def test_a_401_renews_the_token_once_and_sends_again_in_the_same_round(
    receiver_factory: ReceiverFactory,
) -> None:
    refused = {f"Bearer {ACCESS}1"}
    refuse_all = False

    async def refuse_old_tokens(request: web.Request, _n: int) -> web.StreamResponse:
        if refuse_all or request.headers["Authorization"] in refused:
            return web.Response(status=401)
        return web.Response(status=200)

    endpoint = await receiver_factory(Endpoint())
    receiver = await receiver_factory(refuse_old_tokens)
    sender = await oauth_sender(Clock())
    r = route(receiver.url, "PATCH", FORM)
    sender.configure_auths({r.name: credentials(token_url(endpoint))})
    try:
        renewed = await one_round(sender, r, FORM_BODY, own_url(receiver))
        reused = await one_round(sender, r, FORM_BODY, own_url(receiver))
        refuse_all = True  # the receiver refuses the new token too
        final = await one_round(sender, r, FORM_BODY, own_url(receiver))
    finally:
        await sender.close()
    # Both requests of the round are attempts: the 401 says it was renewed, retried at once.
    assert [(a.status_code, a.verdict, a.error_class, a.error) for a in renewed] == [
        (401, Verdict.RETRY, "token", RENEWED),
        (200, Verdict.SUCCESS, None, None),
    ]
    assert {a.hook_url for a in renewed + reused + final} == {receiver.url}
    assert [a.status_code for a in reused] == [200]
    # Once only: a 401 to the renewed token is the receiver's answer.
    assert [(a.status_code, a.verdict) for a in final] == [
        (401, Verdict.RETRY),
        (401, Verdict.FAIL),
    ]
    assert [authorizations(got)[0] for got in receiver.received] == [
        f"Bearer {ACCESS}1",
        f"Bearer {ACCESS}2",
        f"Bearer {ACCESS}2",
        f"Bearer {ACCESS}2",
        f"Bearer {ACCESS}3",
    ]
    assert len(endpoint.received) == 3
    for got in receiver.received:  # the same signed bytes each time
        assert (got.method, got.target, got.body) == ("PATCH", TARGET, FORM_BODY.encode())
        assert_signed(got, FORM_BODY.encode())


async def test_a_token_endpoint_that_is_down_is_a_retry_of_class_token_and_nothing_is_sent(
    receiver_factory: ReceiverFactory,
) -> None:
    receiver = await receiver_factory()
    sender = await oauth_sender(Clock())
    r = route(receiver.url, "PUT")
    port = free_port()
    sender.configure_auths({r.name: credentials(f"http://127.0.0.1:{port}/oauth/token")})
    try:
        [down] = await one_round(sender, r, JSON_BODY, own_url(receiver))
        endpoint = Endpoint()
        endpoint.status = 503
        await receiver_factory(endpoint, port=port)
        [refusing] = await one_round(sender, r, JSON_BODY, own_url(receiver))
        endpoint.status = 200
        [up] = await one_round(sender, r, JSON_BODY, own_url(receiver))
    finally:
        await sender.close()
    assert (down.verdict, down.error_class, down.status_code) == (Verdict.RETRY, "token", None)
    assert down.error is not None
    assert down.error.startswith("token endpoint: connect: ")
    assert down.hook_url == receiver.url
    assert (refusing.error_class, refusing.error) == (
        "token",
        "token endpoint: HTTP 503: temporarily_unavailable",
    )
    assert up.status_code == 200
    assert len(receiver.received) == 1  # only once a token was had


async def test_the_address_guard_applies_to_the_token_url(
    receiver_factory: ReceiverFactory,
) -> None:
    """A token endpoint at an address the guard refuses is never asked, even while the
    receiver's is allowed; allowed_networks that take it in let it be asked."""
    app = web.Application()
    asked: list[str] = []

    async def issue(request: web.Request) -> web.StreamResponse:
        asked.append(request.host)
        return web.json_response({"access_token": f"{ACCESS}1", "token_type": "bearer"})

    app.router.add_post("/oauth/token", issue)
    runner = web.AppRunner(app, access_log=None, shutdown_timeout=0.5)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.2", 0)
    await site.start()
    port = int(runner.addresses[0][1])
    receiver = await receiver_factory()
    r = route(receiver.url, "PUT")
    guarded = await oauth_sender(Clock(), allowed=["127.0.0.1/32"])
    allowing = await oauth_sender(Clock(), allowed=["127.0.0.1/32", "127.0.0.2/32"])
    auth = {r.name: credentials(f"http://127.0.0.2:{port}/oauth/token")}
    guarded.configure_auths(auth)
    allowing.configure_auths(auth)
    try:
        [blocked] = await one_round(guarded, r, JSON_BODY, own_url(receiver))
        assert asked == []
        assert receiver.received == []
        [sent] = await one_round(allowing, r, JSON_BODY, own_url(receiver))
    finally:
        await guarded.close()
        await allowing.close()
        await runner.cleanup()
    assert (blocked.error_class, blocked.error) == (
        "token",
        "token endpoint: blocked: efd address guard: loopback address 127.0.0.2 is not allowed",
    )
    assert blocked.verdict is Verdict.RETRY
    assert sent.status_code == 200
    assert len(asked) == 1
    assert authorizations(receiver.received[0]) == [f"Bearer {ACCESS}1"]


async def test_a_reload_keeps_the_token_while_the_credentials_are_unchanged(
    receiver_factory: ReceiverFactory,
) -> None:
    endpoint = await receiver_factory(Endpoint())
    receiver = await receiver_factory()
    sender = await oauth_sender(Clock())
    r = route(receiver.url, "PUT")
    url = token_url(endpoint)
    try:
        sender.configure_auths({r.name: credentials(url)})
        await one_round(sender, r, JSON_BODY, None)
        sender.configure_auths({r.name: credentials(url), "other/x": Bearer(BEARER)})
        await one_round(sender, r, JSON_BODY, None)
        sender.configure_auths({r.name: credentials(url, scope="orders:read")})
        await one_round(sender, r, JSON_BODY, None)
        sender.configure_auths({})
        await one_round(sender, r, JSON_BODY, None)
        sender.configure_auths({r.name: credentials(url)})  # a new source: a new token
        await one_round(sender, r, JSON_BODY, None)
    finally:
        await sender.close()
    assert [authorizations(got) for got in receiver.received] == [
        [f"Bearer {ACCESS}1"],
        [f"Bearer {ACCESS}1"],
        [f"Bearer {ACCESS}2"],
        [],
        [f"Bearer {ACCESS}3"],
    ]
    assert [got.body for got in endpoint.received][1:] == [
        b"grant_type=client_credentials&scope=orders%3Aread",
        b"grant_type=client_credentials&scope=orders%3Awrite",
    ]


# -- through the daemon: the attempts table, the logs, the circuit -----------------------------


def oauth_settings(db_url: str, receiver_url: str, token_url: str) -> dict[str, Any]:
    """A daemon whose one destination is an actions one, `crm`, with one action, `orders`,
    sending each track to `receiver_url` with a token from `token_url` (credentials())."""
    settings = settings_dict(db_url)
    settings["sources"][0]["destinations"] = ["crm"]
    auth = credentials(token_url)
    settings["destinations"] = [
        {
            "name": "crm",
            "type": "actions",
            "actions": [
                {
                    "name": "orders",
                    "trigger": 'type = "track"',
                    "url": receiver_url,
                    "auth": {
                        "type": "oauth2_client_credentials",
                        "token_url": auth.token_url,
                        "client_id": auth.client_id,
                        "client_secret": auth.client_secret,
                        "scope": auth.scope,
                    },
                }
            ],
        }
    ]
    return settings


@pytest.mark.parametrize("sender_processes", [0, 1])
async def test_no_secret_or_token_in_the_logs_or_the_attempts_table(
    db_url: str,
    receiver_factory: ReceiverFactory,
    daemon_factory: DaemonFactory,
    caplog: pytest.LogCaptureFixture,
    capfd: pytest.CaptureFixture[str],
    sender_processes: int,
) -> None:
    caplog.set_level(logging.DEBUG)

    async def echo_then_401_once(request: web.Request, n: int) -> web.StreamResponse:
        # A receiver that shows the request's headers in its answer, as debugging ones do.
        echoed = json.dumps(dict(request.headers))
        return web.Response(status=401 if n == 1 else 200, text=echoed)

    endpoint = await receiver_factory(Endpoint())
    receiver = await receiver_factory(echo_then_401_once)
    settings = oauth_settings(db_url, receiver.url, token_url(endpoint))
    settings["delivery"]["sender_processes"] = sender_processes
    settings["logging"] = {"level": "DEBUG"}
    daemon = await daemon_factory(settings)
    status, _ = await post(daemon.port, "/v1/track", {"userId": "u", "event": "E"})
    assert status == 200
    await eventually(
        lambda: sql(db_url, "SELECT status FROM deliveries") == [("delivered",)], timeout=20
    )
    rows = sql(
        db_url,
        "SELECT hook_url, outcome, status_code, error_class, error, response_head "
        "FROM attempts ORDER BY id",
    )
    assert [tuple(row[:5]) for row in rows] == [
        (receiver.url, "retry", 401, "token", RENEWED),
        (receiver.url, "success", 200, None, None),
    ]
    assert [authorizations(got) for got in receiver.received] == [
        [f"Bearer {ACCESS}1"],
        [f"Bearer {ACCESS}2"],
    ]
    assert "Bearer ***" in rows[0][5]  # what the receiver echoed, the token masked
    every_column = sql(db_url, "SELECT * FROM attempts") + sql(db_url, "SELECT * FROM deliveries")
    stored = repr(every_column)
    await daemon.stop()  # its sender process's last log lines are written
    logged = caplog.text + "".join(capfd.readouterr())
    assert "attempt 1" in logged  # the 401's warning line was captured
    for secret in (CLIENT_SECRET, ACCESS, outauth.form_encode(CLIENT_SECRET)):
        assert secret not in stored
        assert secret not in logged


async def test_a_token_endpoint_that_is_down_retries_and_leaves_the_receivers_circuit_closed(
    db_url: str,
    receiver_factory: ReceiverFactory,
    daemon_factory: DaemonFactory,
) -> None:
    receiver = await receiver_factory()
    port = free_port()
    url = f"http://127.0.0.1:{port}/oauth/token"
    settings = oauth_settings(db_url, receiver.url, url)
    settings["delivery"]["circuit_failures"] = 2
    daemon = await daemon_factory(settings)
    for n in range(5):
        status, _ = await post(daemon.port, "/v1/track", {"userId": f"u{n}", "event": "E"})
        assert status == 200

    def token_failures() -> list[Any]:
        rows = sql(db_url, "SELECT delivery_id, error_class, error FROM attempts")
        per_delivery = {row[0] for row in rows}
        return rows if len(per_delivery) == 5 and len(rows) >= 10 else []

    rows = await eventually(token_failures, timeout=20)
    assert {row[1] for row in rows} == {"token"}
    assert all(row[2].startswith("token endpoint: connect: ") for row in rows)
    # Five messages failed twice each, well past the threshold: the receiver's circuit
    # never opened, since it was never asked.
    assert daemon.metrics.circuit_open.get(("crm/orders", receiver.url), 0) == 0
    assert receiver.received == []
    assert {row[0] for row in sql(db_url, "SELECT status FROM deliveries")} == {"pending"}
    await receiver_factory(Endpoint(), port=port)  # the endpoint comes back
    await eventually(
        lambda: sql(db_url, "SELECT status FROM deliveries") == [("delivered",)] * 5, timeout=20
    )
    assert len(receiver.received) == 5
