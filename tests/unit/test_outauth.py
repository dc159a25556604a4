"""Outbound auth's pure rules (efd/delivery/outauth.py): headers, the token request, the
token endpoint's answers and a token's lifetime."""

from __future__ import annotations

import base64
import json

import pytest

from efd.delivery import outauth
from efd.delivery.outauth import (
    AuthConfigError,
    Basic,
    Bearer,
    ClientCredentials,
    Token,
    TokenError,
    fresh_until,
    parse_token_response,
)
from efd.delivery.retry import Verdict, classify_error
from efd.delivery.tokens import ERROR_CLASS

URL = "https://auth.example.com/token"


def credentials(**changes: str | None) -> ClientCredentials:
    values: dict[str, str | None] = {
        "token_url": URL,
        "client_id": "s6BhdRkqt3",
        "client_secret": "gX1fBat3bV",
        "scope": "orders:write",
    }
    values.update(changes)
    return ClientCredentials(**values)  # type: ignore[arg-type]


# -- static headers ---------------------------------------------------------------------


def test_bearer_header_is_the_token_as_given() -> None:
    assert Bearer("abc.DEF-_~+/=").header() == "Bearer abc.DEF-_~+/="


def test_basic_header_is_base64_of_the_pair() -> None:
    assert Basic("Aladdin", "open sesame").header() == "Basic QWxhZGRpbjpvcGVuIHNlc2FtZQ=="


def test_basic_header_encodes_the_pair_as_utf8() -> None:
    assert Basic("test", "123\u00a3").header() == "Basic dGVzdDoxMjPCow=="


def test_basic_password_may_hold_colons() -> None:
    assert Basic("u", "a:b").header() == "Basic " + base64.b64encode(b"u:a:b").decode()


@pytest.mark.parametrize(
    ("build", "message"),
    [
        (lambda: Bearer(""), "bearer.token: must be a non-empty string"),
        (lambda: Bearer("a b"), "bearer.token: must be printable ASCII without spaces"),
        (lambda: Bearer("caf\u00e9"), "bearer.token: must be printable ASCII without spaces"),
        (lambda: Bearer("a\r\nX: y"), "bearer.token: must not hold control characters"),
        (lambda: Basic("", "p"), "basic.username: must be a non-empty string"),
        (lambda: Basic("u", ""), "basic.password: must be a non-empty string"),
        (lambda: Basic("u:v", "p"), "basic.username: must not hold a colon"),
        (lambda: Basic("u", "p\n"), "basic.password: must not hold control characters"),
        (lambda: Basic(1, "p"), "basic.username: must be a non-empty string"),  # type: ignore[arg-type]
    ],
)
def test_invalid_static_credentials_are_refused_by_key(build: object, message: str) -> None:
    with pytest.raises(AuthConfigError) as caught:
        build()  # type: ignore[operator]
    assert str(caught.value) == message


# -- client credentials ---------------------------------------------------------------------


def test_token_request_authenticates_by_basic_as_the_specification_shows() -> None:
    request = credentials(scope=None).request()
    assert request.url == URL
    assert request.headers == {
        "Content-Type": "application/x-www-form-urlencoded",
        "Accept": "application/json",
        "Authorization": "Basic czZCaGRSa3F0MzpnWDFmQmF0M2JW",
    }
    assert request.body == b"grant_type=client_credentials"


def test_token_request_sends_the_scope_form_encoded() -> None:
    request = credentials(scope="orders:write read").request()
    assert request.body == b"grant_type=client_credentials&scope=orders%3Awrite+read"


def test_basic_client_authentication_form_encodes_each_half_first() -> None:
    request = credentials(client_id="my app", client_secret="a+b:c/\u00e9~*").request()
    pair = b"my+app:a%2Bb%3Ac%2F%C3%A9%7E*"
    assert request.headers["Authorization"] == "Basic " + base64.b64encode(pair).decode()


def test_post_client_authentication_puts_the_pair_in_the_body() -> None:
    request = ClientCredentials(URL, "my app", "s&=cret", "a b", client_auth="post").request()
    assert "Authorization" not in request.headers
    assert request.body == (
        b"grant_type=client_credentials&scope=a+b&client_id=my+app&client_secret=s%26%3Dcret"
    )


@pytest.mark.parametrize(
    ("changes", "message"),
    [
        ({"token_url": ""}, "token_url: must be a non-empty string"),
        ({"token_url": "ftp://auth.example.com/t"}, "must be a full http:// or https:// URL"),
        ({"token_url": "https:///token"}, "must be a full http:// or https:// URL"),
        ({"token_url": "https://a .example/t"}, "(no spaces)"),
        ({"token_url": "https://auth.example.com:99999/t"}, "has an invalid port"),
        ({"token_url": "https://efd:pw@auth.example.com/t"}, "must not hold credentials"),
        ({"token_url": "http://2130706433/t"}, "dotted quad"),
        ({"client_id": ""}, "client_id: must be a non-empty string"),
        ({"client_secret": ""}, "client_secret: must be a non-empty string"),
        ({"scope": ""}, "scope: must be a non-empty string"),
        ({"scope": "a  b"}, "scope: must be scope tokens"),
        ({"scope": 'a"b'}, "scope: must be scope tokens"),
        ({"client_auth": "jwt"}, 'client_auth: must be "basic" or "post"'),
    ],
)
def test_invalid_client_credentials_are_refused_by_key(
    changes: dict[str, str], message: str
) -> None:
    with pytest.raises(AuthConfigError) as caught:
        credentials(**changes)
    assert message in str(caught.value)
    assert str(caught.value).startswith("oauth2_client_credentials.")
    assert "gX1fBat3bV" not in str(caught.value)


