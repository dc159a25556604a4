"""Mustache-style templates, `{{a.b}}` and `{{{a.b}}}`, as Segment's kit renders them (pure).

Triple braces are replaced first, then double ones, over the text the first pass made; a
placeholder is a path (no "$."), and a missing or null value renders as nothing. Nothing is
HTML-escaped.
"""

from __future__ import annotations

import re
import unicodedata
from collections.abc import Callable
from typing import Any, Final

from efd.languages.mapping.values import UNDEFINED, get, js_string, parse_path

_TRIPLE: Final = re.compile(r"\{\{\{([^}]+)\}\}\}")
_DOUBLE: Final = re.compile(r"\{\{([^}]+)\}\}")
# What JavaScript's String#trim removes (Python's str.strip knows a different set).
_JS_SPACE: Final = (
    "\t\n\v\f\r \u00a0\u1680\u2000\u2001\u2002\u2003\u2004\u2005\u2006\u2007\u2008\u2009"
    "\u200a\u2028\u2029\u202f\u205f\u3000\ufeff"
)


def field(written: str, inner: str, example: str) -> tuple[str, ...] | str:
    """A `{{path}}` that names one field of the message (in an action's URL, a broker's
    subject or topic): its keys, or why it cannot, to follow `written` and its key. The
    path is trimmed as render trims it; `example` is a field to show in the reason."""
    path = inner.strip(_JS_SPACE)
    if not path:
        return f"{written} names no field; write its path, as in {{{{{example}}}}}"
    if any(unicodedata.category(ch) == "Cc" for ch in path):
        return f"{written}: a field's path may not hold control characters"
    if path.startswith("$"):
        return (
            f"{written}: a template's path starts at the message, without $ (as in "
            f"@template): {{{{{path.removeprefix('$').removeprefix('.')}}}}}"
        )
    keys = parse_path(path, dollar=False)
    if keys is None:
        return f"{written} names the whole message; name one of its fields"
    return keys


def _value(match: re.Match[str], payload: Any) -> str:
    value = get(payload, parse_path(match.group(1).strip(_JS_SPACE), dollar=False))
    return "" if value is None or value is UNDEFINED else js_string(value)


def render(template: str, payload: Any) -> str:
    if "{{" not in template:
        return template
    text = _TRIPLE.sub(lambda match: _value(match, payload), template)
    return _DOUBLE.sub(lambda match: _value(match, payload), text)


def compiled(template: str) -> Callable[[Any], str]:
    """`render` for a template known at load: its placeholders' paths parsed once. Only
    without triple braces, where one pass over the double ones is the whole of `render`
    (a value that holds braces is not read again, in either)."""
    if "{{{" in template:
        return lambda payload: render(template, payload)
    parts: list[str | tuple[str, ...] | None] = []
    at = 0
    for match in _DOUBLE.finditer(template):
        parts.append(template[at : match.start()])
        parts.append(parse_path(match.group(1).strip(_JS_SPACE), dollar=False))
        at = match.end()
    if not parts:
        return lambda payload: template
    parts.append(template[at:])
    literal = [part if isinstance(part, str) else "" for part in parts]
    fields = [(i, part) for i, part in enumerate(parts) if not isinstance(part, str)]

    def run(payload: Any) -> str:
        out = literal.copy()
        for i, keys in fields:
            value = get(payload, keys)
            if value is not None and value is not UNDEFINED:
                out[i] = js_string(value)
        return "".join(out)

    return run
