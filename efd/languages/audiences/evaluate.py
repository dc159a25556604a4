"""Evaluate parsed audience conditions and computed traits against one profile.

A sync runs one expression over ~100,000 profiles, so the AST is compiled once into nested
closures (compile_condition / compile_expression) and each profile only pays for the calls.
Semantics are documented in docs/audience-language.md; evaluation never raises on data:
unexpected types make comparisons false and are skipped by aggregates.
"""

from __future__ import annotations

import json
import math
import operator
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from functools import reduce
from typing import Any, Final, TypeAlias, TypeGuard

from efd.languages.audiences.tree import (
    Aggregate,
    And,
    Compare,
    Condition,
    EventQuery,
    Expression,
    Literal,
    Match,
    Node,
    Not,
    Or,
    Presence,
    PropertyRef,
    TraitRef,
)
from efd.records import Event

__all__ = [
    "CompiledCondition",
    "CompiledExpression",
    "Event",
    "Profile",
    "compile_condition",
    "compile_expression",
    "evaluate_condition",
    "evaluate_expression",
]


@dataclass(frozen=True, slots=True)
class Profile:
    traits: Mapping[str, Any]
    events: Sequence[Event]


CompiledCondition: TypeAlias = Callable[[Profile, float], bool]
CompiledExpression: TypeAlias = Callable[[Profile, float], Any]

# Every closure takes two arguments: (profile, now) at the top level, and
# (event properties, profile traits) inside where(). Only leaves care which.
_Fn: TypeAlias = Callable[[Any, Any], Any]


def compile_condition(condition: Condition) -> CompiledCondition:
    """Compile once per sync; call the result as fn(profile, now) -> bool."""
    fn: CompiledCondition = _compile(condition.root, in_where=False)
    return fn


def compile_expression(expression: Expression) -> CompiledExpression:
    """Compile once per sync; call the result as fn(profile, now) -> JSON-able value."""
    fn: CompiledExpression = _aggregate(expression.root)
    return fn


def evaluate_condition(condition: Condition, profile: Profile, now: float) -> bool:
    """One-off evaluation (compiles each call: use compile_condition in loops)."""
    return compile_condition(condition)(profile, now)


def evaluate_expression(expression: Expression, profile: Profile, now: float) -> Any:
    """One-off evaluation (compiles each call: use compile_expression in loops)."""
    return compile_expression(expression)(profile, now)


# ---------------------------------------------------------------------------------------------
# Value kinds. Comparisons only succeed between values of the same kind; bool is its own kind
# (True is not 1) and int/float share one. Types that JSON cannot produce are their own kind.

_NULL, _BOOL, _NUM, _STR, _LIST, _OBJ = 1, 2, 3, 4, 5, 6
_KINDS: Final[dict[type, int]] = {
    type(None): _NULL,
    bool: _BOOL,
    int: _NUM,
    float: _NUM,
    str: _STR,
    list: _LIST,
    tuple: _LIST,
    dict: _OBJ,
}
_NUMBER_TYPES: Final = (int, float)


def _kind(value: Any) -> object:
    return _KINDS.get(type(value)) or type(value)


def _is_number(value: Any) -> TypeGuard[int | float]:
    """int or finite float; bools and numeric strings are not numbers."""
    t = type(value)
    return t is int or (t is float and math.isfinite(value))


_ORDER: Final[dict[str, Callable[[Any, Any], bool]]] = {
    "<": operator.lt,
    "<=": operator.le,
    ">": operator.gt,
    ">=": operator.ge,
}


def _equal(a: Any, b: Any) -> bool:
    # null is "unknown": it equals nothing, not even null (use .absent() / `= null`).
    return a is not None and bool(a == b) and _kind(a) == _kind(b)


def _contains(a: Any, b: Any) -> bool:
    """Substring for strings; element membership (same-kind equality) for lists."""
    ta = type(a)
    if ta is str:
        return type(b) is str and b in a
    if ta is list or ta is tuple:
        return any(_equal(x, b) for x in a)
    return False


def _compare_generic(op: str, left: _Fn, right: _Fn) -> _Fn:
    if op == "=":
        return lambda x, y: _equal(left(x, y), right(x, y))
    if op == "!=":

        def differs(x: Any, y: Any) -> bool:
            a, b = left(x, y), right(x, y)
            return _kind(a) == _kind(b) and not bool(a == b)  # null vs null: equal, so false

        return differs
    if op == "contains":
        return lambda x, y: _contains(left(x, y), right(x, y))
    order = _ORDER[op]

    def ordered(x: Any, y: Any) -> bool:
        a, b = left(x, y), right(x, y)
        ka = _kind(a)
        return (ka in (_NUM, _STR)) and ka == _kind(b) and order(a, b)

    return ordered


