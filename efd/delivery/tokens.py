"""An action's OAuth2 token, fetched from its token endpoint with efd's own HTTP client (so
the address guard and TLS verification apply to it as to a hook), reused while fresh, and
fetched once for all the deliveries that need it at the same time.

The rules (the request, the answer, the lifetime) are efd/delivery/outauth.py's; a failure
is a `TokenFailed` whose message the sender records as the attempt's error, with error
class `token`, which is retried (docs/actions.md#outbound-auth).
"""

from __future__ import annotations

import asyncio
import ssl
import time
from collections.abc import Callable, Sequence

from efd.delivery import http1, netguard, proxyrules
from efd.delivery.outauth import ClientCredentials, Token, TokenError, fresh_until, scrub
from efd.delivery.outauth import parse_token_response as parse

ERROR_CLASS = "token"
# Token answers are read whole up to this size; a longer one is not JSON efd can read.
MAX_TOKEN_RESPONSE = 64 * 1024


class TokenFailed(Exception):
    """No token: `message` says why ("token endpoint: HTTP 500"), without any secret."""

    error_class = ERROR_CLASS

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message


def token_client(
    *,
    timeout: float,
    allowed: Sequence[netguard.IPNetwork],
    tls: ssl.SSLContext,
    proxy: proxyrules.Egress | None = None,
) -> http1.Client:
    """The client token endpoints are asked with: a delivery's (the same proxy too), keeping
    the whole answer."""
    return http1.Client(
        timeout=timeout,
        allowed=allowed,
        tls=tls,
        keep=MAX_TOKEN_RESPONSE,
        limit=MAX_TOKEN_RESPONSE,
        proxy=proxy,
    )


class TokenSource:
    """One action's token. `token()` gives the cached one while fresh, else fetches;
    `renew(token)` after the receiver refused `token` with a 401."""

    def __init__(
        self,
        credentials: ClientCredentials,
        client: http1.Client,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._credentials = credentials
        self._client = client
        self._clock = clock
        self._token: Token | None = None
        self._until = 0.0
        self._fetching: asyncio.Task[Token] | None = None
        self.fetches = 0  # requests sent to the endpoint, for tests and metrics

    def __repr__(self) -> str:
        return f"TokenSource({self._credentials!r})"

    async def token(self) -> Token:
        token = self._token
        if token is not None and self._clock() < self._until:
            return token
        return await self._fetch()

    async def renew(self, rejected: Token) -> Token:
        """A token other than `rejected`: the one another delivery already fetched after
        the same 401, else a new one. The caller sends again once: a 401 to the renewed
        token is the receiver's answer."""
        if self._token is rejected:
            self._token = None
        return await self.token()

    async def _fetch(self) -> Token:
        task = self._fetching
        if task is None:
            task = self._fetching = asyncio.get_running_loop().create_task(self._ask())
            task.add_done_callback(self._fetched)
        # Shielded: a delivery that stops waiting does not cancel the others' fetch.
        return await asyncio.shield(task)

    def _fetched(self, task: asyncio.Task[Token]) -> None:
        self._fetching = None
        if not task.cancelled():
            task.exception()  # retrieved here: a failure nobody waits for any more is no warning

    async def _ask(self) -> Token:
        credentials = self._credentials
        request = credentials.request()
        asked_at = self._clock()
        self.fetches += 1
        try:
            answer = await self._client.post(request.url, request.body, request.headers)
        except http1.RequestFailed as failure:
            reason = f"token endpoint: {failure.error_class}: {failure.message}"
            raise TokenFailed(scrub(reason, credentials.secrets())) from None
        try:
            token = parse(answer.status, answer.head, credentials.secrets())
        except TokenError as error:
            raise TokenFailed(error.reason) from None
        self._token = token
        self._until = fresh_until(asked_at, token.expires_in)
        return token
