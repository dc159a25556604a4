"""The trigger language's printer (pure): `to_trigger` prints a tree back as text that parses
to the same tree, in the spelling Segment's own generator uses (`!= null` for exists,
match(x, "prefix*") for starts_with, and so on)."""

from __future__ import annotations

from decimal import Decimal
from typing import Any, Final

from efd.languages.toolkit import print_boolean
from efd.languages.triggers.lexer import CONNECTIVES, NAME_CHARS, NAME_START
from efd.languages.triggers.tree import Condition, Field, Operator, Trigger

__all__ = ["to_trigger"]

_SPELLING: Final[dict[Operator, str]] = {
    "exists": "!= null",
    "not_exists": "= null",
    "is_true": "= true",
    "is_false": "= false",
}
_FUNCTIONS: Final[dict[Operator, tuple[str, str, str]]] = {
    # operator: (the call, before the value, after it)
    "contains": ("contains", "", ""),
    "not_contains": ("!contains", "", ""),
    "starts_with": ("match", "", "*"),
    "not_starts_with": ("!match", "", "*"),
    "ends_with": ("match", "*", ""),
    "not_ends_with": ("!match", "*", ""),
}


def _segment(name: str) -> str:
    out = []
    for index, ch in enumerate(name):
        needs = ch not in NAME_CHARS or (index == 0 and ch not in NAME_START)
        out.append("\\" + ch if needs else ch)
    text = "".join(out)
    return "\\" + text if name in CONNECTIVES else text


def _field(field: Field) -> str:
    return ".".join([field.kind, *(_segment(key) for key in field.path)])


def _number(value: float) -> str:
    """The number in full: triggers take no exponent."""
    text = format(Decimal(repr(value)), "f")
    return text[:-2] if text.endswith(".0") else text


def _condition(test: Condition) -> str:
    name = _field(test.field)
    if test.op in _SPELLING:
        return f"{name} {_SPELLING[test.op]}"
    if test.op in _FUNCTIONS:
        call, before, after = _FUNCTIONS[test.op]
        return f'{call}({name}, "{before}{test.value}{after}")'
    if isinstance(test.value, str):
        return f'{name} {test.op} "{test.value}"'
    op = {"number_equals": "=", "number_not_equals": "!="}.get(test.op, test.op)
    assert isinstance(test.value, float)
    return f"{name} {op} {_number(test.value)}"


def _show(node: Any) -> str:
    return to_trigger(node)


def to_trigger(node: Trigger) -> str:
    """The text of `node`: parsing it gives `node` back."""
    if isinstance(node, Condition):
        return _condition(node)
    return print_boolean(node, _show, not_prefix="!", grouped=lambda _: False)