def _compare_literal(op: str, left: _Fn, const: Any) -> _Fn:
    """Specialised closures for the common `<value> op <literal>` shape (hot in where())."""
    if const is None:
        # null compares with nothing (the parser already turned `= null` into absent()).
        return lambda x, y: False
    kc = _kind(const)
    if op == "=":
        return lambda x, y: (v := left(x, y)) == const and _kind(v) == kc
    if op == "!=":
        return lambda x, y: (v := left(x, y)) != const and _kind(v) == kc
    if op == "contains":
        return lambda x, y: _contains(left(x, y), const)
    order = _ORDER[op]
    if kc == _NUM:
        return lambda x, y: type(v := left(x, y)) in _NUMBER_TYPES and order(v, const)
    if kc == _STR:
        return lambda x, y: type(v := left(x, y)) is str and order(v, const)
    return lambda x, y: False  # booleans, null: no ordering


def _match(node: Match, operand: _Fn, values: list[_Fn]) -> _Fn:
    op = node.op
    if op in ("contains", "one_of"):
        test = _contains if op == "contains" else _equal

        def any_of(x: Any, y: Any) -> bool:
            a = operand(x, y)  # once: it may be an aggregate
            return any(test(a, f(x, y)) for f in values)

        return any_of

    def strings(x: Any, y: Any) -> tuple[str, list[str]] | None:
        a = operand(x, y)
        bs = [f(x, y) for f in values]
        if type(a) is not str or any(type(b) is not str for b in bs):
            return None
        return a, bs

    if op == "starts_with":
        return lambda x, y: (s := strings(x, y)) is not None and any(map(s[0].startswith, s[1]))
    if op == "ends_with":
        return lambda x, y: (s := strings(x, y)) is not None and any(map(s[0].endswith, s[1]))
    # omits: a string that contains none of the candidates.
    return lambda x, y: (s := strings(x, y)) is not None and all(b not in s[0] for b in s[1])


def _cost(node: Node) -> int:
    """Rough cost, so that and/or test cheap trait comparisons before scanning events."""
    if isinstance(node, Aggregate):
        return 100
    if isinstance(node, Compare):
        return _cost(node.left) + _cost(node.right) + 1
    if isinstance(node, Match):
        return _cost(node.operand) + sum(_cost(v) for v in node.values) + 1
    if isinstance(node, Presence):
        return _cost(node.operand) + 1
    if isinstance(node, And | Or):
        return sum(_cost(i) for i in node.items)
    if isinstance(node, Not):
        return _cost(node.item)
    return 1


def _both(f: _Fn, g: _Fn) -> _Fn:
    return lambda x, y: f(x, y) and g(x, y)


def _either(f: _Fn, g: _Fn) -> _Fn:
    return lambda x, y: f(x, y) or g(x, y)


def _compile(node: Node, in_where: bool) -> _Fn:
    if isinstance(node, Literal):
        const = node.value
        return lambda x, y: const
    if isinstance(node, TraitRef):
        name = node.name
        if in_where:
            return lambda props, traits: traits.get(name)
        return lambda profile, now: profile.traits.get(name)
    if isinstance(node, PropertyRef):
        prop = node.name
        return lambda props, traits: props.get(prop)
    if isinstance(node, Aggregate):
        return _aggregate(node)
    if isinstance(node, Compare):
        left = _compile(node.left, in_where)
        if isinstance(node.right, Literal):
            return _compare_literal(node.op, left, node.right.value)
        return _compare_generic(node.op, left, _compile(node.right, in_where))
    if isinstance(node, Match):
        values = [_compile(v, in_where) for v in node.values]
        return _match(node, _compile(node.operand, in_where), values)
    if isinstance(node, Presence):
        operand = _compile(node.operand, in_where)
        if node.present:
            return lambda x, y: operand(x, y) is not None
        return lambda x, y: operand(x, y) is None
    if isinstance(node, And | Or):
        # Pure expressions, so reordering is safe; sorted() is stable for equal costs.
        parts = [_compile(i, in_where) for i in sorted(node.items, key=_cost)]
        return reduce(_both if isinstance(node, And) else _either, parts)
    if isinstance(node, Not):
        inner = _compile(node.item, in_where)
        return lambda x, y: not inner(x, y)
    raise TypeError(f"cannot evaluate {type(node).__name__} here")  # EventQuery: parser desugars


# ---------------------------------------------------------------------------------------------
# Event queries and aggregates

_Selector: TypeAlias = Callable[[Profile, float], list[Event]]


