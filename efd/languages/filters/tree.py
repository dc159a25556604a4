"""FQL's tree (pure): the nodes a condition is parsed into and what the parser knows of
their types without a message. Its lexer, parser and printer are efd/languages/filters/lexer.py,
parser.py and printer.py; the glob patterns of match() efd/languages/filters/glob.py's."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Final, TypeAlias
from typing import Literal as Lit

from efd.languages.filters.glob import compile_glob as compile_glob
from efd.languages.toolkit import And as And
from efd.languages.toolkit import Literal as Literal
from efd.languages.toolkit import Node as _Node
from efd.languages.toolkit import Not as Not
from efd.languages.toolkit import Or as Or
from efd.languages.toolkit import Scalar as Scalar
from efd.languages.toolkit import SourceError


class FqlError(SourceError):
    """An FQL condition that does not parse or type-check."""


# ---------------------------------------------------------------------------------------------
# The tree: its nodes build on efd/languages/toolkit.py's (a position left out of equality),
# whose literal, and, or and not it shares.


@dataclass(frozen=True)
class Path(_Node):
    """A dotted field path, e.g. context.page.url: ("context", "page", "url")."""

    segments: tuple[str, ...]


@dataclass(frozen=True)
class ListExpr(_Node):
    items: tuple[Node, ...]


FunctionName: TypeAlias = Lit[
    "contains",
    "match",
    "length",
    "lowercase",
    "uppercase",
    "snakecase",
    "kebabcase",
    "titlecase",
    "typeof",
    "bool",
    "string",
    "number",
]


@dataclass(frozen=True)
class Call(_Node):
    name: FunctionName
    args: tuple[Node, ...]


CompareOp: TypeAlias = Lit["=", "!=", "<", "<=", ">", ">="]


@dataclass(frozen=True)
class Compare(_Node):
    op: CompareOp
    left: Node
    right: Node


@dataclass(frozen=True)
class In(_Node):
    """`item in collection`: true when the collection is a list holding the item."""

    item: Node
    collection: Node


Node: TypeAlias = (
    Literal | Path | ListExpr | Call | Compare | In | Not["Node"] | And["Node"] | Or["Node"]
)

# ---------------------------------------------------------------------------------------------
# What the parser knows of a value's type without a message: "any" is a field path, whose
# type only the message tells.

Kind: TypeAlias = Lit["bool", "number", "string", "list", "null", "any"]
_KIND_WORDS: Final[dict[str, str]] = {
    "bool": "true or false",
    "number": "a number",
    "string": "a string",
    "list": "a list",
    "null": "null",
}


@dataclass(frozen=True)
class _Signature:
    args: tuple[frozenset[str], ...]  # the kinds each argument may have ("any" always may)
    result: frozenset[str]  # the kinds it may yield


_TEXT: Final = frozenset({"string", "null"})
FUNCTIONS: Final[dict[str, _Signature]] = {
    "contains": _Signature((_TEXT, _TEXT), frozenset({"bool"})),
    "match": _Signature((_TEXT, _TEXT), frozenset({"bool"})),
    "length": _Signature((frozenset({"string", "list", "null"}),), frozenset({"number"})),
    "lowercase": _Signature((_TEXT,), _TEXT),
    "uppercase": _Signature((_TEXT,), _TEXT),
    "snakecase": _Signature((_TEXT,), _TEXT),
    "kebabcase": _Signature((_TEXT,), _TEXT),
    "titlecase": _Signature((_TEXT,), _TEXT),
    "typeof": _Signature((frozenset(_KIND_WORDS),), frozenset({"string"})),
    "bool": _Signature((frozenset(_KIND_WORDS),), frozenset({"bool"})),
    "string": _Signature((frozenset(_KIND_WORDS),), frozenset({"string"})),
    "number": _Signature((frozenset({"number", "string", "null"}),), frozenset({"number", "null"})),
}


def kinds_of(node: Node) -> frozenset[str]:
    """The kinds of value `node` can yield; {"any"} when only the message can tell."""
    if isinstance(node, Literal):
        value = node.value
        if value is None:
            return frozenset({"null"})
        if isinstance(value, bool):
            return frozenset({"bool"})
        return frozenset({"string" if isinstance(value, str) else "number"})
    if isinstance(node, ListExpr):
        return frozenset({"list"})
    if isinstance(node, Call):
        return FUNCTIONS[node.name].result
    if isinstance(node, Path):
        return frozenset({"any"})
    return frozenset({"bool"})


def describe_kinds(kinds: frozenset[str]) -> str:
    return " or ".join(_KIND_WORDS[k] for k in sorted(kinds))
