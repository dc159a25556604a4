"""Evaluation of FQL trees over a message (pure: no I/O).

A tree is compiled once into nested closures; a closure takes the message (the JSON object
as received, a dict) and returns a JSON value. Evaluation never raises: a missing field is
null, a value of the wrong type makes a comparison false and a function yield null (or the
default docs/filters.md gives), so a message cannot make a filter fail.
"""

from __future__ import annotations

import functools
import re
from collections.abc import Callable, Mapping
from typing import Any, Final, TypeAlias

from efd import jsonjs
from efd.languages.filters.glob import Glob, compile_glob
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

__all__ = ["Compiled", "compile_condition", "compile_node", "equal", "evaluate", "kind"]

Message: TypeAlias = Mapping[str, Any]
Compiled: TypeAlias = Callable[[Message], Any]


def kind(value: Any) -> str:
    """The FQL type of a JSON value: string, number, bool, list, object or null."""
    if value is None:
        return "null"
    t = type(value)
    if t is str:
        return "string"
    if t is bool:
        return "bool"
    if t is int or t is float:
        return "number"
    if t is list:
        return "list"
    if t is dict:
        return "object"
    if isinstance(value, bool):
        return "bool"
    if isinstance(value, str):
        return "string"
    if isinstance(value, int | float):
        return "number"
    if isinstance(value, list | tuple):
        return "list"
    return "object"


def equal(a: Any, b: Any) -> bool:
    """FQL's `=`: the same type and strictly equal (1 and true differ; 1 and 1.0 do not);
    lists and objects element by element."""
    ka, kb = kind(a), kind(b)
    if ka != kb:
        return False
    if ka == "list":
        return len(a) == len(b) and all(equal(x, y) for x, y in zip(a, b, strict=True))
    if ka == "object":
        if not (isinstance(a, Mapping) and isinstance(b, Mapping)):
            return a is b
        return a.keys() == b.keys() and all(equal(a[k], b[k]) for k in a)
    return bool(a == b)


def _number(value: Any) -> int | float | None:
    t = type(value)
    if t is int or t is float:
        return value  # type: ignore[no-any-return]
    return None


# ---------------------------------------------------------------------------------------------
# Functions. Each takes JSON values and returns one; the null defaults are Segment's.

_WHITESPACE: Final = re.compile(r"\s")
_WORD_START: Final = re.compile(r"(?:^|(?<=\s))(\S)")
_DECIMAL: Final = re.compile(r"[+-]?(?:[0-9]+(?:\.[0-9]*)?|\.[0-9]+)(?:[eE][+-]?[0-9]+)?")
_FALSE_TEXT: Final = frozenset({"", "false"})


def _contains(s: Any, sub: Any) -> bool:
    return isinstance(s, str) and isinstance(sub, str) and sub in s


@functools.lru_cache(maxsize=256)
def _pattern(pattern: str) -> Glob | None:
    try:
        return compile_glob(pattern)
    except ValueError:
        return None


def _match(s: Any, pattern: Any) -> bool:
    if not (isinstance(s, str) and isinstance(pattern, str)):
        return False
    glob = _pattern(pattern)
    return glob is not None and glob.match(s)


def _length(value: Any) -> int | None:
    if value is None:
        return 0
    if isinstance(value, str):
        # Bytes of UTF-8, as Segment counts; a lone surrogate counts its three bytes.
        return len(value) if value.isascii() else len(value.encode("utf-8", "surrogatepass"))
    if isinstance(value, list | tuple):
        return len(value)
    return None


def _text_function(change: Callable[[str], str]) -> Callable[[Any], str | None]:
    def apply(value: Any) -> str | None:
        return change(value) if isinstance(value, str) else None

    return apply


def _titlecase(text: str) -> str:
    return _WORD_START.sub(lambda m: m.group(1).upper(), text)


def _typeof(value: Any) -> str:
    return kind(value)


def _bool(value: Any) -> bool:
    k = kind(value)
    if k == "bool":
        return bool(value)
    if k == "null":
        return False
    if k == "number":
        return bool(value != 0)
    if k == "string":
        return value.strip().lower() not in _FALSE_TEXT
    try:
        return len(value) > 0
    except TypeError:
        return True


def _string(value: Any) -> str | None:
    if isinstance(value, str):
        return value
    try:
        return jsonjs.dumps(value).decode("utf-8")
    except (ValueError, TypeError, RecursionError):  # NaN, Infinity, or not JSON at all
        return None


def _to_number(value: Any) -> int | float | None:
    if kind(value) == "number":
        return value  # type: ignore[no-any-return]
    if not isinstance(value, str):
        return None
    text = value.strip()
    if _DECIMAL.fullmatch(text) is None:
        return None
    if "." not in text and "e" not in text and "E" not in text:
        try:
            return int(text)
        except ValueError:  # more digits than Python converts to an int: read as a float
            pass
    number = float(text)
    return number if number - number == 0 else None  # finite only


_FUNCTIONS: Final[dict[str, Callable[..., Any]]] = {
    "contains": _contains,
    "match": _match,
    "length": _length,
    "lowercase": _text_function(str.lower),
    "uppercase": _text_function(str.upper),
    "snakecase": _text_function(lambda s: _WHITESPACE.sub("_", s)),
    "kebabcase": _text_function(lambda s: _WHITESPACE.sub("-", s)),
    "titlecase": _text_function(_titlecase),
    "typeof": _typeof,
    "bool": _bool,
    "string": _string,
    "number": _to_number,
}


# ---------------------------------------------------------------------------------------------
# Compilation


