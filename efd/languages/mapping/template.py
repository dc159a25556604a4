"""Mustache-style templates, `{{a.b}}` and `{{{a.b}}}`, as Segment's kit renders them (pure).

Triple braces are replaced first, then double ones, over the text the first pass made; a
placeholder is a path (no "$."), and a missing or null value renders as nothing. Nothing is
HTML-escaped.
"""

from __future__ import annotations

import re
from typing import Any, Final

from efd.languages.mapping.values import UNDEFINED, get, js_string, parse_path

_TRIPLE: Final = re.compile(r"\{\{\{([^}]+)\}\}\}")
_DOUBLE: Final = re.compile(r"\{\{([^}]+)\}\}")
# What JavaScript's String#trim removes (Python's str.strip knows a different set).
_JS_SPACE: Final = (
    "\t\n\v\f\r \u00a0\u1680\u2000\u2001\u2002\u2003\u2004\u2005\u2006\u2007\u2008\u2009"
    "\u200a\u2028\u2029\u202f\u205f\u3000\ufeff"
)


def _value(match: re.Match[str], payload: Any) -> str:
    value = get(payload, parse_path(match.group(1).strip(_JS_SPACE), dollar=False))
    return "" if value is None or value is UNDEFINED else js_string(value)


def render(template: str, payload: Any) -> str:
    if "{{" not in template:
        return template
    text = _TRIPLE.sub(lambda match: _value(match, payload), template)
    return _DOUBLE.sub(lambda match: _value(match, payload), text)
