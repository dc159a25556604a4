"""The official Segment Python library, pointed at efd, with the messages arriving at a
real receiver: the compatibility promise, shown with the library itself."""

from __future__ import annotations

import asyncio

import pytest
from segment.analytics.client import Client

from efd.segment import webhooks
from tests.conftest import SECRET, WRITE_KEY, DaemonFactory, ReceiverFactory, settings_dict


@pytest.mark.parametrize("gzip", [False, True])
async def test_segment_python_library_delivers_every_type(
    gzip: bool, db_url: str, receiver_factory: ReceiverFactory, daemon_factory: DaemonFactory
) -> None:
    receiver = await receiver_factory()
    daemon = await daemon_factory(settings_dict(db_url, [receiver.url]))
    errors: list[Exception] = []

    def send() -> None:
        client = Client(
            WRITE_KEY,
            host=f"http://127.0.0.1:{daemon.port}",
            gzip=gzip,
            on_error=lambda error, _items: errors.append(error),
            max_retries=1,
        )
        client.identify("user-1", {"name": "Ada", "friends": 3})
        client.track("user-1", "Order Completed", {"revenue": 39.95, "currency": "EUR"})
        client.page("user-1", "Docs", "Home", {"url": "https://example.com/", "path": "/"})
        client.screen("user-1", "App", "Settings", {"tab": "privacy"})
        client.group("user-1", "group-7", {"name": "Acme"})
        client.alias("anon-42", "user-1")
        client.flush()  # the library batches in a background thread, as in production
        client.join()

    await asyncio.to_thread(send)
    assert errors == []
    requests = await receiver.wait_for(6)
    bodies = {r.json()["type"]: r.json() for r in requests}
    assert set(bodies) == {"identify", "track", "page", "screen", "group", "alias"}
    for request in requests:
        assert request.headers["X-Signature"] == webhooks.sign(SECRET, request.body)

    assert bodies["identify"]["traits"] == {"name": "Ada", "friends": 3}
    assert bodies["track"]["event"] == "Order Completed"
    assert bodies["track"]["properties"] == {"revenue": 39.95, "currency": "EUR"}
    assert bodies["page"]["properties"]["url"] == "https://example.com/"
    assert bodies["page"]["properties"]["name"] == "Home"
    assert bodies["screen"]["name"] == "Settings"
    assert bodies["group"]["groupId"] == "group-7"
    assert bodies["alias"]["Previous ID"] == "anon-42"
    assert bodies["alias"]["User ID"] == "user-1"
    for body in bodies.values():
        assert body["userId"] == "user-1"
        assert body["version"] == 1
        assert body["timestamp"].endswith("Z")
        assert len(body["timestamp"]) == 24
        # The library's own context travels with every message.
        assert body["context"]["library"]["name"] == "analytics-python"
