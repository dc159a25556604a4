"""Rate limits per hook (docs/delivery.md#rate-limits): a receiver counting arrivals never sees
more than the limit and its burst in any second, across daemons sharing a PostgreSQL store;
Retry-After in the attempt log; what operators see. Real daemons, real receivers on 127.0.0.1,
SQLite and PostgreSQL."""

from __future__ import annotations

import bisect
from pathlib import Path
from typing import Any

import pytest
from aiohttp import web

from efd import config
from tests.conftest import (
    DaemonFactory,
    ReceiverFactory,
    eventually,
    metric,
    metrics_text,
    post,
    settings_dict,
    sql,
)
from tests.integration.test_filters import TOKEN
from tests.integration.test_regulations import api

RATE = 10.0
BURST = 3.0


def limited(db_url: str, url: str, **hook: Any) -> dict[str, Any]:
    settings = settings_dict(db_url, [url])
    settings["server"]["admin_token"] = TOKEN
    settings["destinations"][0]["hooks"][0].update(max_per_second=RATE, burst=BURST, **hook)
    return settings


def busiest_second(times: list[float]) -> int:
    """The most of `times` within any one second (a sliding window starting at each)."""
    ordered = sorted(times)
    return max((bisect.bisect_left(ordered, t + 1.0) - i for i, t in enumerate(ordered)), default=0)


async def send_batch(port: int, count: int, prefix: str = "m") -> None:
    batch = [
        {"type": "track", "userId": "u", "event": "E", "messageId": f"{prefix}-{i}"}
        for i in range(count)
    ]
    status, answer = await post(port, "/v1/batch", {"batch": batch})
    assert status == 200, answer


def delivered(db_url: str) -> int:
    [(count,)] = sql(db_url, "SELECT count(*) FROM deliveries WHERE status = 'delivered'")
    return int(count)


async def test_a_backlog_reaches_the_receiver_no_faster_than_the_limit(
    db_url: str, receiver_factory: ReceiverFactory, daemon_factory: DaemonFactory
) -> None:
    receiver = await receiver_factory()
    daemon = await daemon_factory(limited(db_url, receiver.url))
    await send_batch(daemon.port, 40)
    await eventually(lambda: delivered(db_url) == 40, timeout=30)
    assert len(receiver.received) == 40
    # The rule, at the receiver: never more than a second's worth and the burst in a second.
    assert busiest_second([r.at for r in receiver.received]) <= RATE + BURST
    # ... and as efd logged its sends.
    sent = [at for (at,) in sql(db_url, "SELECT attempted_at FROM attempts")]
    assert busiest_second(sent) <= RATE + BURST
    text = await metrics_text(daemon.port, TOKEN)
    held = metric(text, "efd_requests_held_back_total", destination="hooks", hook=receiver.url)
    assert held is not None
    assert held > 0
    status, answer = await api(daemon.port, "GET", "/admin/destinations", token=TOKEN)
    assert status == 200, answer
    [hook] = next(d for d in answer["destinations"] if d["name"] == "hooks")["hooks"]
    assert (hook["maxPerSecond"], hook["burst"]) == (RATE, BURST)
    assert hook["heldBack"] == held


async def test_daemons_on_one_postgresql_store_share_the_limit(
    db_url: str, receiver_factory: ReceiverFactory, daemon_factory: DaemonFactory
) -> None:
    if db_url.startswith("sqlite"):
        pytest.skip("one daemon per SQLite file: the test above covers it")
    receiver = await receiver_factory()
    settings = limited(db_url, receiver.url)
    first = await daemon_factory(settings)
    second = await daemon_factory(settings)
    await send_batch(first.port, 25, "a")
    await send_batch(second.port, 25, "b")
    await eventually(lambda: delivered(db_url) == 50, timeout=30)
    # When the requests left, as both daemons logged them: one budget.
    sent = sorted(at for (at,) in sql(db_url, "SELECT attempted_at FROM attempts"))
    assert busiest_second(sent) <= RATE + BURST
    # 47 tokens beyond the burst accrue in 4.7 s; two budgets would take half of that.
    assert sent[-1] - sent[0] >= (50 - BURST) / RATE - 0.3
    # Arrivals: the bucket's reserve covers 0.1 s of uneven delay; on a test machine whose
    # cores run every worker's daemons a request can lag more, by one request's worth.
    assert busiest_second([r.at for r in receiver.received]) <= RATE + BURST + 1


async def test_retry_after_is_honoured_and_logged_with_the_attempt(
    db_url: str, receiver_factory: ReceiverFactory, daemon_factory: DaemonFactory
) -> None:
    async def busy_once(_request: web.Request, n: int) -> web.StreamResponse:
        if n == 1:
            return web.Response(status=429, headers={"Retry-After": "1"})
        return web.Response(status=200)

    receiver = await receiver_factory(busy_once)
    daemon = await daemon_factory(limited(db_url, receiver.url))
    await send_batch(daemon.port, 1)
    await eventually(lambda: delivered(db_url) == 1)
    rows = sql(db_url, "SELECT attempted_at, status_code, error FROM attempts ORDER BY id")
    assert [(code, error) for _, code, error in rows] == [(429, "Retry-After: 1 s"), (200, None)]
    assert rows[1][0] - rows[0][0] >= 1.0
    status, view = await api(daemon.port, "GET", "/admin/messages/web/m-0", token=TOKEN)
    assert status == 200, view
    assert view["deliveries"][0]["attempts"][0]["error"] == "Retry-After: 1 s"


def test_bad_limits_are_refused_naming_the_key(tmp_path: Path) -> None:
    settings = settings_dict(f"sqlite:///{tmp_path}/efd.db", ["http://127.0.0.1:9/h"])
    hooks = settings["destinations"][0]["hooks"]
    hooks.append({"url": "http://127.0.0.1:9/b", "burst": 5})
    hooks.append({"url": "http://127.0.0.1:9/c", "max_per_second": 0})
    hooks.append({"url": "http://127.0.0.1:9/d", "max_per_second": 5, "burst": 0.5})
    try:
        config.load(None, **settings)
    except config.ConfigError as error:
        text = str(error)
    else:
        raise AssertionError("the configuration was accepted")
    assert "destinations[0].hooks[1].burst" in text
    assert "destinations[0].hooks[2].max_per_second" in text
    assert "destinations[0].hooks[3].burst" in text


def test_the_burst_defaults_to_a_second_s_worth_and_at_least_one() -> None:
    assert config.HookConfig(url="http://127.0.0.1:9/x").limit() is None
    assert config.HookConfig(url="http://127.0.0.1:9/x", max_per_second=0.5).limit() == (0.5, 1)
    assert config.HookConfig(url="http://127.0.0.1:9/x", max_per_second=50).limit() == (50, 50)
    assert config.HookConfig(url="http://127.0.0.1:9/x", max_per_second=5, burst=2).limit() == (
        5,
        2,
    )
