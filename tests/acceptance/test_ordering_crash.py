"""Ordered delivery across kill -9: real `efd serve` processes killed mid-lane (on
PostgreSQL two at once, sharing the lanes), a receiver that fails at random. Nothing is lost,
and the sequence the receiver sees of each lane, duplicates included, never goes backwards."""

from __future__ import annotations

import asyncio
import json
import random
from collections import defaultdict
from pathlib import Path
from typing import Any

import pytest
from aiohttp import web

from tests.conftest import (
    DaemonProcess,
    ReceiverFactory,
    eventually,
    free_port,
    post,
    settings_dict,
    sql,
    write_toml,
)

pytestmark = pytest.mark.slow

USERS = [f"user-{i}" for i in range(6)]
PER_USER = 25


def _process(tmp_path: Path, settings: dict[str, Any], name: str) -> DaemonProcess:
    settings = {**settings, "server": {"host": "127.0.0.1", "port": free_port()}}
    settings["logging"] = {"level": "INFO"}
    path = write_toml(tmp_path / f"{name}.toml", settings)
    return DaemonProcess(path, settings["server"]["port"], tmp_path / f"{name}.log")


async def test_kill_9_mid_lane_never_sends_a_lane_backwards(
    db_url: str, receiver_factory: ReceiverFactory, tmp_path: Path
) -> None:
    rng = random.Random(2027)
    seen: dict[str, list[int]] = defaultdict(list)

    async def flaky(request: web.Request, _n: int) -> web.StreamResponse:
        body = json.loads(await request.read())
        seen[body["userId"]].append(int(body["messageId"].rsplit("-", 1)[1]))
        await asyncio.sleep(rng.uniform(0, 0.02))
        return web.Response(status=503 if rng.random() < 0.2 else 200)

    receiver = await receiver_factory(flaky)
    settings = settings_dict(
        db_url,
        [receiver.url],
        delivery={
            "timeout_seconds": 1,
            "lease_seconds": 6.5,  # heads a killed process held are claimable again soon
            "retry_initial_seconds": 0.05,
            "retry_max_seconds": 0.2,
            "retry_window_seconds": 600,
            "circuit_failures": 1000,
        },
    )
    settings["destinations"][0]["ordering"] = "per_user"
    several = not db_url.startswith("sqlite")
    names = ["a", "b"] if several else ["a"]
    daemons = {name: _process(tmp_path, settings, name) for name in names}
    try:
        for d in daemons.values():
            d.start()
        first = daemons["a"]
        # Sent in 5 requests of 5 messages per user, spread over the daemons.
        for step in range(PER_USER // 5):
            target = daemons[names[step % len(names)]]
            status, _ = await post(
                target.port,
                "/v1/batch",
                {
                    "batch": [
                        {"type": "track", "userId": u, "event": "E", "messageId": f"{u}-{i}"}
                        for i in range(step * 5, step * 5 + 5)
                        for u in USERS
                    ]
                },
            )
            assert status == 200
        # Three kills, each once the receiver has seen more: mid-lane every time.
        for round_ in range(3):
            before = sum(len(v) for v in seen.values())

            def more(b: int = before) -> bool:
                return sum(len(v) for v in seen.values()) >= b + 20

            await eventually(more)
            victim = daemons[names[round_ % len(names)]]
            victim.kill()
            victim.start()
        del first

        def delivered() -> bool:
            return sql(db_url, "SELECT count(*) FROM deliveries WHERE status = 'delivered'") == [
                (len(USERS) * PER_USER,)
            ]

        await eventually(delivered, timeout=120)
    finally:
        for d in daemons.values():
            d.ensure_stopped()
    for user in USERS:
        sequence = seen[user]
        assert sequence == sorted(sequence), (user, sequence)
        assert set(sequence) == set(range(PER_USER))
    assert sql(db_url, "SELECT count(*) FROM lanes") == [(0,)]
