"""The web console (/console) in a real Chromium (Playwright, the system browser): the live
feed, a message's attempts, the destinations' health, a redrive, search, and an ordered
destination's blocked lanes. Every wait is on the page's DOM or on what a receiver got. The
first test screenshots each view: into $EFD_SCREENSHOTS when set (the README's images:
`EFD_SCREENSHOTS=docs/img`), else into the test's temporary directory, so a test run leaves the
working tree as it found it."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from collections import defaultdict
from collections.abc import Awaitable, Callable
from importlib import resources
from pathlib import Path
from typing import Any

import aiohttp
from aiohttp import web

from efd.daemon import Daemon
from tests.conftest import Receiver, eventually, post, settings_dict
from tests.integration.test_browser import Browser, browser  # noqa: F401  (the fixture)
from tests.jsclients import JS, need

TOKEN = "console-secret-0123456789"
FILES = resources.files("efd.http").joinpath("console")
SCRIPTS = sorted(entry.name for entry in FILES.iterdir() if entry.name.endswith(".js"))
# Run before the page's own scripts: each policy violation, as its directive and what it blocked.
VIOLATIONS = """
window.violations = [];
document.addEventListener("securitypolicyviolation",
    (e) => window.violations.push(e.violatedDirective + " " + e.blockedURI));
"""

DaemonFactory = Callable[..., Awaitable[Daemon]]
ReceiverFactory = Callable[..., Awaitable[Receiver]]


def port(daemon: Daemon) -> int:
    assert daemon.port is not None, "the daemon is not listening"
    return daemon.port


class Switch:
    """A receiver's behaviour: answers `status` until changed."""

    def __init__(self, status: int) -> None:
        self.status = status

    async def __call__(self, _request: web.Request, _n: int) -> web.StreamResponse:
        return web.json_response({"status": self.status}, status=self.status)


class ByUser:
    """A receiver's behaviour: 503 for the users in `failing`, 200 for the others; notes the
    messageIds each user's requests carried, in the order they came."""

    def __init__(self, *failing: str) -> None:
        self.failing = set(failing)
        self.seen: dict[str, list[str]] = defaultdict(list)

    async def __call__(self, request: web.Request, _n: int) -> web.StreamResponse:
        body = json.loads(await request.read())
        self.seen[body["userId"]].append(body["messageId"])
        status = 503 if body["userId"] in self.failing else 200
        return web.json_response({"status": status}, status=status)


class Console:
    def __init__(self, chromium: Browser, url: str, images: Path) -> None:
        self.browser = chromium
        self.url = url
        self.images = images
        self.page: Any = None
        self.context: Any = None
        self.errors: list[str] = []
        self.responses: list[tuple[str, int, str]] = []  # url, status, content type

    async def open(self) -> None:
        async def open_() -> None:
            self.context = await self.browser.browser.new_context(
                viewport={"width": 1280, "height": 800}
            )
            await self.context.add_init_script(VIOLATIONS)
            self.page = await self.context.new_page()
            self.page.on("pageerror", lambda e: self.errors.append(str(e)))
            self.page.on(
                "console",
                lambda m: self.errors.append(m.text) if m.type == "error" else None,
            )
            self.page.on(
                "response",
                lambda r: self.responses.append(
                    (r.url, r.status, r.headers.get("content-type", ""))
                ),
            )
            await self.page.goto(self.url)

        await self.browser.run(open_)

    async def do(self, action: Any) -> Any:
        return await self.browser.run(lambda: action(self.page))

    async def log_in(self) -> None:
        """With the admin token, as an operator does."""
        await self.do(lambda page: page.fill("#token", TOKEN))
        await self.click("#login-form button[type=submit]")

    async def wait(self, selector: str, timeout: float = 10_000) -> None:
        await self.do(lambda page: page.wait_for_selector(selector, timeout=timeout))

    async def click(self, selector: str) -> None:
        await self.do(lambda page: page.click(selector))

    async def text(self, selector: str) -> str:
        text: str = await self.do(lambda page: page.text_content(selector))
        return text

    async def screenshot(self, name: str) -> None:
        self.images.mkdir(parents=True, exist_ok=True)
        await self.do(lambda page: page.screenshot(path=str(self.images / name)))

    async def violations(self) -> list[str]:
        found: list[str] = await self.do(lambda page: page.evaluate("window.violations"))
        return found

    async def close(self) -> None:
        if self.context is not None:
            await self.browser.run(self.context.close)


