"""The values a mapping computes with, and JavaScript's rules for them (pure).

Segment's kit is JavaScript: a path that finds nothing gives `undefined`, which is not
`null` (an object drops the key, an array writes null); text is made with `String()`; a
condition is truthy or not. UNDEFINED stands for `undefined` until `finish` removes it.
"""

from __future__ import annotations

import re
from typing import Any, Final

from efd import jsonjs


class MappingError(ValueError):
    """A mapping refused at load, or one that cannot be applied to a message. `problems`
    holds one line per problem, each "key.path: reason"."""

    def __init__(self, problems: list[str] | tuple[str, ...]) -> None:
        self.problems = tuple(problems)
        super().__init__("\n".join(self.problems))


class _Undefined:
    __slots__ = ()

    def __repr__(self) -> str:
        return "UNDEFINED"


UNDEFINED: Final = _Undefined()


def fail(path: str, reason: str) -> MappingError:
    return MappingError([f"{path}: {reason}" if path else reason])


def truthy(value: Any) -> bool:
    """JavaScript's truthiness of a JSON value: objects and arrays are true, even empty."""
    if value is UNDEFINED or value is None:
        return False
    if isinstance(value, dict | list):
        return True
    return bool(value)


def utf16_length(text: str) -> int:
    """A string's `length` in JavaScript: UTF-16 code units."""
    if text.isascii():
        return len(text)
    return len(text.encode("utf-16-le", "surrogatepass")) // 2


def utf16_units(text: str) -> list[str]:
    """A string's items in JavaScript: UTF-16 code units, a character outside the Basic
    Multilingual Plane as its two surrogates."""
    if text.isascii():
        return list(text)
    units = text.encode("utf-16-le", "surrogatepass")
    return [units[i : i + 2].decode("utf-16-le", "surrogatepass") for i in range(0, len(units), 2)]


def js_number(value: int | float) -> str:
    if isinstance(value, int):
        if -(2**53) < value < 2**53:
            return str(value)
        try:
            value = float(value)
        except OverflowError:
            return "Infinity" if value > 0 else "-Infinity"
    if value != value:
        return "NaN"
    if value in (float("inf"), float("-inf")):
        return "Infinity" if value > 0 else "-Infinity"
    return jsonjs.js_number(value)


def js_string(value: Any) -> str:
    """`String(value)`: arrays join their items with commas (null as nothing), objects are
    "[object Object]"."""
    if isinstance(value, str):
        return value
    if value is True or value is False:
        return "true" if value else "false"
    if isinstance(value, int | float):
        return js_number(value)
    if value is None:
        return "null"
    if value is UNDEFINED:
        return "undefined"
    if isinstance(value, list):
        return ",".join(
            "" if item is None or item is UNDEFINED else js_string(item) for item in value
        )
    return "[object Object]"


def loosely_empty(value: Any) -> bool:
    """`value == ''` in JavaScript (for a value that is neither null nor undefined)."""
    if isinstance(value, str):
        return value == ""
    if isinstance(value, bool | int | float):
        return value == 0
    if isinstance(value, list):
        return js_string(value) == ""
    return False


def kind(value: Any) -> str:
    """A value's type as a reason names it."""
    if value is UNDEFINED:
        return "nothing"
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "a boolean"
    if isinstance(value, int | float):
        return "a number"
    if isinstance(value, str):
        return "a string"
    if isinstance(value, list):
        return "an array"
    return "an object"


def finish(value: Any) -> Any:
    """The value as JSON has it: an object drops an undefined key, an array writes null."""
    shape = type(value)
    if shape is dict:
        return {key: finish(item) for key, item in value.items() if item is not UNDEFINED}
    if shape is list:
        return [None if item is UNDEFINED else finish(item) for item in value]
    return value


# ---------------------------------------------------------------------------------------------
# Paths: "$.a.b", "a[0]", "a['b']". The kit removes the first "$." wherever it is, splits on
# "." and on brackets next to a quote or a digit, and drops the quotes.

_SPLIT: Final = re.compile(r"""\[(?="|'|[0-9])|\.|(?<="|'|[0-9])\]+""")
_QUOTES: Final = re.compile("""['"]""")
# An index into an array or a string; a longer one is past any array's length.
_INDEX: Final = re.compile("0|[1-9][0-9]{0,15}")
WHOLE: Final = None  # the parsed form of a path that names the whole value


def parse_path(path: str, *, dollar: bool = True) -> tuple[str, ...] | None:
    """A path's keys, or WHOLE for the whole value; `dollar` removes a "$." first (as @path
    does, and a template does not)."""
    if dollar:
        path = path.replace("$.", "", 1)
    if path in ("", "."):
        return WHOLE
    return tuple(_QUOTES.sub("", part) for part in _SPLIT.split(path) if part)


def _member(value: Any, key: str) -> Any:
    if isinstance(value, dict):
        return value.get(key, UNDEFINED)
    if isinstance(value, list | str):
        if key == "length":
            return len(value) if isinstance(value, list) else utf16_length(value)
        if _INDEX.fullmatch(key) is None:
            return UNDEFINED
        index = int(key)
        items = value if isinstance(value, list) or value.isascii() else utf16_units(value)
        return items[index] if index < len(items) else UNDEFINED
    return UNDEFINED


def get(value: Any, keys: tuple[str, ...] | None) -> Any:
    """The value at `keys`; as in the kit, a falsy value met on the way is the answer."""
    if keys is WHOLE:
        return value
    for key in keys:
        if type(value) is dict:  # the common case first: an object, truthy even when empty
            value = value.get(key, UNDEFINED)
        elif not truthy(value):
            return value
        else:
            value = _member(value, key)
    return value
