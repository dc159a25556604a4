"""End to end: the Go client (clients/go) sends every message type to a running efd, and
the bodies arrive at a webhook receiver."""

from __future__ import annotations

import asyncio
import os
import shutil
import subprocess

import pytest

from tests.conftest import ROOT, WRITE_KEY, DaemonFactory, ReceiverFactory, settings_dict

GO = shutil.which("go")


@pytest.fixture
def go() -> str:
    if GO is None:
        if os.environ.get("EFD_REQUIRE_GO") == "1":
            pytest.fail("the Go toolchain is required (scripts/test installs it) but not on PATH")
        pytest.skip("no Go toolchain on PATH (scripts/test installs one)")
    return GO


async def test_go_client_example_delivers_every_type(
    go: str, db_url: str, receiver_factory: ReceiverFactory, daemon_factory: DaemonFactory
) -> None:
    receiver = await receiver_factory()
    daemon = await daemon_factory(settings_dict(db_url, [receiver.url]))
    env = {
        **os.environ,
        "EFD_ENDPOINT": f"http://127.0.0.1:{daemon.port}",
        "EFD_WRITE_KEY": WRITE_KEY,
        "GOTOOLCHAIN": "local",
        "GOPROXY": "off",
    }
    result = await asyncio.to_thread(
        subprocess.run,
        [go, "run", "./example"],
        cwd=ROOT / "clients" / "go",
        env=env,
        capture_output=True,
        text=True,
        timeout=180,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    requests = await receiver.wait_for(5)
    bodies = {r.json()["type"]: r.json() for r in requests}
    assert set(bodies) == {"identify", "track", "page", "group", "alias"}
    assert bodies["identify"]["traits"] == {"name": "Ada", "plan": "pro"}
    assert bodies["track"]["event"] == "Order Completed"
    assert bodies["track"]["properties"] == {"revenue": 42.5}
    assert bodies["page"]["properties"] == {
        "url": "https://example.com/",
        "title": "Home",
        "name": "Home",
    }
    assert bodies["group"]["groupId"] == "g-1"
    assert bodies["group"]["traits"] == {"name": "Acme"}
    assert (bodies["alias"]["Previous ID"], bodies["alias"]["User ID"]) == ("anon-1", "go-user-1")
    for body in bodies.values():
        assert body["userId"] == "go-user-1"
        assert body["messageId"]
        assert body["context"]["library"]["name"]
