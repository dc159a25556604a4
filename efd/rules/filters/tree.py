"""FQL's tree (pure): the nodes a condition is parsed into, what the parser knows of their
types without a message, and the glob patterns of match(). The lexer, parser and printer are
efd/rules/filters/fql.py's."""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Final, TypeAlias
from typing import Literal as Lit

from efd.rules.syntax import Literal as Literal
from efd.rules.syntax import Node as _Node
from efd.rules.syntax import Scalar as Scalar
from efd.rules.syntax import SourceError


class FqlError(SourceError):
    """An FQL condition that does not parse or type-check."""


# ---------------------------------------------------------------------------------------------
# The tree: its nodes build on efd/rules/syntax.py's (a position left out of equality).


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


@dataclass(frozen=True)
class Not(_Node):
    item: Node


@dataclass(frozen=True)
class And(_Node):
    items: tuple[Node, ...]


@dataclass(frozen=True)
class Or(_Node):
    items: tuple[Node, ...]


Node: TypeAlias = Literal | Path | ListExpr | Call | Compare | In | Not | And | Or

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


# ---------------------------------------------------------------------------------------------
# Glob patterns of match(): *, ?, [abc], [a-z], [^abc] and \x.


def glob_regex(pattern: str) -> re.Pattern[str]:
    """The regular expression a glob pattern stands for (matched whole); ValueError naming
    the problem when the pattern is malformed."""
    out: list[str] = []
    i, n = 0, len(pattern)
    while i < n:
        c = pattern[i]
        if c == "*":
            out.append(".*")
        elif c == "?":
            out.append(".")
        elif c == "\\":
            if i + 1 >= n:
                raise ValueError("the pattern ends with a lone '\\'; write '\\\\' for a backslash")
            i += 1
            out.append(re.escape(pattern[i]))
        elif c == "[":
            i = _glob_class(pattern, i, out)
            continue
        else:
            out.append(re.escape(c))
        i += 1
    return re.compile("".join(out), re.DOTALL)


def _glob_class(pattern: str, start: int, out: list[str]) -> int:
    """Translate the class opening at pattern[start]; return the index after its ']'."""
    i, n = start + 1, len(pattern)
    negate = i < n and pattern[i] in "^!"
    if negate:
        i += 1
    chars: list[str] = []
    while i < n and pattern[i] != "]":
        c = pattern[i]
        if c == "\\":
            if i + 1 >= n:
                break
            i += 1
            c = pattern[i]
        if i + 2 < n and pattern[i + 1] == "-" and pattern[i + 2] != "]":
            high = pattern[i + 2]
            if high == "\\" and i + 3 < n:
                high = pattern[i + 3]
                i += 1
            if ord(high) < ord(c):
                raise ValueError(f"the range '{c}-{high}' in the pattern runs backwards")
            chars.append(f"{re.escape(c)}-{re.escape(high)}")
            i += 3
            continue
        chars.append(re.escape(c))
        i += 1
    if i >= n:
        raise ValueError(f"the '[' at offset {start} of the pattern is never closed by ']'")
    if not chars:
        raise ValueError(f"the class at offset {start} of the pattern is empty")
    out.append(("[^" if negate else "[") + "".join(chars) + "]")
    return i + 1
