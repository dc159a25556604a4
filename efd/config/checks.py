"""Rules that span a configuration's entries, on plain data (so they also run on a file
the schema check refused, and every problem is reported in one pass)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from efd.brokers.targets import KINDS
from efd.config.models import DeliveryConfig, ServerConfig, auth_conflicts, batch_problems
from efd.personas.keys import PERSONAS_SOURCE, snake_case


def _entries(data: Mapping[str, Any], key: str) -> list[Mapping[str, Any]]:
    value = data.get(key)
    if not isinstance(value, list):
        return []
    return [entry if isinstance(entry, Mapping) else {} for entry in value]


def _number(value: Any) -> float | None:
    return float(value) if isinstance(value, int | float) and not isinstance(value, bool) else None


def _given(value: Any) -> bool:
    """Whether a list key was given (the plain data of a loaded configuration has [])."""
    return value is not None and value != []


def _hooks_or_actions(i: int, destination: Mapping[str, Any]) -> list[str]:
    """A webhooks or broker destination has hooks and no actions; an actions destination
    the reverse."""
    kind = destination.get("type", "webhooks")
    hooks, actions = destination.get("hooks"), destination.get("actions")
    at = f"destinations[{i}]"
    if kind == "actions":
        problems = []
        if _given(hooks):
            problems.append(
                f"{at}.hooks: not allowed on an actions destination (each action has its url)"
            )
        if not _given(actions):
            problems.append(f"{at}.actions: an actions destination needs 1 to 5 actions")
        return problems
    if kind != "webhooks" and kind not in KINDS:
        return []
    problems = []
    if not _given(hooks):
        problems.append(f"{at}.hooks: a {kind} destination needs at least 1 hook")
    if _given(actions):
        problems.append(f'{at}.actions: only a destination of type = "actions" has actions')
    return problems


def _route_names(
    destinations: list[Mapping[str, Any]], destination_names: dict[str, int]
) -> list[str]:
    """An action's name is unique in its destination, and its route (destination/action)
    is no other destination's name."""
    problems = []
    for i, destination in enumerate(destinations):
        name = destination.get("name")
        if destination.get("type") != "actions" or not isinstance(name, str):
            continue
        seen: dict[str, int] = {}
        for j, action in enumerate(_entries(destination, "actions")):
            at = f"destinations[{i}].actions[{j}]"
            problems += [f"{at}.{problem}" for problem in auth_conflicts(action)]
            problems += [f"{at}.{problem}" for problem in batch_problems(action)]
            action_name = action.get("name")
            if not isinstance(action_name, str):
                continue
            key = f"destinations[{i}].actions[{j}].name"
            if action_name in seen:
                problems.append(
                    f"{key}: duplicate action name {action_name!r} "
                    f"(also destinations[{i}].actions[{seen[action_name]}])"
                )
            seen.setdefault(action_name, j)
            route = f"{name}/{action_name}"
            other = destination_names.get(route)
            if other is not None:
                problems.append(
                    f"{key}: its route {route!r} is the name of another destination "
                    f"(destinations[{other}].name)"
                )
    return problems


def cross_checks(data: Mapping[str, Any]) -> list[str]:
    """Rules that span entries: unique names and keys, references that resolve.

    Works on plain data, so it runs on the raw file too when the schema check failed:
    every problem is reported in one pass.
    """
    problems = []
    seen_names: dict[str, int] = {}
    seen_keys: dict[str, int] = {}
    sources = _entries(data, "sources")
    for i, source in enumerate(sources):
        name, key = source.get("name"), source.get("write_key")
        if name == PERSONAS_SOURCE:
            problems.append(
                f"sources[{i}].name: {PERSONAS_SOURCE!r} is reserved for the messages "
                "audiences and computed traits send"
            )
        if isinstance(name, str):
            if name in seen_names:
                problems.append(
                    f"sources[{i}].name: duplicate source name {name!r} "
                    f"(also sources[{seen_names[name]}])"
                )
            seen_names.setdefault(name, i)
        if isinstance(key, str) and key:
            if key in seen_keys:
                problems.append(
                    f"sources[{i}].write_key: the same write key as sources[{seen_keys[key]}]"
                )
            seen_keys.setdefault(key, i)
    destination_names: dict[str, int] = {}
    destinations = _entries(data, "destinations")
    for i, destination in enumerate(destinations):
        problems += _hooks_or_actions(i, destination)
        name = destination.get("name")
        if not isinstance(name, str):
            continue
        if name in destination_names:
            problems.append(
                f"destinations[{i}].name: duplicate destination name {name!r} "
                f"(also destinations[{destination_names[name]}])"
            )
        destination_names.setdefault(name, i)
    problems += _route_names(destinations, destination_names)
    for i, source in enumerate(sources):
        names = source.get("destinations")
        for j, name in enumerate(names if isinstance(names, list) else []):
            if isinstance(name, str) and name not in destination_names:
                problems.append(f"sources[{i}].destinations[{j}]: no destination named {name!r}")
    trait_keys: dict[str, str] = {}
    for section in ("audiences", "computed_traits"):
        for i, entry in enumerate(_entries(data, section)):
            names = entry.get("destinations")
            for j, name in enumerate(names if isinstance(names, list) else []):
                if isinstance(name, str) and name not in destination_names:
                    problems.append(
                        f"{section}[{i}].destinations[{j}]: no destination named {name!r}"
                    )
            name = entry.get("name")
            key = snake_case(name) if isinstance(name, str) else ""
            if not key:
                continue
            if key in trait_keys:
                problems.append(
                    f"{section}[{i}].name: delivered as the trait {key!r}, "
                    f"like {trait_keys[key]}; names must differ in their snake_case form"
                )
            trait_keys.setdefault(key, f"{section}[{i}]")
    server = data.get("server")
    server = server if isinstance(server, Mapping) else {}
    per_address = _number(server.get("max_connections_per_address"))
    connections = _number(server.get("max_connections", ServerConfig().max_connections))
    if per_address is not None and connections is not None and per_address > connections:
        problems.append("server.max_connections_per_address: may not exceed server.max_connections")
    delivery = data.get("delivery")
    delivery = delivery if isinstance(delivery, Mapping) else {}
    defaults = DeliveryConfig()

    def value(key: str) -> float | None:
        return _number(delivery.get(key, getattr(defaults, key)))

    initial, maximum = value("retry_initial_seconds"), value("retry_max_seconds")
    if initial is not None and maximum is not None and maximum < initial:
        problems.append(
            "delivery.retry_max_seconds: must be at least delivery.retry_initial_seconds"
        )
    timeout, lease = value("timeout_seconds"), value("lease_seconds")
    if timeout is not None and lease is not None and lease <= timeout + 5:
        problems.append(
            "delivery.lease_seconds: must exceed delivery.timeout_seconds by more than 5 s"
        )
    return problems
