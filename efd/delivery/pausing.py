"""Pauses as the dispatcher applies them (pure: no I/O; the store's rows come in as tuples).

A pause names a destination as configured and, optionally, one of its hooks by number,
counted from 1 in the configuration's order: the `[[destinations.hooks]]` of a webhooks
destination, the actions of an actions destination (each its own route, whose one hook is
the action). The number is what is stored, so a reload that reorders hooks moves the pause
to whichever hook is now at that position, and one that removes it leaves the pause stored
but without effect until the destination has that many hooks again.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import NamedTuple, Protocol

from efd.segment.webhooks import Route

PAUSED, DISABLED, FAILING = "paused", "disabled", "failing"


class Pause(NamedTuple):
    destination: str
    hook: int | None  # None: the whole destination
    kind: str  # paused | disabled (failing: a run of failures, not a pause)
    reason: str | None
    since: float


class Pauses(Protocol):
    """What the dispatcher asks of the store about pauses (efd/store/pauses.py)."""

    async def all(self) -> Sequence[tuple[str, int | None, str, str | None, float]]:
        """Every pause and disable, and every run of failures (kind failing)."""
        ...

    async def failing(
        self, destination: str, hook: int, began: float
    ) -> tuple[str, int | None, str, str | None, float]:
        """Note the hook's run of failures that began at `began`; the target's row
        afterwards (an earlier run's start, or a pause, when one is there)."""
        ...

    async def answered(self, destination: str, hook: int) -> bool:
        """The hook succeeded: end its run of failures."""
        ...

    async def disable(
        self, destination: str, hook: int, reason: str, started_before: float, now: float
    ) -> bool:
        """Disable the hook if its run of failures started by `started_before`."""
        ...


@dataclass(frozen=True, slots=True)
class Targets:
    """The configuration's numbering: each destination's hooks as (route name, URL), the
    first numbered 1; and which destination each route belongs to."""

    hooks: Mapping[str, tuple[tuple[str, str], ...]]
    owner: Mapping[str, str] = field(default_factory=dict)

    @classmethod
    def of(cls, destinations: Iterable[tuple[str, Sequence[Route]]]) -> Targets:
        hooks = {
            name: tuple((r.name, url) for r in routes for url, _ in r.hooks)
            for name, routes in destinations
        }
        owner = {route: name for name, numbered in hooks.items() for route, _ in numbered}
        return cls(hooks, owner)

    def routes_of(self, destination: str) -> tuple[str, ...]:
        return tuple(dict.fromkeys(route for route, _ in self.hooks.get(destination, ())))

    def number(self, route: str, url: str) -> tuple[str, int] | None:
        """(destination, hook number) of a route's hook URL."""
        destination = self.owner.get(route)
        if destination is None:
            return None
        for n, hook in enumerate(self.hooks[destination], 1):
            if hook == (route, url):
                return destination, n
        return None


@dataclass(frozen=True, slots=True)
class Held:
    """What the pauses in effect hold back, per route."""

    # Route -> its hook URLs that are sent nothing.
    paused: Mapping[str, frozenset[str]] = field(default_factory=dict)
    # Routes whose every hook is paused or disabled: nothing is claimed for them.
    held: frozenset[str] = frozenset()
    # Route -> when the earliest pause touching it began: its retry windows stand still.
    since: Mapping[str, float] = field(default_factory=dict)


def apply(targets: Targets, pauses: Iterable[Pause]) -> Held:
    """The routes and hooks `pauses` hold back under the configuration's numbering; a
    pause of a destination not configured, or of a hook number it does not have, holds
    nothing."""
    paused: dict[str, set[str]] = {}
    since: dict[str, float] = {}
    for p in pauses:
        if p.kind not in (PAUSED, DISABLED):
            continue
        numbered = targets.hooks.get(p.destination, ())
        if p.hook is None:
            chosen = numbered
        elif 1 <= p.hook <= len(numbered):
            chosen = (numbered[p.hook - 1],)
        else:
            continue
        for route, url in chosen:
            paused.setdefault(route, set()).add(url)
            since[route] = min(since.get(route, p.since), p.since)
    held = frozenset(
        route
        for numbered in targets.hooks.values()
        for route in {r for r, _ in numbered}
        if {u for r, u in numbered if r == route} <= paused.get(route, set())
    )
    return Held({r: frozenset(u) for r, u in paused.items()}, held, since)


def window_start(first_attempt_at: float, since: float, now: float) -> float:
    """Where a delivery's retry window counts from while a pause that began at `since` is
    in effect: the paused time (from `since`, or from its first attempt if later) does not
    count."""
    if now <= since:
        return first_attempt_at
    return first_attempt_at + (now - max(since, first_attempt_at))


def timestamp(at: float) -> str:
    return datetime.fromtimestamp(at, UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def disabled_reason(failing_since: float, last: str) -> str:
    """Why a hook was disabled: since when it failed, and its last answer (`last`, which
    names the hook by label, never by URL)."""
    return f"failing since {timestamp(failing_since)} (last: {last})"


def target_name(destination: str, hook: int | None) -> str:
    return destination if hook is None else f"hook {hook} of {destination}"