async def test_console_loads_its_modules_with_no_error_or_policy_violation(
    tmp_path: Path,
    browser: Browser,  # noqa: F811
    daemon_factory: DaemonFactory,
) -> None:
    settings = settings_dict(f"sqlite:///{tmp_path}/efd.db")
    settings["server"]["admin_token"] = TOKEN
    daemon = await daemon_factory(settings)
    base = f"http://127.0.0.1:{port(daemon)}/console"
    console = Console(browser, base, tmp_path / "images")
    await console.open()  # returns once the page has loaded: its modules have run
    try:
        # Every script of the package is a module the page imports, served as JavaScript.
        scripts = sorted(
            (url.removeprefix(base + "/"), status, kind)
            for url, status, kind in console.responses
            if url.endswith(".js")
        )
        assert scripts == [(name, 200, "text/javascript") for name in SCRIPTS]
        assert await console.violations() == []
        assert console.errors == []

        # They work together: the token opens the console and the feed goes live, and what
        # the data holds is shown as text.
        await console.log_in()
        await console.wait("#feed-state[data-state=live]")
        markup = '<img id="injected" src="/nothing"><b>bold</b>'
        await post(port(daemon), "/v1/track", {"userId": "u", "event": markup, "messageId": "m"})
        await console.wait('#feed li[data-message-id="m"]')
        shown = await console.text('#feed li[data-message-id="m"] .summary span:nth-child(4)')
        assert shown == markup
        assert await console.do(lambda page: page.locator("#feed img, #feed b").count()) == 0
        assert await console.violations() == []
        assert console.errors == []
    finally:
        await console.close()