def test_plain_http_token_url_is_accepted_as_a_hook_url_is() -> None:
    assert credentials(token_url="http://127.0.0.1:8080/token").token_url.startswith("http:")


def test_reprs_mask_every_secret() -> None:
    shown = " ".join(
        repr(value)
        for value in (
            Bearer("tok-SECRET"),
            Basic("alice", "pw-SECRET"),
            credentials(client_secret="cs-SECRET"),
            credentials(client_secret="cs-SECRET").request(),
            Token("at-SECRET", 60.0),
        )
    )
    assert "SECRET" not in shown
    for shown_value in ("alice", "orders:write", URL):
        assert shown_value in shown
    assert outauth.MASK in shown


# -- the token endpoint's answer ------------------------------------------------------------


def answer(document: object) -> bytes:
    return json.dumps(document).encode()


def test_a_token_with_a_lifetime() -> None:
    body = {"access_token": "2YotnFZFEjr1zCsicMWpAA", "token_type": "bearer", "expires_in": 3600}
    token = parse_token_response(200, answer(body))
    assert (token.value, token.expires_in) == ("2YotnFZFEjr1zCsicMWpAA", 3600.0)
    assert token.header() == "Bearer 2YotnFZFEjr1zCsicMWpAA"


@pytest.mark.parametrize("token_type", ["Bearer", "BEARER", "bEaReR"])
def test_token_type_is_bearer_in_any_case(token_type: str) -> None:
    token = parse_token_response(200, answer({"access_token": "t", "token_type": token_type}))
    assert token.expires_in is None


@pytest.mark.parametrize(("given", "seconds"), [(59.5, 59.5), ("120", 120.0), (0, 0.0)])
def test_expires_in_a_number_or_digits(given: object, seconds: float) -> None:
    body = answer({"access_token": "t", "token_type": "Bearer", "expires_in": given})
    assert parse_token_response(201, body).expires_in == seconds


def bearer(**fields: object) -> bytes:
    return answer({"access_token": "t", "token_type": "Bearer", **fields})


NOT_JSON = "HTTP 200: the answer is not a JSON object"
NO_TOKEN = "HTTP 200: no access_token in the answer"
NOT_A_NUMBER = "expires_in is not a number"
NOT_SECONDS = "expires_in is not a number of seconds"
INVALID_CLIENT = {"error": "invalid_client", "error_description": "Client authentication failed"}


@pytest.mark.parametrize(
    ("status", "body", "reason"),
    [
        (200, b"<html>ok</html>", NOT_JSON),
        (200, b'["t"]', NOT_JSON),
        (200, b"\xff\xfe", NOT_JSON),
        (200, b"", NOT_JSON),
        (200, answer({"token_type": "Bearer"}), NO_TOKEN),
        (200, bearer(access_token=""), NO_TOKEN),
        (200, bearer(access_token=7), NO_TOKEN),
        (200, bearer(access_token="a b"), "the access_token cannot be sent in a header"),
        (200, bearer(token_type="mac"), "token_type 'mac' is not Bearer"),
        (200, answer({"access_token": "t"}), "token_type missing or unreadable is not Bearer"),
        (200, bearer(expires_in=True), NOT_A_NUMBER),
        (200, bearer(expires_in="1h"), NOT_A_NUMBER),
        (200, bearer(expires_in=-1), NOT_SECONDS),
        (200, b'{"access_token":"t","token_type":"Bearer","expires_in":1e999}', NOT_SECONDS),
        (500, b"oops", "HTTP 500"),
        (400, answer({"error": "invalid_scope"}), "HTTP 400: invalid_scope"),
        (401, answer(INVALID_CLIENT), "HTTP 401: invalid_client (Client authentication failed)"),
        (400, answer({"error": "bad\nline", "error_description": "x"}), "HTTP 400"),
        (400, answer({"error": "e", "error_description": "d" * 300}), f"HTTP 400: e ({'d' * 200})"),
        (302, bearer(), "HTTP 302"),
    ],
)  # fmt: skip
def test_answers_without_a_usable_token_give_a_reason(
    status: int, body: bytes, reason: str
) -> None:
    with pytest.raises(TokenError) as caught:
        parse_token_response(status, body)
    assert caught.value.reason == "token endpoint: " + reason


def test_an_error_description_echoing_the_secret_is_masked() -> None:
    secrets = credentials(client_secret="gX1f Bat3bV").secrets()
    body = answer({"error": "invalid_client", "error_description": "bad secret gX1f+Bat3bV"})
    with pytest.raises(TokenError) as caught:
        parse_token_response(401, body, secrets)
    assert caught.value.reason == "token endpoint: HTTP 401: invalid_client (bad secret ***)"


def test_a_token_failure_is_retried() -> None:
    assert classify_error(ERROR_CLASS) is Verdict.RETRY


# -- lifetime -------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("expires_in", "until"),
    [
        (3600.0, 1000.0 + 3600 - 60),  # the margin at its cap
        (600.0, 1000.0 + 600 - 60),  # a tenth is the cap
        (300.0, 1000.0 + 300 - 30),
        (10.0, 1000.0 + 10 - 1),
        (0.0, 1000.0),
        (None, 1000.0 + 300),  # no lifetime given: the default
    ],
)
def test_a_token_is_used_until_its_lifetime_less_the_margin(
    expires_in: float | None, until: float
) -> None:
    assert fresh_until(1000.0, expires_in) == until
