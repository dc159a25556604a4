"""Node.js libraries as published (tests/js/package-lock.json pins them), sending to efd:
every event delivered once at a real receiver."""

from __future__ import annotations

import asyncio
import json
import subprocess

import pytest

from tests.conftest import WRITE_KEY, DaemonFactory, ReceiverFactory, settings_dict
from tests.jsclients import JS, delivered_once, node

COUNT = 100


@pytest.fixture
def node_program() -> str:
    """node, checked before any database is made for a test that would skip."""
    return node()


@pytest.mark.parametrize(
    "library",
    [
        "segment",  # @segment/analytics-node
        "rudderstack",  # @rudderstack/rudder-sdk-node, gzip on
    ],
)
async def test_node_library_delivers_every_event_once(
    library: str,
    node_program: str,
    db_url: str,
    receiver_factory: ReceiverFactory,
    daemon_factory: DaemonFactory,
) -> None:
    receiver = await receiver_factory()
    daemon = await daemon_factory(settings_dict(db_url, [receiver.url]))
    done = await asyncio.to_thread(
        subprocess.run,
        [
            node_program,
            "node-senders.mjs",
            library,
            f"http://127.0.0.1:{daemon.port}",
            WRITE_KEY,
            str(COUNT),
        ],
        cwd=JS,
        capture_output=True,
        text=True,
        timeout=90,
        check=False,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    report = json.loads(done.stdout.strip().splitlines()[-1])
    assert report["errors"] == []
    assert len(report["sent"]) == COUNT
    bodies = await delivered_once(db_url, receiver, report["sent"])
    assert {body["event"] for body in bodies} == {"Order Completed"}
    assert sorted(body["properties"]["i"] for body in bodies) == list(range(COUNT))
