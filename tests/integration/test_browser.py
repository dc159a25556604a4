"""analytics.js (@segment/analytics-next, pinned in tests/js/package-lock.json) in a real
browser: Debian's Chromium, driven by Playwright, on a page served from another origin than
efd's, set up as the README's "From a web page" says.

One browser and one bundle serve the whole session. Playwright runs in a thread of its own,
with its own event loop, so that the test's loop stays free to serve efd and the receiver
while the page sends. Requests are observed, never intercepted: Playwright answers the CORS
preflights of intercepted requests itself, which would hide efd's.
"""

from __future__ import annotations

import asyncio
import json
import subprocess
import threading
from collections.abc import Awaitable, Callable, Iterator
from concurrent.futures import Future
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar
from urllib.parse import urlsplit

import pytest
from aiohttp import web

from tests.conftest import (
    WRITE_KEY,
    DaemonFactory,
    ReceiverFactory,
    eventually,
    free_port,
    settings_dict,
    sql,
)
from tests.jsclients import CHROMIUM, JS, NODE_MODULES, delivered_once, need, node

T = TypeVar("T")
TYPES = ["identify", "track", "page", "group", "alias"]
UMD = NODE_MODULES / "@segment" / "analytics-next" / "dist" / "umd"
LOOPBACK = {"127.0.0.1", "localhost"}
# Chromium's own traffic (updates, sync, field trials) is off: this machine's network is
# closed, and nothing but the page's requests is wanted.
CHROMIUM_ARGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--no-first-run",
]


# -- the browser, in its own thread ----------------------------------------------------------


class Browser:
    """Playwright and one Chromium for the session, in a thread with its own event loop."""

    def __init__(self) -> None:
        from playwright.async_api import async_playwright

        self._loop = asyncio.new_event_loop()
        # A daemon thread: should the launch fail, pytest still exits.
        self._thread = threading.Thread(
            target=self._loop.run_forever, name="playwright", daemon=True
        )
        self._thread.start()

        async def launch() -> tuple[Any, Any]:
            playwright = await async_playwright().start()
            browser = await playwright.chromium.launch(
                executable_path=str(CHROMIUM), args=CHROMIUM_ARGS
            )
            return playwright, browser

        self._playwright, self.browser = self._submit(launch).result(timeout=60)

    def _submit(self, factory: Callable[[], Awaitable[T]]) -> Future[T]:
        async def call() -> T:
            return await factory()  # created and awaited in the browser's loop

        return asyncio.run_coroutine_threadsafe(call(), self._loop)

    async def run(self, factory: Callable[[], Awaitable[T]]) -> T:
        """Run `factory()` in the browser's loop; await it from the test's."""
        return await asyncio.wrap_future(self._submit(factory))

    def close(self) -> None:
        async def stop() -> None:
            await self.browser.close()
            await self._playwright.stop()

        try:
            self._submit(stop).result(timeout=30)
        finally:
            self._loop.call_soon_threadsafe(self._loop.stop)
            self._thread.join(10)
            self._loop.close()


@dataclass
class Sent:
    """A request the page made, as the browser saw it."""

    method: str
    url: str
    headers: dict[str, str]
    body: str | None
    status: int | None = None  # None: no answer yet, or none at all (see `failed`)
    failed: str | None = None

    def message_ids(self) -> list[str]:
        if self.body is None or self.path == "/v1/m":
            return []
        payload = json.loads(self.body)
        return [m["messageId"] for m in payload.get("batch", [payload])]

    @property
    def path(self) -> str:
        return urlsplit(self.url).path


