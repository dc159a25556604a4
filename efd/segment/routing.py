"""Which destinations a message goes to, by its integrations map (docs/delivery.md#routing)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from efd.languages.filters import Filtered, FilterSet
from efd.segment import webhooks

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


# (destination, its own body, None) or (destination, None, why it was filtered): see
# efd.records.NewMessage.shaped.
Shaped = tuple[str, str | None, str | None]


def shape(
    body: dict[str, Any],
    destinations: Sequence[str],
    filters: Mapping[str, FilterSet],
    *,
    plain: bool = False,
) -> tuple[tuple[str, ...], tuple[Shaped, ...]]:
    """Apply each routed destination's filters (docs/filters.md) to the message's webhook
    body: (the destinations that take the message's own body, the shaped rest). `filters`
    holds only destinations that have some, so without any this costs one test. `plain`
    is webhooks.encode's: a field filter only removes values, so it still holds."""
    if not filters:
        return tuple(destinations), ()
    plain_ones: list[str] = []
    shaped: list[Shaped] = []
    for name in destinations:
        rules = filters.get(name)
        if rules is None:
            plain_ones.append(name)
            continue
        result = rules.apply(body)
        if isinstance(result, Filtered):
            shaped.append((name, None, result.reason))
        elif result is body:
            plain_ones.append(name)
        else:
            text = webhooks.encode(
                result if isinstance(result, dict) else dict(result), plain=plain
            ).decode("utf-8")
            shaped.append((name, text, None))
    return tuple(plain_ones), tuple(shaped)
