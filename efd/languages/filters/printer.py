"""FQL's printer (pure): `to_fql` prints a tree back as text that parses to the same tree."""

from __future__ import annotations

from typing import Final

from efd.languages.filters.lexer import KEYWORDS, NAME_CHARS, NAME_START
from efd.languages.filters.tree import (
    And,
    Call,
    Compare,
    In,
    ListExpr,
    Literal,
    Node,
    Not,
    Or,
    Path,
)
from efd.languages.toolkit import print_boolean, print_literal

__all__ = ["to_fql"]


def _quote(value: str) -> str:
    return '"' + value.replace("\\", "\\\\").replace('"', '\\"') + '"'


def _segment(name: str, first: bool) -> str:
    out = []
    for index, ch in enumerate(name):
        needs = ch not in NAME_CHARS or (first and index == 0 and ch not in NAME_START)
        out.append("\\" + ch if needs else ch)
    text = "".join(out)
    if first and name in KEYWORDS:
        text = "\\" + text  # a field named like a keyword: escaped, it is a name again
    return text


def to_fql(node: Node) -> str:
    """The text of `node`: parsing it gives `node` back."""
    if isinstance(node, Literal):
        return print_literal(node.value, _quote)
    if isinstance(node, Path):
        return ".".join(_segment(s, i == 0) for i, s in enumerate(node.segments))
    if isinstance(node, ListExpr):
        return "[" + ", ".join(to_fql(item) for item in node.items) + "]"
    if isinstance(node, Call):
        return f"{node.name}(" + ", ".join(to_fql(arg) for arg in node.args) + ")"
    if isinstance(node, Compare):
        return f"{_operand(node.left)} {node.op} {_operand(node.right)}"
    if isinstance(node, In):
        return f"{_operand(node.item)} in {_operand(node.collection)}"
    return print_boolean(node, to_fql, not_prefix="!", grouped=_is_operation)


_OPERATIONS: Final = (Compare, In, Not, And, Or)


def _is_operation(node: Node) -> bool:
    return isinstance(node, _OPERATIONS)


def _operand(node: Node) -> str:
    """An operand of a comparison, in parentheses when it is itself an operation that would
    otherwise bind differently."""
    text = to_fql(node)
    return f"({text})" if _is_operation(node) else text