@dataclass
class Page:
    """One browser context and page, and everything the page did."""

    browser: Browser
    sent: list[Sent] = field(default_factory=list)
    console: list[str] = field(default_factory=list)
    _context: Any = None
    _page: Any = None

    async def open(self, url: str) -> Page:
        async def open_() -> None:
            self._context = await self.browser.browser.new_context()
            by_request: dict[Any, Sent] = {}

            def on_request(request: Any) -> None:
                sent = Sent(request.method, request.url, request.headers, request.post_data)
                by_request[request] = sent
                self.sent.append(sent)

            def on_response(response: Any) -> None:
                by_request[response.request].status = response.status

            def on_failed(request: Any) -> None:
                by_request[request].failed = request.failure or "failed"

            self._context.on("request", on_request)
            self._context.on("response", on_response)
            self._context.on("requestfailed", on_failed)
            self._page = await self._context.new_page()
            self._page.on("console", lambda m: self.console.append(f"{m.type}: {m.text}"))
            self._page.on("pageerror", lambda e: self.console.append(f"pageerror: {e}"))
            await self._page.goto(url)

        await self.browser.run(open_)
        return self

    async def evaluate(self, expression: str, arg: Any = None) -> Any:
        return await self.browser.run(lambda: self._page.evaluate(expression, arg))

    async def close(self) -> None:
        if self._context is not None:
            await self.browser.run(self._context.close)

    def posts_to(self, port: int) -> list[Sent]:
        return [s for s in self.sent if s.method == "POST" and urlsplit(s.url).port == port]

    async def answered_posts(self, port: int, messages: int) -> list[Sent]:
        """The POSTs of messages (not telemetry) to efd, once they carry `messages` messages
        and their answers: the browser reports them on its own time."""

        def answered() -> list[Sent] | None:
            posts = [post for post in self.posts_to(port) if post.path != "/v1/m"]
            count = sum(len(post.message_ids()) for post in posts)
            done = count >= messages and all(post.status or post.failed for post in posts)
            return posts if done else None

        posts: list[Sent] = await eventually(answered)
        return posts

    def check_clean(self) -> None:
        """No CORS error, no script error, and no request to anyone but this machine."""
        cors = [line for line in self.console if "CORS" in line or "Access-Control" in line]
        assert cors == []
        assert [line for line in self.console if line.startswith("pageerror")] == []
        foreign = [s.url for s in self.sent if urlsplit(s.url).hostname not in LOOPBACK]
        assert foreign == []


# -- session fixtures: one bundle, one browser ----------------------------------------------


