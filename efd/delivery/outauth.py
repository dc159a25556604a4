"""Outbound auth for an action's requests (pure: no I/O, no clock): the three kinds of
credentials, the Authorization header each one sends, the OAuth2 client-credentials token
request and the reading of its answer, and how long a token is reused.

Secrets never leave a record except in the header or request body built for them: the
records' reprs mask them and every reason given for a failure is written without them.
What fetches and caches a token is efd/delivery/tokens.py.
"""

from __future__ import annotations

import base64
import json
import math
from dataclasses import dataclass, field
from typing import Literal
from urllib.parse import urlsplit

from efd.delivery import netguard

MASK = "***"
# How long a token whose answer gave no lifetime is reused (docs/decisions.md).
DEFAULT_LIFETIME = 300.0
MARGIN_SHARE = 0.1  # of the lifetime: a token is given up this long before it expires
MARGIN_CAP = 60.0
_REASON_CHARS = 200  # of an endpoint's own error text, kept in a reason


class AuthConfigError(ValueError):
    """Credentials that cannot be used; the message names the key, never its value."""


class TokenError(Exception):
    """The token endpoint's answer gives no usable token; `reason` holds no secret."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


def _text(owner: str, key: str, value: object) -> str:
    if not isinstance(value, str) or not value:
        raise AuthConfigError(f"{owner}.{key}: must be a non-empty string")
    if any(ord(c) < 0x20 or ord(c) == 0x7F for c in value):
        raise AuthConfigError(f"{owner}.{key}: must not hold control characters")
    return value


def _visible_ascii(value: str) -> bool:
    """What a header may carry of a token unchanged: printable ASCII, no spaces."""
    return all(0x21 <= ord(c) <= 0x7E for c in value)


@dataclass(frozen=True, slots=True, repr=False)
class Bearer:
    """`Authorization: Bearer <token>`, the same token on every request."""

    token: str

    def __post_init__(self) -> None:
        _text("bearer", "token", self.token)
        if not _visible_ascii(self.token):
            raise AuthConfigError("bearer.token: must be printable ASCII without spaces")

    def header(self) -> str:
        return "Bearer " + self.token

    def __repr__(self) -> str:
        return f"Bearer(token={MASK!r})"


@dataclass(frozen=True, slots=True, repr=False)
class Basic:
    """`Authorization: Basic base64(username:password)`, the pair encoded as UTF-8."""

    username: str
    password: str

    def __post_init__(self) -> None:
        _text("basic", "username", self.username)
        _text("basic", "password", self.password)
        if ":" in self.username:
            # The first colon separates the pair: a username holding one would be read short.
            raise AuthConfigError("basic.username: must not hold a colon")

    def header(self) -> str:
        pair = f"{self.username}:{self.password}".encode()
        return "Basic " + base64.b64encode(pair).decode("ascii")

    def __repr__(self) -> str:
        return f"Basic(username={self.username!r}, password={MASK!r})"


def url_problem(url: str) -> str | None:
    """Why `url` cannot be a token endpoint: the rules of a hook URL (a full http:// or
    https:// URL, a valid port, a numeric host only as a dotted quad), and no credentials
    in it, which belong in client_id and client_secret."""
    problem = netguard.http_url_problem(url)
    if problem is not None:
        return problem
    parts = urlsplit(url)
    if parts.username is not None or parts.password is not None:
        return "must not hold credentials (they go in client_id and client_secret)"
    return None


_UNRESERVED = frozenset(b"*-._0123456789ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz")


def form_encode(text: str) -> str:
    """application/x-www-form-urlencoded as the URL Standard writes it: UTF-8, a space as
    `+`, bytes other than alphanumerics and `*-._` as `%XX`."""
    out = []
    for byte in text.encode("utf-8"):
        if byte in _UNRESERVED:
            out.append(chr(byte))
        elif byte == 0x20:
            out.append("+")
        else:
            out.append(f"%{byte:02X}")
    return "".join(out)


def _scope_ok(scope: str) -> bool:
    # Scope tokens: printable ASCII but `"` and `\`, one space between them.
    tokens = scope.split(" ")
    return all(t and _visible_ascii(t) and '"' not in t and "\\" not in t for t in tokens)


@dataclass(frozen=True, slots=True, repr=False)
class TokenRequest:
    """The POST that asks the token endpoint for a token."""

    url: str
    headers: dict[str, str] = field(hash=False)
    body: bytes

    def __repr__(self) -> str:
        return f"TokenRequest(url={self.url!r}, headers=..., body=...)"


ClientAuth = Literal["basic", "post"]


@dataclass(frozen=True, slots=True, repr=False)
class ClientCredentials:
    """OAuth2's client credentials grant: a token fetched from `token_url` and sent as
    `Authorization: Bearer <token>`. `client_auth`: how the client authenticates to the
    endpoint, by HTTP Basic (the default, which every endpoint must accept) or with
    client_id and client_secret in the form body."""

    token_url: str
    client_id: str
    client_secret: str
    scope: str | None = None
    client_auth: ClientAuth = "basic"

    def __post_init__(self) -> None:
        owner = "oauth2_client_credentials"
        _text(owner, "token_url", self.token_url)
        if (problem := url_problem(self.token_url)) is not None:
            raise AuthConfigError(f"{owner}.token_url: {problem}")
        _text(owner, "client_id", self.client_id)
        _text(owner, "client_secret", self.client_secret)
        if self.scope is not None:
            _text(owner, "scope", self.scope)
            if not _scope_ok(self.scope):
                raise AuthConfigError(
                    f"{owner}.scope: must be scope tokens (printable ASCII but quote and "
                    "backslash) separated by single spaces"
                )
        if self.client_auth not in ("basic", "post"):
            raise AuthConfigError(f'{owner}.client_auth: must be "basic" or "post"')

    def request(self) -> TokenRequest:
        """The token request: a form body with grant_type and scope, the client
        authenticated as `client_auth` says (for Basic, each half form-encoded first)."""
        fields = [("grant_type", "client_credentials")]
        if self.scope is not None:
            fields.append(("scope", self.scope))
        headers = {
            "Content-Type": "application/x-www-form-urlencoded",
            "Accept": "application/json",
        }
        if self.client_auth == "basic":
            pair = f"{form_encode(self.client_id)}:{form_encode(self.client_secret)}"
            headers["Authorization"] = "Basic " + base64.b64encode(pair.encode()).decode()
        else:
            fields += [("client_id", self.client_id), ("client_secret", self.client_secret)]
        body = "&".join(f"{form_encode(k)}={form_encode(v)}" for k, v in fields)
        return TokenRequest(self.token_url, headers, body.encode("ascii"))

    def secrets(self) -> tuple[str, ...]:
        """What must never appear in a reason: the secret as given and as sent."""
        return tuple({self.client_secret, form_encode(self.client_secret)})

    def __repr__(self) -> str:
        return (
            f"ClientCredentials(token_url={self.token_url!r}, client_id={self.client_id!r}, "
            f"client_secret={MASK!r}, scope={self.scope!r}, client_auth={self.client_auth!r})"
        )


Auth = Bearer | Basic | ClientCredentials


@dataclass(frozen=True, slots=True, repr=False)
class Token:
    """An access token and how long its endpoint said it lasts (None: it did not say)."""

    value: str
    expires_in: float | None

    def header(self) -> str:
        return "Bearer " + self.value

    def __repr__(self) -> str:
        return f"Token(value={MASK!r}, expires_in={self.expires_in!r})"


def fresh_until(fetched_at: float, expires_in: float | None) -> float:
    """When a token asked for at `fetched_at` stops being used: its lifetime less a tenth
    of it, the margin at most MARGIN_CAP, so it is not sent as it expires; DEFAULT_LIFETIME
    when the endpoint gave none."""
    if expires_in is None:
        return fetched_at + DEFAULT_LIFETIME
    return fetched_at + expires_in - min(expires_in * MARGIN_SHARE, MARGIN_CAP)


def scrub(reason: str, secrets: tuple[str, ...]) -> str:
    for secret in secrets:
        if secret:
            reason = reason.replace(secret, MASK)
    return reason


def _error_text(value: object) -> str | None:
    """An endpoint's `error` or `error_description` as a reason may show it: printable
    ASCII but quote and backslash (the characters those fields may hold), shortened."""
    if not isinstance(value, str) or not value:
        return None
    if not all(0x20 <= ord(c) <= 0x7E and c not in '"\\' for c in value):
        return None
    return value[:_REASON_CHARS]


def _expires_in(value: object) -> float | None:
    if value is None:
        return None
    if isinstance(value, str) and value.isascii() and value.isdigit():
        return float(value)  # some endpoints send the number as text
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise TokenError("token endpoint: expires_in is not a number")
    seconds = float(value)
    if not math.isfinite(seconds) or seconds < 0:
        raise TokenError("token endpoint: expires_in is not a number of seconds")
    return seconds


def parse_token_response(status: int, body: bytes, secrets: tuple[str, ...] = ()) -> Token:
    """The token in a 2xx answer with a JSON object holding access_token and token_type
    Bearer (in any case), expires_in optional; TokenError with the reason otherwise, the
    endpoint's error and error_description shown when it gives them."""
    try:
        document = json.loads(body)
    except (ValueError, UnicodeDecodeError, RecursionError):
        document = None
    if not 200 <= status < 300:
        reason = f"token endpoint: HTTP {status}"
        if isinstance(document, dict) and (error := _error_text(document.get("error"))):
            reason += f": {error}"
            if description := _error_text(document.get("error_description")):
                reason += f" ({description})"
        raise TokenError(scrub(reason, secrets))
    if not isinstance(document, dict):
        raise TokenError(f"token endpoint: HTTP {status}: the answer is not a JSON object")
    value = document.get("access_token")
    if not isinstance(value, str) or not value:
        raise TokenError(f"token endpoint: HTTP {status}: no access_token in the answer")
    if not _visible_ascii(value):
        raise TokenError("token endpoint: the access_token cannot be sent in a header")
    token_type = document.get("token_type")
    if not isinstance(token_type, str) or token_type.lower() != "bearer":
        shown = _error_text(token_type) if isinstance(token_type, str) else None
        kind = repr(shown) if shown else "missing or unreadable"
        raise TokenError(f"token endpoint: token_type {kind} is not Bearer")
    return Token(value, _expires_in(document.get("expires_in")))
