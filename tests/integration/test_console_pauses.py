"""The console's pause and resume, in a real Chromium against a real daemon: the badge says
what is paused, the buttons pause and resume the destination and one hook."""

from __future__ import annotations

from pathlib import Path

from tests.conftest import DaemonFactory, ReceiverFactory, post, settings_dict, sql
from tests.integration.test_browser import Browser, browser  # noqa: F401  (the fixture)
from tests.integration.test_console import TOKEN, Console, port


async def test_console_pauses_and_resumes_a_destination_and_a_hook(
    tmp_path: Path,
    browser: Browser,  # noqa: F811
    receiver_factory: ReceiverFactory,
    daemon_factory: DaemonFactory,
) -> None:
    first, second = await receiver_factory(), await receiver_factory()
    db_url = f"sqlite:///{tmp_path}/efd.db"
    settings = settings_dict(db_url, [first.url, second.url])
    settings["server"]["admin_token"] = TOKEN
    daemon = await daemon_factory(settings)
    console = Console(browser, f"http://127.0.0.1:{port(daemon)}/console", tmp_path / "images")
    await console.open()
    panel = '.destination[data-destination="hooks"]'
    try:
        await console.log_in()
        await console.click("#tabs button[data-view=destinations]")
        await console.wait(f"{panel} .destination-head .pause-button")
        await console.click(f"{panel} .destination-head .pause-button")
        await console.wait(f"{panel} .destination-head .badge.paused")
        assert sql(db_url, "SELECT destination, hook, kind FROM pauses") == [
            ("hooks", None, "paused")
        ]
        status, _ = await post(port(daemon), "/v1/track", {"userId": "u", "event": "E"})
        assert status == 200
        await console.click(f"{panel} .destination-head .resume-button")
        await console.wait(f"{panel} .destination-head .pause-button")
        await first.wait_for(1)

        # The second hook alone: the head says partly, its row says paused.
        await console.click(f"{panel} tr.hook:nth-child(2) .pause-button")
        await console.wait(f'{panel} tr.hook[data-paused="paused"] .badge.paused')
        await console.wait(f"{panel} .destination-head .badge.partly")
        assert sql(db_url, "SELECT destination, hook, kind FROM pauses") == [("hooks", 2, "paused")]
        await console.click(f'{panel} tr.hook[data-paused="paused"] .resume-button')
        await console.wait(f"{panel} tr.hook:nth-child(2) .pause-button")
        assert sql(db_url, "SELECT count(*) FROM pauses") == [(0,)]
        assert console.errors == []
    finally:
        await console.close()
