"""The live stream's fan-out: nothing built without subscribers, a sample at high rates
(and saying so), and a full buffer dropping its subscriber."""

from __future__ import annotations

import json
from collections.abc import Callable

from efd.observe.stream import Hub, Subscriber


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def subscribe(hub: Hub, on_drop: Callable[[], None] = lambda: None) -> Subscriber:
    subscriber = hub.subscribe(on_drop)
    assert subscriber is not None  # these hubs stay under max_subscribers
    return subscriber


async def events(subscriber: Subscriber, timeout: float) -> list[tuple[str, str]]:
    got = await subscriber.next(timeout)
    assert got is not None, "the subscription ended"
    return got


async def test_events_reach_every_subscriber_in_order() -> None:
    hub = Hub(buffer=10, rate=100)
    first, second = subscribe(hub), subscribe(hub)
    hub.publish("message", {"n": 1})
    hub.publish("attempt", {"n": 2})
    for subscriber in (first, second):
        assert await events(subscriber, 1) == [("message", '{"n": 1}'), ("attempt", '{"n": 2}')]
    assert await events(first, 0.01) == []  # nothing more: the wait simply ends


async def test_over_the_rate_it_samples_and_says_how_many_it_left_out() -> None:
    clock = Clock()
    hub = Hub(buffer=100, rate=3, clock=clock)
    subscriber = subscribe(hub)
    for n in range(10):
        hub.publish("message", {"n": n})
    assert [json.loads(data)["n"] for _, data in await events(subscriber, 1)] == [0, 1, 2]
    clock.now = 1.0  # the next second's budget
    hub.publish("message", {"n": 10})
    assert await events(subscriber, 1) == [("sampled", '{"dropped": 7}'), ("message", '{"n": 10}')]


async def test_a_full_buffer_drops_the_subscriber_and_publishing_goes_on() -> None:
    dropped: list[str] = []
    hub = Hub(buffer=3, rate=1000)
    slow = subscribe(hub, lambda: dropped.append("slow"))
    reader = subscribe(hub, lambda: dropped.append("reader"))
    for n in range(3):
        hub.publish("message", {"n": n})
    assert len(await events(reader, 1)) == 3
    hub.publish("message", {"n": 3})  # the slow one's fourth: over its buffer
    assert dropped == ["slow"]
    assert (hub.subscribers, hub.dropped_subscribers) == (1, 1)
    assert await slow.next(1) is None
    assert await events(reader, 1) == [("message", '{"n": 3}')]


async def test_close_ends_every_subscription() -> None:
    hub = Hub()
    subscriber = subscribe(hub)
    active = hub.active
    hub.close()
    assert active
    assert not hub.active
    assert await subscriber.next(1) is None


async def test_an_event_no_subscriber_takes_is_never_built() -> None:
    built: list[int] = []

    def build() -> dict[str, int]:
        built.append(1)
        return {"n": len(built)}

    hub = Hub(buffer=100, rate=2, clock=Clock())
    hub.publish("message", build)  # no subscriber
    subscriber = subscribe(hub)
    for _ in range(5):
        hub.publish("message", build)
    assert len(built) == 2  # the two within the budget
    assert len(await events(subscriber, 1)) == 2
