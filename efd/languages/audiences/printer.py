"""The audience language's printer (pure): `to_text` prints a tree back as text that parses to
the same tree, in one spelling (methods for presence and lists of candidates, operators for
comparisons, `where()` before `within()`)."""

from __future__ import annotations

from typing import Final

from efd.languages.audiences.tree import (
    Aggregate,
    And,
    Compare,
    EventQuery,
    Literal,
    Match,
    Node,
    Not,
    Or,
    Presence,
    PropertyRef,
    TraitRef,
    ValueNode,
)
from efd.languages.toolkit import print_boolean, print_literal

__all__ = ["to_text"]

_ESCAPES: Final = {"\\": "\\\\", "'": "\\'", "\n": "\\n", "\r": "\\r", "\t": "\\t"}


def _quote(value: str) -> str:
    return "'" + "".join(_ESCAPES.get(ch, ch) for ch in value) + "'"


def _literal(node: Literal) -> str:
    return print_literal(node.value, _quote)


def _query(node: EventQuery) -> str:
    text = f"event({_quote(node.event)})"
    if node.where is not None:
        text += f".where({to_text(node.where)})"
    if node.within is not None:
        text += f".within({node.within.amount} {node.within.unit})"
    return text


def _aggregate(node: Aggregate) -> str:
    query = _query(node.query)
    if node.func == "count":
        return f"{query}.count()"
    assert node.prop is not None
    if node.func == "unique_count":
        return f"{query}.unique({_quote(node.prop)}).count()"
    if node.min_frequency is not None:
        return f"{query}.{node.func}({_quote(node.prop)}, {node.min_frequency})"
    return f"{query}.{node.func}({_quote(node.prop)})"


def _value(node: ValueNode) -> str:
    if isinstance(node, Literal):
        return _literal(node)
    if isinstance(node, TraitRef):
        return f"trait({_quote(node.name)})"
    if isinstance(node, PropertyRef):
        return f"property({_quote(node.name)})"
    return _aggregate(node)


def _grouped(node: Node) -> bool:
    """What `not` applies to is in parentheses unless it is a method call or another not."""
    return isinstance(node, And | Or | Compare)


def to_text(node: Node) -> str:
    """The text of `node`: parsing it gives `node` back."""
    if isinstance(node, EventQuery):
        return _query(node)
    if isinstance(node, Compare):
        return f"{_value(node.left)} {node.op} {_value(node.right)}"
    if isinstance(node, Match):
        values = ", ".join(_value(v) for v in node.values)
        return f"{_value(node.operand)}.{node.op}({values})"
    if isinstance(node, Presence):
        return f"{_value(node.operand)}.{'exists' if node.present else 'absent'}()"
    if isinstance(node, And | Or | Not):
        return print_boolean(node, to_text, not_prefix="not ", grouped=_grouped)
    return _value(node)
