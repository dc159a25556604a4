"""The JSON answers of efd's HTTP APIs, and the one place a `ClientError` becomes one.

Every route runs inside `Listener.guard` (efd/http/server.py), which answers a
`ClientError` raised anywhere below it with `client_error`: handlers and the rules they
call raise, they do not build error answers themselves.
"""

from __future__ import annotations

import json
from typing import Any

from aiohttp import web

from efd.errors import ClientError


def json_response(body: dict[str, Any], status: int = 200) -> web.Response:
    return web.Response(
        body=json.dumps(body).encode(), status=status, content_type="application/json"
    )


def error_response(code: str, message: str, status: int) -> web.Response:
    """An answer that is efd's fault or the moment's, not the client's (503, 408)."""
    return json_response({"success": False, "code": code, "message": message}, status)


def unstorable() -> ClientError:
    """The refusal of a request holding a value the database cannot hold (StoreDataError),
    which validation let through: the request's fault, and the same one fails again."""
    return ClientError(
        "unstorable_value",
        "the store cannot hold a value of this request; nothing was stored, and the same "
        "request will be refused again",
    )


def client_error(error: ClientError) -> web.Response:
    """`error` as the client sees it: its status, its JSON, and the scheme to authenticate
    with when it says who may ask."""
    response = json_response(error.as_json(), error.status)
    if error.challenge is not None:
        response.headers["WWW-Authenticate"] = error.challenge
    return response
