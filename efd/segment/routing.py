"""Which destinations a message goes to, by its integrations map (docs/delivery.md#routing)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from efd.languages import mapping, triggers
from efd.languages.filters import Filtered, FilterSet
from efd.records import ROUTING_FAILURES
from efd.segment import actions, webhooks

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
# (route, body, URL, None) or (route, None, None, why it failed): efd.records.NewMessage.mapped.
Mapped = tuple[str, str | None, str | None, str | None]

NO_TRIGGER_MATCHED = "no action's trigger matched the message"


@dataclass(frozen=True)
class Action:
    """One action as routing runs it: its trigger, its mapping and its request, delivered
    under its route's name (destination/action)."""

    name: str
    route: str
    trigger: triggers.Trigger
    mapping: mapping.Mapping
    request: actions.ActionRequest

    def request_for(self, message: dict[str, Any], plain: bool = False) -> actions.Request:
        """The request for a message its trigger matched; MappingError or ActionRequestError
        says why there is none. `plain`: the message is (efd.jsonjs.loads_checked)."""
        value = self.mapping.apply(message)
        return self.request.render(message, value, plain=plain and self.mapping.plain)

    def mapped(self, message: dict[str, Any], plain: bool = False) -> Mapped:
        """Its delivery of a message its trigger matched: the body and URL to send, or why
        none can be made (the delivery then fails at once)."""
        try:
            request = self.request_for(message, plain)
        except mapping.MappingError as error:
            return (self.route, None, None, ROUTING_FAILURES[0] + "; ".join(error.problems))
        except actions.ActionRequestError as error:
            return (self.route, None, None, ROUTING_FAILURES[1] + "; ".join(error.problems))
        return (self.route, request.body.decode("utf-8"), request.url, None)


@dataclass(frozen=True)
class ActionSet:
    """An actions destination's actions, in their configured order (they pickle to the
    parser processes: each mapping is compiled again there)."""

    destination: str
    actions: tuple[Action, ...]

    def find(self, name: str) -> Action | None:
        return next((a for a in self.actions if a.name == name), None)

    def matching(self, message: dict[str, Any]) -> list[Action]:
        return [a for a in self.actions if triggers.matches(a.trigger, message)]


def shape(
    body: dict[str, Any],
    destinations: Sequence[str],
    filters: Mapping[str, FilterSet],
    *,
    plain: bool = False,
    actions: Mapping[str, ActionSet] | None = None,
) -> tuple[tuple[str, ...], tuple[Shaped, ...], tuple[Mapped, ...]]:
    """Apply each routed destination's filters (docs/filters.md) to the message's webhook
    body, then an actions destination's actions (docs/actions.md): (the destinations that
    take the message's own body, the shaped rest, the actions' deliveries). `filters` and
    `actions` hold only destinations that have some, so without any this costs one test.
    `plain` is webhooks.encode's: a field filter only removes values, so it still holds."""
    if not filters and not actions:
        return tuple(destinations), (), ()
    plain_ones: list[str] = []
    shaped: list[Shaped] = []
    mapped: list[Mapped] = []
    for name in destinations:
        rules = filters.get(name)
        action_set = actions.get(name) if actions else None
        if rules is None and action_set is None:
            plain_ones.append(name)
            continue
        result = body if rules is None else rules.apply(body)
        if isinstance(result, Filtered):
            shaped.append((name, None, result.reason))
        elif action_set is not None:
            message = result if isinstance(result, dict) else dict(result)
            matched = action_set.matching(message)
            if not matched:
                shaped.append((name, None, NO_TRIGGER_MATCHED))
            mapped += [action.mapped(message, plain) for action in matched]
        elif result is body:
            plain_ones.append(name)
        else:
            text = webhooks.encode(
                result if isinstance(result, dict) else dict(result), plain=plain
            ).decode("utf-8")
            shaped.append((name, text, None))
    return tuple(plain_ones), tuple(shaped), tuple(mapped)
