"""What the directives do to values once they are computed, with the kit's JavaScript rules
(pure): literal replacement with `$&`-style patterns, flattening, Object.assign, JSON."""

from __future__ import annotations

import re
from typing import Any, Final

from efd import jsonjs
from efd.languages.mapping.values import UNDEFINED, finish, js_number, utf16_units

_DOLLAR: Final = re.compile(r"\$([$&`'])")


def replace(text: str, pattern: str, replacement: str, *, ignorecase: bool, every: bool) -> str:
    """String#replace with a pattern matched literally; the replacement's `$$`, `$&`, `` $` ``
    and `$'` mean what they mean in JavaScript (the pattern has no groups, so `$1` is text)."""
    regex = re.compile(re.escape(pattern), re.IGNORECASE if ignorecase else 0)

    def expand(match: re.Match[str]) -> str:
        def one(dollar: re.Match[str]) -> str:
            c = dollar.group(1)
            if c == "$":
                return "$"
            if c == "&":
                return match.group()
            return text[: match.start()] if c == "`" else text[match.end() :]

        return _DOLLAR.sub(one, replacement) if "$" in replacement else replacement

    return regex.sub(expand, text, count=0 if every else 1)


def scalar_text(value: Any) -> Any:
    """@replace works on a boolean or a number as on its text."""
    if value is True or value is False:
        return "true" if value else "false"
    if isinstance(value, int | float):
        return js_number(value)
    return value


def flatten(value: Any, prefix: str, separator: str, omit_arrays: bool) -> dict[str, Any]:
    if isinstance(value, dict) or (not omit_arrays and isinstance(value, list)):
        # In JavaScript's order of keys, which decides the order of the keys made from them.
        items = (
            [(key, value[key]) for key in jsonjs.js_key_order(value)]
            if isinstance(value, dict)
            else enumerate(value)
        )
        out: dict[str, Any] = {}
        for key, item in items:
            name = f"{prefix}{separator}{key}" if prefix else str(key)
            out.update(flatten(item, name, separator, omit_arrays))
        return out
    return {prefix: value}


def assign(target: dict[str, Any], source: Any) -> None:
    """Object.assign: an array or a string gives its items under "0", "1", ... (a string's
    UTF-16 units); a scalar gives nothing."""
    if isinstance(source, dict):
        target.update(source)
    elif isinstance(source, list | str):
        items = source if isinstance(source, list) else utf16_units(source)
        target.update((str(i), item) for i, item in enumerate(items))


def without_nulls(value: Any) -> Any:
    """@excludeWhenNull: an object's null keys go, in nested objects too (not in arrays)."""
    if not isinstance(value, dict):
        return value
    return {key: UNDEFINED if item is None else without_nulls(item) for key, item in value.items()}


def encode(value: Any) -> Any:
    if value is UNDEFINED:
        return UNDEFINED
    return jsonjs.dumps(finish(value)).decode("utf-8", "surrogatepass")


def decode(value: Any) -> Any:
    """JSON.parse of a string; a string that is not JSON, or another value, stays as it is."""
    if not isinstance(value, str):
        return value
    try:
        return jsonjs.loads(value)
    except ValueError:
        return value
