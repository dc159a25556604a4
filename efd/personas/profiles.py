"""How identify traits and merged identities combine into one profile (pure: no I/O).

Each trait remembers the timestamp of the message that set it. A value replaces the stored
one when its message is at least as recent, so a late-arriving old message never
overwrites a newer value, and on equal timestamps the later arrival wins. Traits merge by
top-level key: an object-valued trait is replaced whole.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from efd.records import ProfileKind

PAGE_EVENT = "Page Viewed"
SCREEN_EVENT = "Screen Viewed"
USER = ProfileKind.USER
ANONYMOUS = ProfileKind.ANONYMOUS


class ProfileState:
    """One profile while a batch is applied; traits are parsed only when needed."""

    __slots__ = ("_times", "_times_text", "_traits", "_traits_text", "dirty", "id", "kind")

    def __init__(self, id: str, kind: str, traits: str = "{}", trait_times: str = "{}") -> None:
        self.id = id
        self.kind = kind
        self._traits_text = traits
        self._times_text = trait_times
        self._traits: dict[str, Any] | None = None
        self._times: dict[str, float] | None = None
        self.dirty = False

    @property
    def traits(self) -> dict[str, Any]:
        if self._traits is None:
            self._traits = _object(self._traits_text)
        return self._traits

    @property
    def times(self) -> dict[str, float]:
        if self._times is None:
            self._times = _object(self._times_text)
        return self._times

    def traits_json(self) -> str:
        # ASCII escapes: a lone surrogate from a client must not break a UTF-8 database.
        return json.dumps(self.traits, separators=(",", ":"))

    def times_json(self) -> str:
        return json.dumps(self.times, separators=(",", ":"))


def _object(text: str) -> dict[str, Any]:
    value = json.loads(text)
    return value if isinstance(value, dict) else {}


def set_traits(profile: ProfileState, traits: Mapping[str, Any], timestamp: float) -> bool:
    """Apply an identify's traits; True when anything changed."""
    changed = False
    values, times = profile.traits, profile.times
    for key, value in traits.items():
        known = times.get(key)
        if known is not None and timestamp < known:
            continue  # a newer message already set this trait
        if key not in values or values[key] != value or known != timestamp:
            values[key] = value
            times[key] = timestamp
            changed = True
    if changed:
        profile.dirty = True
    return changed


def merge_into(source: ProfileState, target: ProfileState) -> None:
    """Join `source` (the previous identity) to `target`: per trait, the later value wins;
    on equal times the target's value stays."""
    values, times = target.traits, target.times
    for key, value in source.traits.items():
        at = source.times.get(key, 0.0)
        known = times.get(key)
        if known is None or at > known:
            values[key] = value
            times[key] = at
    if source.kind == USER:
        target.kind = USER
    target.dirty = True


def event_of(message_type: str, body: Mapping[str, Any]) -> tuple[str, dict[str, Any]] | None:
    """The (name, properties) a track, page or screen message is kept as, else None.

    track: its event name; page: "Page Viewed"; screen: "Screen Viewed" with the screen's
    name added to the properties (as page's name already is), unless they set one.
    """
    if message_type == "track":
        props = body.get("properties")
        return str(body.get("event", "")), dict(props) if isinstance(props, dict) else {}
    if message_type == "page":
        props = body.get("properties")
        return PAGE_EVENT, dict(props) if isinstance(props, dict) else {}
    if message_type == "screen":
        props = body.get("properties")
        properties = dict(props) if isinstance(props, dict) else {}
        name = body.get("name")
        if isinstance(name, str) and name and "name" not in properties:
            properties["name"] = name
        return SCREEN_EVENT, properties
    return None