@pytest.fixture(scope="session")
def bundle(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """analytics-next bundled from npm, as an application's build would (esbuild); one per
    test process, so parallel workers never read each other's half-written file."""
    node()
    out = tmp_path_factory.mktemp("build") / "analytics.js"
    subprocess.run(
        [
            str(NODE_MODULES / ".bin" / "esbuild"),
            "browser-entry.js",
            "--bundle",
            "--format=iife",
            "--platform=browser",
            "--target=es2020",
            f"--outfile={out}",
            "--log-level=warning",
        ],
        cwd=JS,
        check=True,
        timeout=120,
    )
    return out


@pytest.fixture(scope="session")
def browser() -> Iterator[Browser]:
    need(CHROMIUM.exists(), f"no Chromium at {CHROMIUM}", "EFD_REQUIRE_BROWSER")
    try:
        import playwright  # noqa: F401
    except ImportError:
        need(False, "Playwright for Python is not installed", "EFD_REQUIRE_BROWSER")
    started = Browser()
    yield started
    started.close()


# -- the web site: a second origin ----------------------------------------------------------


@dataclass
class Site:
    """The pages, served from http://localhost:PORT while efd is at http://127.0.0.1:PORT."""

    origin: str
    # What a self-hosted analytics.js fetches as its settings (the snippet's set-up).
    settings: dict[str, Any] = field(default_factory=dict)


@pytest.fixture
async def site(bundle: Path) -> Any:
    holder: list[Site] = []

    async def page(request: web.Request) -> web.StreamResponse:
        name = request.match_info["name"]
        if name == "snippet.html":
            text = (JS / name).read_text()
            text = text.replace("STATIC", f"{holder[0].origin}/segment")
            return web.Response(text=text.replace("WRITE_KEY", WRITE_KEY), content_type="text/html")
        return web.FileResponse(JS / name)

    async def settings(request: web.Request) -> web.Response:
        return web.json_response(holder[0].settings)

    async def no_icon(_request: web.Request) -> web.Response:
        return web.Response(status=204)  # else a 404 in the console of every page

    def file(path: Path) -> Callable[[web.Request], Awaitable[web.StreamResponse]]:
        async def serve(_request: web.Request) -> web.StreamResponse:
            return web.FileResponse(path)

        return serve

    app = web.Application()
    app.router.add_get("/{name:(page|snippet)\\.html}", page)
    app.router.add_get("/build/analytics.js", file(bundle))
    # A self-hosted copy of the package's dist/umd: analytics.js and the chunks it loads.
    app.router.add_get("/segment/analytics.js", file(UMD / "standalone.js"))
    app.router.add_static("/segment/analytics-next/bundles/", UMD)
    app.router.add_get("/segment/v1/projects/{key}/settings", settings)
    app.router.add_get("/favicon.ico", no_icon)
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    tcp = web.TCPSite(runner, "127.0.0.1", 0)
    await tcp.start()
    port = int(runner.addresses[0][1])
    holder.append(Site(f"http://localhost:{port}"))
    yield holder[0]
    await runner.cleanup()


@pytest.fixture
async def pages(browser: Browser) -> Any:
    opened: list[Page] = []

    async def open_(url: str) -> Page:
        page = Page(browser)
        opened.append(page)
        return await page.open(url)

    yield open_
    for page in opened:
        await page.close()


@pytest.fixture
def sqlite_url(tmp_path: Path) -> str:
    """The browser tests check HTTP; the store's backends are covered elsewhere."""
    return f"sqlite:///{tmp_path / 'efd.db'}"


def segment_settings(
    port: int, write_key: str = WRITE_KEY, batching: bool = False
) -> dict[str, Any]:
    """The Segment.io settings that point analytics.js at efd."""
    settings: dict[str, Any] = {
        "apiKey": write_key,
        "apiHost": f"127.0.0.1:{port}/v1",
        "protocol": "http",
    }
    if batching:
        settings["deliveryStrategy"] = {
            "strategy": "batching",
            "config": {"size": 5, "timeout": 200},
        }
    return settings


# -- the tests -------------------------------------------------------------------------------


@pytest.mark.parametrize("batching", [False, True], ids=["standard", "batching"])
@pytest.mark.parametrize("setup", ["npm", "snippet"])
async def test_every_call_arrives_once_signed(
    setup: str,
    batching: bool,
    site: Any,
    pages: Any,
    sqlite_url: str,
    receiver_factory: ReceiverFactory,
    daemon_factory: DaemonFactory,
) -> None:
    receiver = await receiver_factory()
    settings = settings_dict(sqlite_url, [receiver.url])
    if setup == "npm":  # the snippet's page runs with the default: any origin
        settings["sources"][0]["allowed_origins"] = ["https://shop.example", site.origin]
    daemon = await daemon_factory(settings)
    telemetry = setup == "npm" and not batching

    if setup == "npm":
        page = await pages(f"{site.origin}/page.html")
        result = await page.evaluate(
            "run",
            {
                "writeKey": WRITE_KEY,
                "apiHost": f"127.0.0.1:{daemon.port}/v1",
                "batching": batching,
                "telemetry": telemetry,
            },
        )
        assert [e["type"] for e in result["events"]] == TYPES
        assert [e["failed"] for e in result["events"]] == [None] * 5
        assert result["errors"] == []
    else:
        site.settings = {
            "integrations": {"Segment.io": segment_settings(daemon.port, batching=batching)},
            "metrics": {"sampleRate": 0},
        }
        page = await pages(f"{site.origin}/snippet.html")

    await receiver.wait_for(5, timeout=30)
    posts = await page.answered_posts(daemon.port, 5)
    sent = [message_id for post in posts for message_id in post.message_ids()]
    bodies = await delivered_once(sqlite_url, receiver, sent)
    if setup == "npm":
        assert sorted(sent) == sorted(e["messageId"] for e in result["events"])
    # Nothing resent: each POST answered 200, on the route its mode uses.
    paths = {post.path for post in posts}
    assert paths == ({"/v1/b"} if batching else {"/v1/i", "/v1/t", "/v1/p", "/v1/g", "/v1/a"})
    assert {post.status for post in posts} == {200}
    assert all(post.headers["authorization"].startswith("Basic ") for post in posts)

    by_type = {body["type"]: body for body in bodies}
    assert sorted(by_type) == sorted(TYPES)
    assert by_type["identify"]["traits"] == {"name": "Ada", "plan": "pro"}
    assert by_type["track"]["event"] == "Order Completed"
    assert by_type["track"]["properties"] == {"revenue": 42.5}
    assert by_type["page"]["properties"]["path"] == "/docs"
    assert by_type["page"]["properties"]["url"].startswith(site.origin)
    assert by_type["group"]["groupId"] == "g-1"
    assert (by_type["alias"]["Previous ID"], by_type["alias"]["User ID"]) == ("anon-1", "user-1")
    for body in bodies:
        assert body["context"]["library"]["name"] == "analytics.js"
        assert body["context"]["userAgent"]

    if telemetry:  # analytics.js's own telemetry, pointed at efd: accepted and counted
        await eventually(lambda: daemon.metrics.telemetry_discarded > 0)
        await eventually(lambda: any(p.path == "/v1/m" and p.status == 200 for p in page.sent))
    page.check_clean()


@pytest.mark.parametrize(
    ("refusal", "status"), [("wrong write key", 401), ("origin not allowed", 403)]
)
async def test_a_refusal_is_a_failed_delivery_not_a_retry(
    refusal: str,
    status: int,
    site: Any,
    pages: Any,
    sqlite_url: str,
    receiver_factory: ReceiverFactory,
    daemon_factory: DaemonFactory,
) -> None:
    receiver = await receiver_factory()
    settings = settings_dict(sqlite_url, [receiver.url])
    write_key = WRITE_KEY
    if refusal == "wrong write key":
        write_key = "wk_wrong"
    else:
        settings["sources"][0]["allowed_origins"] = ["https://shop.example"]
    daemon = await daemon_factory(settings)
    page = await pages(f"{site.origin}/page.html")
    result = await page.evaluate(
        "run",
        {
            "writeKey": write_key,
            "apiHost": f"127.0.0.1:{daemon.port}/v1",
            "batching": False,
            "telemetry": False,
        },
    )
    # The page read efd's answer (it carries Access-Control-Allow-Origin), so analytics.js
    # reports each event as failed instead of queueing it for a retry.
    assert [e["failed"] for e in result["events"]] == [f"Non-retryable error: {status}"] * 5
    assert result["errors"] == ["delivery_failure"] * 5
    posts = await page.answered_posts(daemon.port, 5)
    assert [post.status for post in posts] == [status] * 5
    assert sql(sqlite_url, "SELECT count(*) FROM messages") == [(0,)]
    page.check_clean()


async def test_events_sent_while_efd_is_down_arrive_once_with_x_retry_count(
    site: Any,
    pages: Any,
    sqlite_url: str,
    receiver_factory: ReceiverFactory,
    daemon_factory: DaemonFactory,
) -> None:
    receiver = await receiver_factory()
    port = free_port()  # efd will listen here, once the page has failed to reach it
    page = await pages(f"{site.origin}/page.html")
    result = await page.evaluate(
        "run",
        {
            "writeKey": WRITE_KEY,
            "apiHost": f"127.0.0.1:{port}/v1",
            "batching": False,
            "telemetry": False,
        },
    )
    # analytics.js kept them to retry: nothing failed for good.
    assert [e["failed"] for e in result["events"]] == [None] * 5
    # Each first attempt failed: nothing listened there yet.
    await eventually(lambda: len([s for s in page.posts_to(port) if s.failed]) >= 5)
    settings = settings_dict(sqlite_url, [receiver.url])
    settings["server"]["port"] = port
    await daemon_factory(settings)

    await delivered_once(sqlite_url, receiver, [e["messageId"] for e in result["events"]])

    def succeeded() -> list[Sent] | None:
        ok = [post for post in page.posts_to(port) if post.status == 200]
        return ok if len(ok) >= 5 else None

    answered: list[Sent] = await eventually(succeeded)
    # Before efd listened the browser got no answer at all; after, only 200s.
    assert {post.status for post in page.posts_to(port)} <= {None, 200}
    assert sorted(m for post in answered for m in post.message_ids()) == sorted(
        e["messageId"] for e in result["events"]
    )
    # Retries say so; the browser sent that header after a preflight that allowed it.
    assert all(int(post.headers["x-retry-count"]) >= 1 for post in answered)
    page.check_clean()
