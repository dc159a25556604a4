"""CORS for the ingestion API, so that web pages on other origins can send (analytics.js).

Write keys are public in browsers, as with Segment: no cookies or credentials mode, and any
origin may send unless its source lists `allowed_origins`. Preflights carry no write key,
so they cannot know the source: every preflight is answered 204, and a POST from an origin
its source does not list is refused with 403 (efd.http.ingest). The 403 carries
Access-Control-Allow-Origin like every other answer, so the page reads it and analytics.js
drops the event; a refused preflight would look like a network error and be retried.
"""

from __future__ import annotations

from collections.abc import Iterable

from aiohttp import web

# Every header analytics.js sends (Content-Type text/plain, Authorization with the write
# key, X-Retry-Count on retries), and Content-Encoding for pages that gzip their bodies.
ALLOW_HEADERS = "Authorization, Content-Type, Content-Encoding, X-Retry-Count"
# Chromium caches a preflight for at most two hours, whatever is asked for.
MAX_AGE_SECONDS = 7200
PREFIX = "/v1/"


async def _preflight(_request: web.Request) -> web.Response:
    return web.Response(
        status=204,
        headers={
            "Access-Control-Allow-Methods": "POST",
            "Access-Control-Allow-Headers": ALLOW_HEADERS,
            "Access-Control-Max-Age": str(MAX_AGE_SECONDS),
        },
    )


async def _allow_origin(request: web.Request, response: web.StreamResponse) -> None:
    """On every answer under /v1/ to a request with an Origin, errors included (aiohttp's
    own 404, 405 and 500 too): without it the browser hides the status from the page and
    analytics.js retries what efd refused."""
    origin = request.headers.get("Origin")
    if origin is None or not request.path.startswith(PREFIX):
        return
    response.headers["Access-Control-Allow-Origin"] = origin
    vary = response.headers.get("Vary")
    if vary is None:
        response.headers["Vary"] = "Origin"
    elif "origin" not in vary.lower():
        response.headers["Vary"] = f"{vary}, Origin"


def install(app: web.Application, paths: Iterable[str]) -> None:
    """Answer preflights for `paths` (the ingestion routes) and allow their answers to be
    read by pages on any origin."""
    app.add_routes([web.options(path, _preflight) for path in dict.fromkeys(paths)])
    app.on_response_prepare.append(_allow_origin)
