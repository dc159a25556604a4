"""The circuit breaker against a real receiver on 127.0.0.1: down while thousands of
messages queue, then back."""

from __future__ import annotations

import itertools
import time
from collections import Counter

from aiohttp import web

from efd.observe.metrics import Metrics
from tests.conftest import DaemonFactory, ReceiverFactory, eventually, post, settings_dict, sql

MESSAGES = 2000
THRESHOLD = 5
PROBE = 0.4  # seconds
PER_HOOK = 4  # rounds in flight to one hook


async def test_open_circuit_sends_only_probes_and_a_closed_one_drains_the_backlog(
    db_url: str, receiver_factory: ReceiverFactory, daemon_factory: DaemonFactory
) -> None:
    up = False
    before_open = 0  # requests that arrived before the circuit opened
    while_open: list[float] = []  # when each request arrived while it was open
    metrics: Metrics | None = None
    delivered: Counter[str] = Counter()  # messageId -> times answered 200

    async def behaviour(request: web.Request, _n: int) -> web.StreamResponse:
        body = await request.json()
        nonlocal before_open
        if not up:
            assert metrics is not None
            if metrics.circuit_open.get(key) == 1:
                while_open.append(time.monotonic())
            else:
                before_open += 1
            return web.Response(status=503)
        delivered[body["messageId"]] += 1
        return web.Response(status=200)

    receiver = await receiver_factory(behaviour)
    key = ("hooks", receiver.url)
    settings = settings_dict(
        db_url,
        [receiver.url],
        delivery={
            "circuit_failures": THRESHOLD,
            "circuit_probe_seconds": PROBE,
            "max_per_hook": PER_HOOK,
            # Backoffs far longer than this test: only the circuit closing can make the
            # deliveries that failed during the outage due again in time.
            "retry_initial_seconds": 120,
            "retry_max_seconds": 1800,
            "retry_window_seconds": 14400,
        },
    )
    daemon = await daemon_factory(settings)
    metrics = daemon.metrics
    for start in range(0, MESSAGES, 100):
        batch = [
            {"type": "track", "event": "E", "userId": "u", "messageId": f"m-{i}"}
            for i in range(start, start + 100)
        ]
        status, _ = await post(daemon.port, "/v1/batch", {"batch": batch})
        assert status == 200

    # While open, only probes: one at a time, each at least an interval after the last.
    await eventually(lambda: len(while_open) >= 3, timeout=20)
    gaps = [b - a for a, b in itertools.pairwise(while_open)]
    assert min(gaps) >= PROBE * 0.9, gaps
    # Before it opened, only the failures that opened it and the rounds then in flight.
    assert THRESHOLD <= before_open < THRESHOLD + PER_HOOK
    pending = sql(db_url, "SELECT count(*) FROM deliveries WHERE status = 'pending'")[0][0]
    assert pending == MESSAGES

    up = True  # the next probe succeeds, closes the circuit and wakes the backlog
    await eventually(lambda: len(delivered) == MESSAGES, timeout=30)
    assert daemon.metrics.circuit_open[key] == 0
    await eventually(
        lambda: (
            sql(db_url, "SELECT status, count(*) FROM deliveries GROUP BY status")
            == [("delivered", MESSAGES)]
        )
    )
    assert set(delivered.values()) == {1}  # each message once
    assert len(delivered) == MESSAGES
