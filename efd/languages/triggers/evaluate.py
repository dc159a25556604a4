"""The trigger language's evaluator (pure): whether a message matches a trigger, with the
semantics of Segment's evaluator (@segment/destination-subscriptions' validate).

A field is read the way JavaScript reads it from the parsed JSON: an object's own key, an
array's canonical index or length, a string's UTF-16 code unit or length; a walk that meets
false, 0, "" or null stops there and yields that value. Then each operator checks the type it
needs (a number for the number operators, text for the text ones, a boolean for is_true and
is_false) and is false otherwise; `!=` on text is true for anything but that text, missing
fields included. `matches` never raises, whatever the message holds.
"""

from __future__ import annotations

import math
from typing import Any, Final

from efd.languages.toolkit import And
from efd.languages.triggers.tree import Condition, Field, Trigger

__all__ = ["matches"]


class _Missing:
    """JavaScript's undefined: a field the message does not have."""

    __slots__ = ()

    def __repr__(self) -> str:
        return "MISSING"


MISSING: Final = _Missing()
_TOP_KEYS: Final = {"type": "type", "event": "event", "name": "name", "userId": "userId"}


def matches(trigger: Trigger, message: Any) -> bool:
    """Whether `message` (a parsed JSON object) satisfies `trigger`."""
    if message is None:
        return False
    return _matches(trigger, message)


def _matches(node: Trigger, message: Any) -> bool:
    if isinstance(node, Condition):
        return _condition(node, read(node.field, message))
    if isinstance(node, And):
        return all(_matches(item, message) for item in node.items)
    return any(_matches(item, message) for item in node.items)


def read(field: Field, message: Any) -> Any:
    """The value a test sees: MISSING where the message has none."""
    top = message.get(field.kind, MISSING) if isinstance(message, dict) else MISSING
    if not field.path:
        return top
    value = top
    for key in field.path:
        if not _truthy(value):
            return value
        value = _member(value, key)
    return value


def _truthy(value: Any) -> bool:
    if value is MISSING or value is None or value is False:
        return False
    if isinstance(value, str):
        return value != ""
    if isinstance(value, int | float) and not isinstance(value, bool):
        return not (value == 0 or (isinstance(value, float) and math.isnan(value)))
    return True


def _index(key: str, size: int) -> int | None:
    """`key` as an array index JavaScript accepts (canonical digits, in range), or None."""
    if not key.isascii() or not key.isdigit() or (len(key) > 1 and key[0] == "0"):
        return None
    index = int(key)
    return index if index < size else None


def _member(value: Any, key: str) -> Any:
    if isinstance(value, dict):
        return value.get(key, MISSING)
    if isinstance(value, list | tuple):
        if key == "length":
            return len(value)
        index = _index(key, len(value))
        return MISSING if index is None else value[index]
    if isinstance(value, str):
        units = value.encode("utf-16-le", "surrogatepass")
        if key == "length":
            return len(units) // 2
        index = _index(key, len(units) // 2)
        if index is None:
            return MISSING
        return units[2 * index : 2 * index + 2].decode("utf-16-le", "surrogatepass")
    return MISSING


def _is_number(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)


def _double(value: int | float) -> float:
    """A JSON number as JavaScript holds it: a double (infinite past the range)."""
    try:
        return float(value)
    except OverflowError:
        return math.inf if value > 0 else -math.inf


def _condition(test: Condition, actual: Any) -> bool:
    op, expected = test.op, test.value
    if op == "exists":
        return actual is not MISSING and actual is not None
    if op == "not_exists":
        return actual is MISSING or actual is None
    if op == "is_true":
        return actual is True
    if op == "is_false":
        return actual is False
    if isinstance(expected, str):
        if not isinstance(actual, str):
            return op == "!="  # text differs from anything but text
        if op == "=":
            return actual == expected
        if op == "!=":
            return actual != expected
        if op == "contains":
            return expected in actual
        if op == "not_contains":
            return expected not in actual
        if op == "starts_with":
            return actual.startswith(expected)
        if op == "not_starts_with":
            return not actual.startswith(expected)
        if op == "ends_with":
            return actual.endswith(expected)
        if op == "not_ends_with":
            return not actual.endswith(expected)
        return False
    if isinstance(expected, float) and _is_number(actual):
        number = _double(actual)
        if op == "number_equals":
            return number == expected
        if op == "number_not_equals":
            return number != expected
        if op == "<":
            return number < expected
        if op == "<=":
            return number <= expected
        if op == ">":
            return number > expected
        if op == ">=":
            return number >= expected
    return False