def compile_node(node: Node) -> Compiled:
    """A closure computing `node`'s value for a message."""
    if isinstance(node, Literal):
        value = node.value
        return lambda m: value
    if isinstance(node, Path):
        return _compile_path(node.segments)
    if isinstance(node, ListExpr):
        if all(isinstance(item, Literal) for item in node.items):
            constant = [item.value for item in node.items if isinstance(item, Literal)]
            return lambda m: constant
        parts = [compile_node(item) for item in node.items]
        return lambda m: [part(m) for part in parts]
    if isinstance(node, Call):
        return _compile_call(node)
    if isinstance(node, Compare):
        return _compile_compare(node)
    if isinstance(node, In):
        return _compile_in(node)
    if isinstance(node, Not):
        inner = compile_node(node.item)
        return lambda m: inner(m) is not True
    parts = [compile_node(item) for item in node.items]
    return _all_true(parts) if isinstance(node, And) else _any_true(parts)


# `and` and `or` of two or three parts, by far the most written, without a loop's overhead.


def _all_true(parts: list[Compiled]) -> Callable[[Message], bool]:
    if len(parts) == 2:
        a, b = parts
        return lambda m: a(m) is True and b(m) is True
    if len(parts) == 3:
        a, b, c = parts
        return lambda m: a(m) is True and b(m) is True and c(m) is True

    def all_true(m: Message) -> bool:
        return all(part(m) is True for part in parts)

    return all_true


def _any_true(parts: list[Compiled]) -> Callable[[Message], bool]:
    if len(parts) == 2:
        a, b = parts
        return lambda m: a(m) is True or b(m) is True
    if len(parts) == 3:
        a, b, c = parts
        return lambda m: a(m) is True or b(m) is True or c(m) is True

    def any_true(m: Message) -> bool:
        return any(part(m) is True for part in parts)

    return any_true


def compile_condition(node: Node) -> Callable[[Message], bool]:
    """A closure telling whether `node` holds for a message: its value is exactly true."""
    compiled = compile_node(node)
    if isinstance(node, Compare | In | Not | And | Or):
        return compiled  # these yield True or False already
    return lambda m: compiled(m) is True


def evaluate(node: Node, message: Message) -> Any:
    """`node`'s value for one message (compiles on each call: for tests and tools)."""
    return compile_node(node)(message)


def _compile_path(segments: tuple[str, ...]) -> Compiled:
    if len(segments) == 1:
        key = segments[0]
        return lambda m: m.get(key)
    first, rest = segments[0], segments[1:]

    def get(m: Message) -> Any:
        value = m.get(first)
        for segment in rest:
            if type(value) is not dict and not isinstance(value, Mapping):
                return None
            value = value.get(segment)
        return value

    return get


def _compile_call(node: Call) -> Compiled:
    function = _FUNCTIONS[node.name]
    if node.name == "match":
        pattern = node.args[1]
        if isinstance(pattern, Literal) and isinstance(pattern.value, str):
            matches = compile_glob(pattern.value).match  # checked by the parser
            subject = compile_node(node.args[0])

            def match(m: Message) -> bool:
                value = subject(m)
                return isinstance(value, str) and matches(value)

            return match
    args = [compile_node(arg) for arg in node.args]
    if len(args) == 1:
        only = args[0]
        return lambda m: function(only(m))
    first, second = args
    return lambda m: function(first(m), second(m))


def _compile_equal(node: Compare) -> Callable[[Message], bool]:
    left, right = node.left, node.right
    if isinstance(left, Literal) and not isinstance(right, Literal):
        left, right = right, left
    subject = compile_node(left)
    if isinstance(right, Literal):
        target = right.value
        if target is None:
            return lambda m: subject(m) is None
        if isinstance(target, bool):
            return lambda m: subject(m) is target
        if isinstance(target, str):

            def equal_text(m: Message) -> bool:
                value = subject(m)
                return isinstance(value, str) and value == target

            return equal_text

        def equal_number(m: Message) -> bool:
            value = subject(m)
            t = type(value)
            return (t is int or t is float) and value == target

        return equal_number
    other = compile_node(right)
    return lambda m: equal(subject(m), other(m))


_ORDER: Final[dict[str, Callable[[Any, Any], bool]]] = {
    "<": lambda a, b: bool(a < b),
    "<=": lambda a, b: bool(a <= b),
    ">": lambda a, b: bool(a > b),
    ">=": lambda a, b: bool(a >= b),
}


def _compile_compare(node: Compare) -> Callable[[Message], bool]:
    if node.op in ("=", "!="):
        same = _compile_equal(node)
        if node.op == "=":
            return same
        return lambda m: not same(m)
    order = _ORDER[node.op]
    left, right = compile_node(node.left), compile_node(node.right)

    def compare(m: Message) -> bool:
        a, b = _number(left(m)), _number(right(m))
        return a is not None and b is not None and order(a, b)

    return compare


def _compile_in(node: In) -> Callable[[Message], bool]:
    item = compile_node(node.item)
    collection = node.collection
    if isinstance(collection, ListExpr) and all(isinstance(x, Literal) for x in collection.items):
        values = [x.value for x in collection.items if isinstance(x, Literal)]
        texts = frozenset(v for v in values if isinstance(v, str))

        def in_constant(m: Message) -> bool:
            value = item(m)
            if isinstance(value, str):
                return value in texts
            return any(equal(value, v) for v in values)

        return in_constant
    compiled = compile_node(collection)

    def in_list(m: Message) -> bool:
        values = compiled(m)
        if kind(values) != "list":
            return False
        value = item(m)
        return any(equal(value, v) for v in values)

    return in_list
