"""Which destinations a message goes to (pure: spec 4.3)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

# The key a webhook destination answers to in the integrations map, as published.
WEBHOOKS_KEY = "Webhooks"


def is_enabled(name: str, integrations: Mapping[str, Any]) -> bool:
    """Whether the integrations map lets a message through to destination `name`.

    The most specific key decides: the destination's own configured name, then
    "Webhooks" (the published name of every webhook destination), then "All", then the
    default, enabled. Only an explicit false disables; true or an options object enables.
    Keys are case-sensitive.
    """
    for key in (name, WEBHOOKS_KEY, "All"):
        if key in integrations:
            return integrations[key] is not False
    return True


def route(destinations: Sequence[str], integrations: Mapping[str, Any]) -> list[str]:
    """The destinations, of those connected to the source, that receive the message."""
    if not integrations:
        return list(destinations)
    return [name for name in destinations if is_enabled(name, integrations)]
