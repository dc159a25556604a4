"""CORS on the ingestion API, allowed_origins, and the routes analytics.js uses (/v1/b,
/v1/m), over plain HTTP against a real daemon. tests/test_browser.py does it in a browser."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from multidict import CIMultiDictProxy

from efd.http.cors import MAX_AGE_SECONDS
from efd.http.ingest import SINGLE_TYPES
from efd.segment.messages import MAX_REQUEST_BYTES
from tests.conftest import WRITE_KEY, DaemonFactory, basic, metric, settings_dict, sql
from tests.unit.test_origins import SHOP_ACCEPTED, SHOP_PATTERNS, SHOP_REFUSED

PAGE = "http://localhost:5173"
TRACK = {"type": "track", "userId": "u-1", "event": "Signed Up"}
INGEST_PATHS = ["/v1/batch", "/v1/import", "/v1/b", "/v1/m"] + [f"/v1/{p}" for p in SINGLE_TYPES]
# What Chromium asks before analytics.js's POST (lower case, sorted, as browsers send it).
REQUESTED = "authorization,content-type,x-retry-count"


async def request(
    method: str, port: int, path: str, body: Any = None, headers: dict[str, str] | None = None
) -> tuple[int, CIMultiDictProxy[str], Any]:
    data = body if body is None or isinstance(body, bytes) else json.dumps(body).encode()
    async with (
        aiohttp.ClientSession() as session,
        session.request(
            method, f"http://127.0.0.1:{port}{path}", data=data, headers=headers or {}
        ) as response,
    ):
        text = await response.text()
        answer = json.loads(text) if text.startswith("{") else text
        return response.status, response.headers, answer


def stored(db_url: str) -> list[tuple[str, str]]:
    return sql(db_url, "SELECT source, message_id FROM messages ORDER BY id")


@pytest.fixture
def sqlite_url(tmp_path: Path) -> str:
    """For tests of HTTP headers alone, which need a store but not both backends."""
    return f"sqlite:///{tmp_path / 'efd.db'}"


# -- preflights and headers ------------------------------------------------------------------


async def test_every_ingestion_route_answers_a_preflight(
    sqlite_url: str, daemon_factory: DaemonFactory
) -> None:
    daemon = await daemon_factory(settings_dict(sqlite_url))
    for path in INGEST_PATHS:
        status, headers, _ = await request(
            "OPTIONS",
            daemon.port,
            path,
            headers={
                "Origin": PAGE,
                "Access-Control-Request-Method": "POST",
                "Access-Control-Request-Headers": REQUESTED,
            },
        )
        assert status == 204, path
        assert headers["Access-Control-Allow-Origin"] == PAGE
        assert "Origin" in headers["Vary"]
        assert headers["Access-Control-Allow-Methods"] == "POST"
        allowed = {h.strip().lower() for h in headers["Access-Control-Allow-Headers"].split(",")}
        assert set(REQUESTED.split(",")) <= allowed
        assert headers["Access-Control-Max-Age"] == str(MAX_AGE_SECONDS)
        # Write keys are public: no cookies, no credentials mode.
        assert "Access-Control-Allow-Credentials" not in headers
    # Only the ingestion API: the admin endpoints are not for web pages.
    status, headers, _ = await request("OPTIONS", daemon.port, "/metrics", headers={"Origin": PAGE})
    assert status == 405
    assert "Access-Control-Allow-Origin" not in headers


async def test_every_answer_to_a_page_carries_its_origin(
    sqlite_url: str, daemon_factory: DaemonFactory
) -> None:
    daemon = await daemon_factory(settings_dict(sqlite_url))
    port = daemon.port
    origin = {"Origin": PAGE}
    too_large = {"batch": [{**TRACK, "properties": {"x": "y" * 30000}}] * 20}
    cases = [
        (200, "POST", "/v1/t", TRACK, {**origin, **basic()}),
        (200, "POST", "/v1/m", {"series": []}, origin),
        (400, "POST", "/v1/t", b"{", {**origin, **basic()}),
        (401, "POST", "/v1/t", TRACK, {**origin, **basic("wrong")}),
        (401, "POST", "/v1/t", TRACK, origin),
        (400, "POST", "/v1/b", too_large, {**origin, **basic()}),  # request_too_large
        (404, "POST", "/v1/nope", TRACK, origin),
        (405, "GET", "/v1/t", None, origin),
    ]
    for expected, method, path, body, sent in cases:
        status, answer_headers, answer = await request(method, port, path, body, sent)
        assert status == expected, (path, answer)
        assert answer_headers["Access-Control-Allow-Origin"] == PAGE, (path, status)
        assert answer_headers["Vary"] == "Origin"
    assert len(json.dumps(too_large)) > MAX_REQUEST_BYTES
    # Server-side libraries send no Origin and get no CORS headers.
    status, headers, _ = await request("POST", port, "/v1/t", TRACK, basic())
    assert status == 200
    assert "Access-Control-Allow-Origin" not in headers
    assert "Vary" not in headers


async def test_a_store_failure_carries_the_origin(
    db_url: str, daemon_factory: DaemonFactory
) -> None:
    daemon = await daemon_factory(settings_dict(db_url))
    # The store fails for real: the table efd writes to is gone.
    sql(db_url, "ALTER TABLE messages RENAME TO messages_away")
    try:
        status, headers, answer = await request(
            "POST", daemon.port, "/v1/t", TRACK, {"Origin": PAGE, **basic()}
        )
    finally:
        sql(db_url, "ALTER TABLE messages_away RENAME TO messages")
    assert headers["Access-Control-Allow-Origin"] == PAGE
    assert (status, answer["code"]) == (503, "storage_unavailable")


# -- allowed_origins -------------------------------------------------------------------------


def restricted(db_url: str, **server: Any) -> dict[str, Any]:
    settings = settings_dict(db_url)
    if server:
        settings["server"] = {**settings["server"], **server}
    settings["sources"][0]["allowed_origins"] = SHOP_PATTERNS
    settings["sources"].append({"name": "open", "write_key": "wk_open"})
    return settings


# One origin of each table end to end, on both backends; every one: tests/unit/test_origins.py.
@pytest.mark.parametrize("origin", SHOP_ACCEPTED[:1])
async def test_a_listed_origin_is_accepted(
    db_url: str, daemon_factory: DaemonFactory, origin: str
) -> None:
    daemon = await daemon_factory(restricted(db_url))
    status, headers, answer = await request(
        "POST", daemon.port, "/v1/t", TRACK, {"Origin": origin, **basic()}
    )
    assert (status, answer) == (200, {"success": True})
    assert headers["Access-Control-Allow-Origin"] == origin
    assert len(stored(db_url)) == 1


# One origin of each table end to end, on both backends; every one: tests/unit/test_origins.py.
@pytest.mark.parametrize("origin", SHOP_REFUSED[:1])
async def test_another_origin_is_403_and_nothing_is_stored(
    db_url: str, daemon_factory: DaemonFactory, origin: str
) -> None:
    daemon = await daemon_factory(restricted(db_url))
    status, headers, answer = await request(
        "POST", daemon.port, "/v1/t", TRACK, {"Origin": origin, **basic()}
    )
    assert (status, answer["code"]) == (403, "origin_not_allowed")
    assert repr(origin) in answer["message"]
    # The page can read the refusal, so analytics.js drops the event instead of retrying.
    assert headers["Access-Control-Allow-Origin"] == origin
    assert stored(db_url) == []


async def test_origins_are_checked_whichever_way_the_key_and_body_arrive(
    db_url: str, daemon_factory: DaemonFactory
) -> None:
    """Key in the body (text/plain, as older analytics.js sends) and large bodies parsed in
    a parser process name the source differently; both are checked."""
    daemon = await daemon_factory(restricted(db_url, parse_processes=1))
    evil = {"Origin": "https://evil.example"}
    big = {"batch": [{**TRACK, "properties": {"pad": "x" * 10000}}], "writeKey": WRITE_KEY}
    for path, body, headers in [
        ("/v1/t", {**TRACK, "writeKey": WRITE_KEY}, {**evil, "Content-Type": "text/plain"}),
        ("/v1/batch", big, evil),
        ("/v1/batch", big, {**evil, **basic()}),
    ]:
        status, _, answer = await request("POST", daemon.port, path, body, headers)
        assert (status, answer["code"]) == (403, "origin_not_allowed"), path
    assert stored(db_url) == []
    status, _, _ = await request(
        "POST", daemon.port, "/v1/batch", big, {"Origin": "https://shop.example"}
    )
    assert status == 200
    assert len(stored(db_url)) == 1


async def test_requests_without_an_origin_and_open_sources_are_unaffected(
    db_url: str, daemon_factory: DaemonFactory
) -> None:
    daemon = await daemon_factory(restricted(db_url))
    status, headers, _ = await request("POST", daemon.port, "/v1/t", TRACK, basic())
    assert status == 200  # a server-side library
    assert "Access-Control-Allow-Origin" not in headers
    status, _, _ = await request(
        "POST", daemon.port, "/v1/t", TRACK, {"Origin": "https://evil.example", **basic("wk_open")}
    )
    assert status == 200  # a source without allowed_origins takes any origin
    assert [source for source, _ in stored(db_url)] == ["web", "open"]


async def test_preflights_are_answered_for_any_origin(
    sqlite_url: str, daemon_factory: DaemonFactory
) -> None:
    """A preflight carries no write key, so it cannot know the source: it is answered, and
    the POST that follows is the one refused (see efd.http.cors)."""
    daemon = await daemon_factory(restricted(sqlite_url))
    status, headers, _ = await request(
        "OPTIONS",
        daemon.port,
        "/v1/t",
        headers={"Origin": "https://evil.example", "Access-Control-Request-Method": "POST"},
    )
    assert status == 204
    assert headers["Access-Control-Allow-Origin"] == "https://evil.example"


# -- the routes analytics.js uses ------------------------------------------------------------


async def test_batching_mode_posts_to_v1_b(db_url: str, daemon_factory: DaemonFactory) -> None:
    daemon = await daemon_factory(settings_dict(db_url))
    # analytics.js's batching mode: text/plain, the key in the body and in Basic auth.
    body = {
        "writeKey": WRITE_KEY,
        "batch": [{**TRACK, "messageId": f"b{i}"} for i in range(3)],
        "sentAt": "2026-11-24T10:00:00.000Z",
    }
    status, headers, answer = await request(
        "POST",
        daemon.port,
        "/v1/b",
        body,
        {"Origin": PAGE, "Content-Type": "text/plain", "X-Retry-Count": "1", **basic()},
    )
    assert (status, answer) == (200, {"success": True})
    assert headers["Access-Control-Allow-Origin"] == PAGE
    assert [m for _, m in stored(db_url)] == ["b0", "b1", "b2"]


async def test_telemetry_is_accepted_counted_and_dropped(
    db_url: str, daemon_factory: DaemonFactory
) -> None:
    daemon = await daemon_factory(settings_dict(db_url))
    series = {
        "series": [
            {
                "type": "Counter",
                "metric": "analytics_js.invoke",
                "value": 1,
                "tags": {"0": "track", "library": "analytics.js"},
            }
        ]
    }
    for _ in range(2):
        status, headers, answer = await request(
            "POST", daemon.port, "/v1/m", series, {"Origin": PAGE, "Content-Type": "text/plain"}
        )
        assert (status, answer) == (200, {"success": True})
        assert headers["Access-Control-Allow-Origin"] == PAGE
    status, _, answer = await request("POST", daemon.port, "/v1/m", b"x" * (MAX_REQUEST_BYTES + 1))
    assert (status, answer["code"]) == (400, "request_too_large")
    _, _, metrics = await request("GET", daemon.port, "/metrics")
    assert metric(metrics, "efd_telemetry_discarded_total") == 2
    assert stored(db_url) == []
