"""The operator's pauses, shared by `efd pause`/`efd resume` and the admin API (pure): which
target a request names, and the JSON a pause is shown as."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from efd.delivery.pausing import Pause, timestamp
from efd.errors import ClientError
from efd.operations.selection import iso, known_fields

MAX_REASON = 500  # characters
PAUSE_FIELDS = ("hook", "reason")
RESUME_FIELDS = ("hook",)


def target(
    destination: str, payload: Any, hooks: Mapping[str, int], *, resume: bool = False
) -> tuple[str, int | None, str | None]:
    """(destination, hook or None, reason) from a pause's or a resume's body (or the CLI's
    options): the destination must be configured (404) and the hook, when given, a whole
    number from 1 (400) that is one of its hooks (404). `hooks`: each configured
    destination's hook count."""
    if payload is None:
        payload = {}
    known_fields(payload, RESUME_FIELDS if resume else PAUSE_FIELDS)
    count = hooks.get(destination)
    if count is None:
        raise ClientError(
            "unknown_destination",
            f"no destination named {destination!r} is configured",
            field="destination",
            status=404,
        )
    hook = payload.get("hook")
    if hook is not None and (isinstance(hook, bool) or not isinstance(hook, int) or hook < 1):
        raise ClientError(
            "invalid_field",
            "hook must be a whole number, from 1: a hook's position in the configuration",
            field="hook",
        )
    if hook is not None and hook > count:
        # A number the request's form allows, which names nothing in this configuration.
        raise ClientError(
            "unknown_hook",
            f"{destination!r} has {count} hook{'' if count == 1 else 's'}: hook must be a "
            f"number from 1 to {count}, its position in the configuration",
            field="hook",
            status=404,
        )
    reason = payload.get("reason")
    if reason is not None and (not isinstance(reason, str) or len(reason) > MAX_REASON):
        raise ClientError(
            "invalid_field",
            f"reason must be a string of at most {MAX_REASON} characters",
            field="reason",
        )
    return destination, hook, reason or None


def pause_json(pause: Pause) -> dict[str, Any]:
    return {
        "destination": pause.destination,
        "hook": pause.hook,
        "kind": pause.kind,
        "reason": pause.reason,
        "since": iso(pause.since),
    }


def of_destination(pauses: Iterable[Pause], destination: str) -> Pause | None:
    """The pause or disable of the whole destination."""
    return next((p for p in pauses if p.destination == destination and p.hook is None), None)


def of_hook(pauses: Iterable[Pause], destination: str, hook: int) -> Pause | None:
    return next((p for p in pauses if p.destination == destination and p.hook == hook), None)


def describe(pause: Pause) -> str:
    """One line for the CLI: "paused since …: reason"."""
    return f"{pause.kind} since {timestamp(pause.since)}" + (
        f": {pause.reason}" if pause.reason else ""
    )
