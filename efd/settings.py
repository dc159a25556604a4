"""The running configuration, held in one place.

Components read the configuration through a `Current` holder given to their constructor,
at the time they use it, rather than keeping a copy each and a `reload` method to replace
it. A reload (efd.daemon) validates the new configuration (efd.config.load), then
`replace`s the holder's value: the holder swaps it and tells each subscriber, in order,
so that a component that keeps something derived from it (a map of write keys, the routes
of the destinations) rebuilds it.

Subscribers marked `early` are told first: the parts that must know a destination before
anything routes a message to it (the senders, the dispatcher).
"""

from __future__ import annotations

import inspect
from collections.abc import Awaitable, Callable
from typing import Generic, TypeVar

from efd.config import Settings

T = TypeVar("T")

OnChange = Callable[[T], Awaitable[None] | None]


class Current(Generic[T]):
    """A value a reload replaces; `value` is always the latest."""

    def __init__(self, value: T) -> None:
        self._value = value
        self._early: list[OnChange[T]] = []
        self._late: list[OnChange[T]] = []

    @property
    def value(self) -> T:
        return self._value

    def subscribe(self, on_change: OnChange[T], *, early: bool = False) -> None:
        """Call `on_change(new)` (awaited if it returns an awaitable) after each replace."""
        (self._early if early else self._late).append(on_change)

    async def replace(self, value: T) -> None:
        """Swap in `value`, then tell the subscribers one after the other. A subscriber's
        exception ends the round: the rest keep what they had (efd logs it and says to
        restart)."""
        self._value = value
        for on_change in (*self._early, *self._late):
            result = on_change(value)
            if inspect.isawaitable(result):
                await result


CurrentSettings = Current[Settings]