def _selector(query: EventQuery) -> _Selector:
    """Events of the query's name, inside the window, passing where(), in input order."""
    name = query.event
    pred = None if query.where is None else _compile(query.where, in_where=True)
    # The window includes its edge (timestamp == now - window) and future timestamps.
    window = None if query.within is None else query.within.seconds
    if pred is None and window is None:
        return lambda p, now: [e for e in p.events if e.name == name]
    if pred is None:
        assert window is not None
        span = window

        def in_window(p: Profile, now: float) -> list[Event]:
            cutoff = now - span
            return [e for e in p.events if e.name == name and e.timestamp >= cutoff]

        return in_window
    where = pred
    if window is None:
        return lambda p, now: [
            e for e in p.events if e.name == name and where(e.properties, p.traits)
        ]
    span = window

    def select(p: Profile, now: float) -> list[Event]:
        cutoff = now - span
        traits = p.traits
        return [
            e
            for e in p.events
            if e.name == name and e.timestamp >= cutoff and where(e.properties, traits)
        ]

    return select


def _aggregate(node: Aggregate) -> _Fn:
    select = _selector(node.query)
    func = node.func
    if func == "count":
        return lambda p, now: len(select(p, now))
    prop = node.prop
    assert prop is not None  # the parser gives every aggregate but count a property
    if func == "mode":
        min_frequency = node.min_frequency or 1
        return lambda p, now: _mode(select(p, now), prop, min_frequency)
    reducer = _REDUCERS[func]
    return lambda p, now: reducer(select(p, now), prop)


def _numbers(events: list[Event], prop: str) -> list[int | float]:
    return [v for e in events if _is_number(v := e.properties.get(prop))]


def _sum(events: list[Event], prop: str) -> Any:
    return sum(_numbers(events, prop))


def _avg(events: list[Event], prop: str) -> Any:
    nums = _numbers(events, prop)
    return sum(nums) / len(nums) if nums else None


def _min(events: list[Event], prop: str) -> Any:
    nums = _numbers(events, prop)
    return min(nums) if nums else None


def _max(events: list[Event], prop: str) -> Any:
    nums = _numbers(events, prop)
    return max(nums) if nums else None


def _first(events: list[Event], prop: str) -> Any:
    """Value from the earliest event having the property; ties keep the earlier in input."""
    best, best_ts = None, math.inf
    for e in events:
        v = e.properties.get(prop)
        if v is not None and e.timestamp < best_ts:
            best, best_ts = v, e.timestamp
    return best


def _last(events: list[Event], prop: str) -> Any:
    """Value from the latest event having the property; ties keep the later in input."""
    best, best_ts = None, -math.inf
    for e in events:
        v = e.properties.get(prop)
        if v is not None and e.timestamp >= best_ts:
            best, best_ts = v, e.timestamp
    return best


def _key(value: Any) -> object:
    """Hashable identity for distinct/mode: 1 and 1.0 are equal, 1 and True and '1' are not."""
    kind = _kind(value)
    if kind in (_LIST, _OBJ):
        try:
            return (kind, json.dumps(value, sort_keys=True, default=repr))
        except (TypeError, ValueError):
            return (kind, repr(value))
    try:
        hash(value)
    except TypeError:
        return (kind, repr(value))
    return (kind, value)


def _tally(events: list[Event], prop: str) -> dict[object, list[Any]]:
    """key -> [first timestamp, first input index, first value, count]; nulls skipped."""
    seen: dict[object, list[Any]] = {}
    for i, e in enumerate(events):
        v = e.properties.get(prop)
        if v is None or (type(v) is float and v != v):  # NaN never equals itself: skip
            continue
        kind = _KINDS.get(type(v))
        # Scalars are hashable as they are; only lists, dicts and odd types need _key().
        k = (kind, v) if kind in (_STR, _NUM, _BOOL) else _key(v)
        entry = seen.get(k)
        if entry is None:
            seen[k] = [e.timestamp, i, v, 1]
        else:
            entry[3] += 1
            if e.timestamp < entry[0]:
                entry[0], entry[1], entry[2] = e.timestamp, i, v
    return seen


def _unique(events: list[Event], prop: str) -> Any:
    """Distinct values in order of first occurrence (timestamp, then input order)."""
    entries = sorted(_tally(events, prop).values(), key=lambda en: (en[0], en[1]))
    return [en[2] for en in entries]


def _unique_count(events: list[Event], prop: str) -> Any:
    return len(_tally(events, prop))


def _mode(events: list[Event], prop: str, min_frequency: int) -> Any:
    """Most frequent value; a tie goes to the value seen first (timestamp, then input order)."""
    entries = _tally(events, prop).values()
    if not entries:
        return None
    best = min(entries, key=lambda en: (-en[3], en[0], en[1]))
    return best[2] if best[3] >= min_frequency else None


_REDUCERS: Final[dict[str, Callable[[list[Event], str], Any]]] = {
    "sum": _sum,
    "avg": _avg,
    "min": _min,
    "max": _max,
    "first": _first,
    "last": _last,
    "unique": _unique,
    "unique_count": _unique_count,
}