def test_console_stream_parser_under_node() -> None:
    """The stream parser is a module without DOM: Node's test runner runs its tests."""
    path = shutil.which("node")
    need(path is not None, "no node on PATH", "EFD_REQUIRE_NODE")
    assert path is not None
    done = subprocess.run(
        [path, "--test", "console-eventstream.test.mjs"],
        cwd=JS,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    assert "# fail 0" in done.stdout
    assert "# pass 0" not in done.stdout


async def test_console_feed_attempts_health_redrive_and_search(
    tmp_path: Path,
    browser: Browser,  # noqa: F811
    receiver_factory: ReceiverFactory,
    daemon_factory: DaemonFactory,
) -> None:
    switch = Switch(200)
    receiver = await receiver_factory(switch)
    settings = settings_dict(f"sqlite:///{tmp_path}/efd.db", [receiver.url])
    settings["server"]["admin_token"] = TOKEN
    daemon = await daemon_factory(settings)
    images = Path(os.environ.get("EFD_SCREENSHOTS") or tmp_path / "screenshots")
    console = Console(browser, f"http://127.0.0.1:{port(daemon)}/console", images)
    await console.open()
    try:
        # The token is asked for, kept in the tab, and the feed goes live.
        await console.log_in()
        await console.wait("#feed-state[data-state=live]")
        stored = await console.do(
            lambda page: page.evaluate("sessionStorage.getItem('efd-admin-token')")
        )
        assert stored == TOKEN

        # A message sent shows in the feed within a second, then its delivery.
        for i in range(3):
            await post(
                port(daemon),
                "/v1/track",
                {"userId": f"user-{i}", "event": "Order Completed", "messageId": f"order-{i}"},
            )
        status, _ = await post(
            port(daemon),
            "/v1/track",
            {
                "userId": "user-42",
                "event": "Signed Up",
                "messageId": "feed-1",
                "properties": {"plan": "pro"},
            },
        )
        assert status == 200
        await console.wait('#feed li[data-message-id="feed-1"]', timeout=1000)
        await console.wait('#feed li[data-message-id="feed-1"] .badge.delivered')
        # Opened: its payload, its delivery and the attempt that delivered it.
        await console.click('#feed li[data-message-id="feed-1"] .summary')
        await console.wait('#feed li[data-message-id="feed-1"] .detail tr.attempt')
        payload = await console.text('#feed li[data-message-id="feed-1"] pre.payload')
        assert '"plan": "pro"' in payload
        code = await console.text('#feed li[data-message-id="feed-1"] tr.attempt .status-code')
        assert code == "200"
        await console.screenshot("console-feed.png")

        # The receiver refuses: the delivery fails and the health view shows why.
        switch.status = 400
        await post(
            port(daemon), "/v1/track", {"userId": "user-7", "event": "E", "messageId": "fail-1"}
        )
        await console.wait('#feed li[data-message-id="fail-1"] .badge.failed')
        await console.click("#tabs button[data-view=destinations]")
        await console.wait(
            '.destination[data-destination="hooks"] td.last-error:has-text("HTTP 400")'
        )
        await console.screenshot("console-destinations.png")

        # Back up: the redrive shows the dry run's count first, then sends it again.
        switch.status = 200
        await console.click('.destination[data-destination="hooks"] .redrive-start')
        await console.wait('.redrive-count[data-count="1"]')
        await console.click(".redrive-confirm")
        await console.wait('.redrive-done[data-count="1"]')
        await console.click("#tabs button[data-view=feed]")
        await console.wait('#feed li[data-message-id="fail-1"] .badge.delivered')

        # Search by userId finds it, delivered.
        await console.click("#tabs button[data-view=search]")
        await console.do(lambda page: page.select_option("#search-by", "user_id"))
        await console.do(lambda page: page.fill("#search-query", "user-7"))
        await console.click("#search-form button[type=submit]")
        await console.wait(
            '#search-results tr.result[data-message-id="fail-1"][data-status="delivered"]'
        )
        await console.click('#search-results tr.result[data-message-id="fail-1"]')
        await console.wait("#search-detail tr.attempt >> nth=1")  # the 400, then the 200
        await console.screenshot("console-search.png")

        # A burst beyond what the feed draws: it shows a sample and says so.
        await console.click("#tabs button[data-view=feed]")
        burst = [
            {"type": "track", "event": "Burst", "userId": "u", "messageId": f"burst-{i}"}
            for i in range(500)
        ]
        status, _ = await post(port(daemon), "/v1/batch", {"batch": burst})
        assert status == 200
        await console.wait("#feed-sample:not([hidden]):has-text('showing a sample')")
        drawn = await console.do(lambda page: page.locator("#feed > li").count())
        assert drawn <= 200
        assert console.errors == []
    finally:
        await console.close()


async def test_console_shows_a_destination_no_longer_configured_and_discards_it(
    tmp_path: Path,
    browser: Browser,  # noqa: F811
    receiver_factory: ReceiverFactory,
    daemon_factory: DaemonFactory,
) -> None:
    async def unavailable(_request: web.Request, _n: int) -> web.StreamResponse:
        return web.json_response({"down": True}, status=503)

    hooks, old = await receiver_factory(), await receiver_factory(unavailable)
    settings = settings_dict(f"sqlite:///{tmp_path}/efd.db", [hooks.url])
    settings["server"]["admin_token"] = TOKEN
    settings["destinations"].append(
        {"name": "old", "type": "webhooks", "hooks": [{"url": old.url}]}
    )
    settings["sources"][0]["destinations"] = ["hooks", "old"]
    first = await daemon_factory(settings)
    for i in range(2):
        await post(port(first), "/v1/track", {"userId": "u", "event": "E", "messageId": f"m-{i}"})
    await old.wait_for(2)  # refused and retried: pending
    await first.stop()
    settings["destinations"] = settings["destinations"][:1]
    settings["sources"][0]["destinations"] = ["hooks"]
    daemon = await daemon_factory(settings)  # "old" is no longer configured

    console = Console(browser, f"http://127.0.0.1:{port(daemon)}/console", tmp_path / "images")
    await console.open()
    try:
        await console.log_in()
        await console.click("#tabs button[data-view=destinations]")
        panel = '.destination[data-destination="old"][data-configured="false"]'
        await console.wait(f"{panel} .badge.unconfigured")
        assert await console.text(f"{panel} .backlog") == "backlog 2"
        assert "never sent" in await console.text(f"{panel} .notice")
        # A configured destination offers a redrive, this one a discard: dry run first.
        assert await console.do(lambda page: page.locator(f"{panel} .redrive-start").count()) == 0
        await console.click(f"{panel} .discard-start")
        await console.wait(f'{panel} .discard-count[data-count="2"]')
        await console.click(f"{panel} .discard-confirm")
        await console.wait(f'{panel} .discard-done[data-count="2"]')
        await console.click("#refresh-destinations")
        await console.wait('.destination[data-destination="hooks"]')
        await console.do(lambda page: page.wait_for_selector(panel, state="detached"))
        assert console.errors == []
    finally:
        await console.close()


async def test_console_shows_an_ordered_destinations_blocked_lane_until_its_head_goes_through(
    db_url: str,
    tmp_path: Path,
    browser: Browser,  # noqa: F811
    receiver_factory: ReceiverFactory,
    daemon_factory: DaemonFactory,
) -> None:
    state = ByUser("stuck")
    receiver = await receiver_factory(state)
    settings = settings_dict(db_url, [receiver.url])
    settings["server"]["admin_token"] = TOKEN
    settings["destinations"][0]["ordering"] = "per_user"
    # The stuck user's retries alone would open the hook's circuit, which holds every lane
    # until a probe: here only the lane may hold.
    settings["delivery"]["circuit_failures"] = 1000
    daemon = await daemon_factory(settings)
    await post(port(daemon), "/v1/track", {"userId": "fine", "event": "E", "messageId": "fine-1"})
    await eventually(lambda: state.seen["fine"] == ["fine-1"])

    console = Console(browser, f"http://127.0.0.1:{port(daemon)}/console", tmp_path / "images")
    await console.open()
    try:
        await console.log_in()
        await console.click("#tabs button[data-view=destinations]")
        lanes = '.destination[data-destination="hooks"] .lanes'
        await console.wait(f"{lanes}:not(.blocked)")
        assert await console.text(lanes) == "ordered per user, no lane blocked"

        # The stuck user's head fails and is retried; the one after it waits in the lane,
        # and the fine user's lane goes on.
        batch = [
            {"type": "track", "userId": u, "event": "E", "messageId": m}
            for u, m in (("stuck", "stuck-1"), ("stuck", "stuck-2"), ("fine", "fine-2"))
        ]
        status, _ = await post(port(daemon), "/v1/batch", {"batch": batch})
        assert status == 200
        # A second request for the head: its first attempt's outcome is stored.
        await eventually(lambda: state.seen["stuck"][:2] == ["stuck-1", "stuck-1"])
        await eventually(lambda: state.seen["fine"] == ["fine-1", "fine-2"])
        assert "stuck-2" not in state.seen["stuck"]
        await console.click("#refresh-destinations")
        await console.wait(f"{lanes}.blocked")
        note = await console.text(lanes)
        assert note.startswith("1 blocked lane; longest: message stuck-1 since "), note

        # The receiver takes the stuck user again: the head goes through, then the one after.
        state.failing.clear()
        await eventually(lambda: state.seen["stuck"][-2:] == ["stuck-1", "stuck-2"])
        await console.click("#refresh-destinations")
        await console.wait(f"{lanes}:not(.blocked)")
        assert await console.text(lanes) == "ordered per user, no lane blocked"
        assert console.errors == []
    finally:
        await console.close()


async def test_console_is_off_without_an_admin_token(
    tmp_path: Path, daemon_factory: DaemonFactory
) -> None:
    daemon = await daemon_factory(settings_dict(f"sqlite:///{tmp_path}/efd.db"))
    async with (
        aiohttp.ClientSession() as session,
        session.get(f"http://127.0.0.1:{port(daemon)}/console") as response,
    ):
        assert response.status == 403
        answer = await response.json()
    assert answer["code"] == "admin_api_disabled"
    assert "admin_token" in answer["message"]


async def test_console_serves_its_files_and_nothing_else(
    tmp_path: Path, daemon_factory: DaemonFactory
) -> None:
    settings = settings_dict(f"sqlite:///{tmp_path}/efd.db")
    settings["server"]["admin_token"] = TOKEN
    daemon = await daemon_factory(settings)
    base = f"http://127.0.0.1:{port(daemon)}/console"
    async with aiohttp.ClientSession() as session:
        async with session.get(base) as response:
            assert response.status == 200
            assert response.content_type == "text/html"
            assert "script-src 'self'" in response.headers["Content-Security-Policy"]
            page = await response.text()
            assert '<script type="module" src="/console/console.js"></script>' in page
        files = [(name, "text/javascript") for name in SCRIPTS] + [("console.css", "text/css")]
        for name, kind in files:
            async with session.get(f"{base}/{name}") as response:
                assert (response.status, response.content_type) == (200, kind)
                assert response.headers["X-Content-Type-Options"] == "nosniff"
        for name in ("..%2Fapp.py", "console.py", "nothing.js", "console.html"):
            async with session.get(f"{base}/{name}") as response:
                assert response.status == 404


async def test_console_feed_opens_on_the_newest_messages_with_each_destinations_state(
    tmp_path: Path,
    browser: Browser,  # noqa: F811
    receiver_factory: ReceiverFactory,
    daemon_factory: DaemonFactory,
) -> None:
    healthy = await receiver_factory()
    failing = await receiver_factory(Switch(503))
    settings = settings_dict(f"sqlite:///{tmp_path}/efd.db", [healthy.url])
    settings["server"]["admin_token"] = TOKEN
    settings["delivery"].update(retry_initial_seconds=600, retry_max_seconds=600)
    # "ordered" posts to the same URL as "hooks": each counts only its own attempts.
    settings["destinations"] += [
        {"name": "down", "type": "webhooks", "hooks": [{"url": failing.url}]},
        {
            "name": "ordered",
            "type": "webhooks",
            "ordering": "per_user",
            "hooks": [{"url": healthy.url}],
        },
    ]
    settings["sources"][0]["destinations"] += ["down", "ordered"]
    daemon = await daemon_factory(settings)
    url = f"http://127.0.0.1:{port(daemon)}/console"

    console = Console(browser, url, tmp_path / "images")
    await console.open()
    try:
        await console.log_in()
        await console.wait("#feed-empty:not([hidden])")
        assert (await console.text("#feed-empty")).startswith("no messages yet")
    finally:
        await console.close()

    for i in range(2):
        status, _ = await post(
            port(daemon), "/v1/track", {"userId": "u", "event": "E", "messageId": f"early-{i}"}
        )
        assert status == 200
    await healthy.wait_for(4)
    await failing.wait_for(2)

    console = Console(browser, url, tmp_path / "images")
    await console.open()
    try:
        await console.log_in()
        # Stored before the page opened: shown at once, newest first, each destination's
        # delivery as stored (the failing one tried and waiting for its retry: failing, as
        # the live feed says it).
        for i in range(2):
            await console.wait(
                f'#feed li[data-message-id="early-{i}"] '
                '.badge.failed:has-text("2 of 3 delivered · down failing")'
            )
        order = await console.do(
            lambda page: page.eval_on_selector_all(
                "#feed > li", "items => items.map(li => li.dataset.messageId)"
            )
        )
        assert order == ["early-1", "early-0"]
        assert await console.do(lambda page: page.is_hidden("#feed-empty"))

        # Live: not `delivered` while one destination's attempts fail.
        await console.wait("#feed-state[data-state=live]")
        status, _ = await post(
            port(daemon), "/v1/track", {"userId": "u", "event": "E", "messageId": "live-1"}
        )
        assert status == 200
        await console.wait(
            '#feed li[data-message-id="live-1"] '
            '.badge.failed:has-text("2 of 3 delivered · down failing")'
        )

        # Hook statistics per destination: the shared URL shows each its own attempts.
        await console.click("#tabs button[data-view=destinations]")
        for name in ("hooks", "ordered"):
            await console.wait(
                f'.destination[data-destination="{name}"] tr.hook td:nth-child(5):text-is("3")'
            )
        # Each destination's chart: one bar of each kind per minute of the last hour.
        for name in ("hooks", "down", "ordered"):
            chart = f'.destination[data-destination="{name}"] svg.rates'
            for kind in ("delivered", "failed"):
                bars = await console.do(
                    lambda page, c=chart, k=kind: page.locator(f"{c} rect.{k}").count()
                )
                assert bars == 60, (name, kind, bars)
        title = await console.text('.destination[data-destination="hooks"] svg.rates title')
        assert title == "last 60 min: 3 delivered, 0 failed"
        assert console.errors == []
    finally:
        await console.close()
