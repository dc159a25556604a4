"""A destination's filters applied to one message (pure: no I/O).

Segment's order: every sample filter, then every drop filter, then drop_fields, then
allow_fields, each group in the order configured. Every `if` is evaluated on the message as
received, so what one filter removes cannot change whether another applies. The message is
never modified: a field filter returns a new dict that shares the parts it left alone with
the input, so neither may be modified afterwards (several destinations share one message).
"""

from __future__ import annotations

import functools
import hashlib
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Final, Literal, TypeAlias

from efd.languages.filters.evaluate import compile_condition
from efd.languages.filters.parser import parse
from efd.languages.filters.tree import FqlError, Node

__all__ = [
    "ACTIONS",
    "FIELD_OBJECTS",
    "Action",
    "Condition",
    "Filter",
    "FilterSet",
    "Filtered",
    "apply_filters",
    "parse_field_path",
    "sample_point",
]

Action: TypeAlias = Literal["sample", "drop", "drop_fields", "allow_fields"]
ACTIONS: Final[tuple[Action, ...]] = ("sample", "drop", "drop_fields", "allow_fields")
# The objects whose fields drop_fields and allow_fields may name, as in Segment.
FIELD_OBJECTS: Final = ("properties", "context", "traits")
ALL: Final = "all"

Message: TypeAlias = Mapping[str, Any]
FieldPath: TypeAlias = tuple[str, ...]


class Condition:
    """A filter's `if`: "all", or an FQL expression parsed and compiled once.

    Equal by text; pickles as its text and is compiled again where it is unpickled (parser
    processes), since the compiled closures cannot be pickled."""

    __slots__ = ("matches", "root", "source")

    def __init__(self, source: str) -> None:
        self.source = source
        every = source.strip() == ALL
        if not every and source.strip().lower() == ALL:
            # A field named ALL would parse, and match nothing: surely not what was meant.
            raise FqlError('to filter every message, write "all" in lower case', 1, 1)
        self.root: Node | None = None if every else parse(source)
        self.matches: Callable[[Message], bool] = (
            _always if self.root is None else compile_condition(self.root)
        )

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Condition) and other.source == self.source

    def __hash__(self) -> int:
        return hash(self.source)

    def __repr__(self) -> str:
        return f"Condition({self.source!r})"

    def __reduce__(self) -> tuple[type[Condition], tuple[str]]:
        return Condition, (self.source,)


def _always(message: Message) -> bool:
    return True


def parse_field_path(text: str) -> FieldPath:
    """A field path of drop_fields or allow_fields: names joined by '.', where '\\.' is a
    dot and '\\\\' a backslash within a name. ValueError when a name is empty."""
    segments: list[str] = []
    current: list[str] = []
    i = 0
    while i < len(text):
        ch = text[i]
        if ch == "\\":
            if i + 1 >= len(text):
                raise ValueError(f"{text!r} ends with a lone '\\'")
            current.append(text[i + 1])
            i += 2
            continue
        if ch == ".":
            segments.append("".join(current))
            current = []
        else:
            current.append(ch)
        i += 1
    segments.append("".join(current))
    if any(not segment for segment in segments):
        raise ValueError(f"{text!r} has an empty name; write names joined by '.', e.g. page.url")
    return tuple(segments)


def sample_point(message_id: str) -> float:
    """Where a message falls in [0, 1): the first 8 bytes of SHA-256 of its messageId
    (UTF-8), big-endian, over 2**64. A sample of p percent keeps the messages below p/100."""
    digest = hashlib.sha256(message_id.encode("utf-8", "surrogatepass")).digest()
    return int.from_bytes(digest[:8], "big") / 2.0**64


@dataclass(frozen=True, slots=True)
class Filter:
    """One filter as configured: its condition, its action, and the action's settings."""

    when: Condition
    action: Action
    percent: float | None = None  # sample only: 0 to 100
    # drop_fields and allow_fields only: (object, paths within it) for each object named.
    fields: tuple[tuple[str, tuple[FieldPath, ...]], ...] = ()


@dataclass(frozen=True, slots=True)
class Filtered:
    """The message is not sent: `index` is the filter's place in the destination's list."""

    index: int
    action: Literal["sample", "drop"]
    condition: str
    percent: float | None = None

    @property
    def reason(self) -> str:
        """One line for the audit: which filter, and why."""
        if self.action == "drop":
            return f"filters[{self.index}] drop, if {self.condition}"
        return f"filters[{self.index}] sample {self.percent:g} %, if {self.condition}: sampled out"


# ---------------------------------------------------------------------------------------------
# Field filters, copy on write: an unchanged value is returned as the same object.

_LEAF: Final = object()  # in an allow tree: the whole value is kept
_GONE: Final = object()  # an allowed value with no allowed part left: left out

Tree: TypeAlias = dict[str, Any]


def _drop_path(value: Any, path: FieldPath) -> Any:
    if isinstance(value, dict):
        key = path[0]
        if key not in value:
            return value
        if len(path) == 1:
            smaller = dict(value)
            del smaller[key]
            return smaller
        child = value[key]
        new_child = _drop_path(child, path[1:])
        if new_child is child:
            return value
        changed = dict(value)
        changed[key] = new_child
        return changed
    if isinstance(value, list):
        # Segment's arrays: the path applies to every object in the list.
        items = [_drop_path(item, path) if isinstance(item, dict) else item for item in value]
        if all(new is old for new, old in zip(items, value, strict=True)):
            return value
        return items
    return value


def _allow_tree(paths: Iterable[FieldPath]) -> Tree:
    """The allowed paths as a tree; a shorter path keeps its whole value, whatever else is
    listed beneath it."""
    tree: Tree = {}
    for path in paths:
        node = tree
        for segment in path[:-1]:
            child = node.get(segment)
            if child is _LEAF:
                break
            if child is None:
                child = node[segment] = {}
            node = child
        else:
            node[path[-1]] = _LEAF
    return tree


def _keep(value: dict[str, Any], tree: Tree) -> dict[str, Any]:
    kept: dict[str, Any] = {}
    same = True
    for key, child in value.items():
        sub = tree.get(key)
        if sub is None:
            same = False
            continue
        new = child if sub is _LEAF else _keep_within(child, sub)
        if new is _GONE:
            same = False
            continue
        same = same and new is child
        kept[key] = new
    return value if same else kept


def _keep_within(value: Any, tree: Tree) -> Any:
    """A value that a deeper path (e.g. products.sku) points into: an object keeps only the
    allowed fields, a list its objects so reduced; anything else has no allowed part."""
    if isinstance(value, dict):
        return _keep(value, tree)
    if isinstance(value, list):
        items = [_keep(item, tree) for item in value if isinstance(item, dict)]
        if len(items) == len(value) and all(n is o for n, o in zip(items, value, strict=True)):
            return value
        return items
    return _GONE


@dataclass(frozen=True, slots=True)
class _Step:
    index: int
    filter: Filter
    # (object, apply) for field filters: apply takes the object and returns it or a new one.
    edits: tuple[tuple[str, Callable[[dict[str, Any]], dict[str, Any]]], ...] = ()


def _drop_paths(value: dict[str, Any], keys: frozenset[str], deep: tuple[FieldPath, ...]) -> Any:
    """Drop the top-level `keys` (one copy for all of them) and the `deep` paths."""
    if not keys.isdisjoint(value):
        value = {k: v for k, v in value.items() if k not in keys}
    for path in deep:
        value = _drop_path(value, path)
    return value


def _edits(f: Filter) -> tuple[tuple[str, Callable[[dict[str, Any]], dict[str, Any]]], ...]:
    if f.action == "drop_fields":
        return tuple(
            (
                name,
                functools.partial(
                    _drop_paths,
                    keys=frozenset(path[0] for path in paths if len(path) == 1),
                    deep=tuple(path for path in paths if len(path) > 1),
                ),
            )
            for name, paths in f.fields
        )
    return tuple(
        (name, functools.partial(_keep, tree=_allow_tree(paths))) for name, paths in f.fields
    )


class FilterSet:
    """A destination's filters, ordered for application once (at configuration load)."""

    __slots__ = ("_steps", "filters")

    def __init__(self, filters: Sequence[Filter]) -> None:
        self.filters = tuple(filters)
        order = {action: rank for rank, action in enumerate(ACTIONS)}
        steps = sorted(
            (_Step(i, f, _edits(f)) for i, f in enumerate(self.filters)),
            key=lambda step: (order[step.filter.action], step.index),
        )
        self._steps = tuple(steps)

    def __bool__(self) -> bool:
        return bool(self._steps)

    def __reduce__(self) -> tuple[type[FilterSet], tuple[tuple[Filter, ...]]]:
        return FilterSet, (self.filters,)

    def apply(self, message: Message) -> Filtered | Message:
        """`Filtered` when a sample or drop filter stops the message; otherwise the message,
        the input itself when no field filter changed it."""
        copy: dict[str, Any] | None = None  # made by the first field filter that changes it
        point: float | None = None
        for step in self._steps:
            f = step.filter
            if not f.when.matches(message):
                continue
            if f.action == "drop":
                return Filtered(step.index, "drop", f.when.source)
            if f.action == "sample":
                if point is None:
                    message_id = message.get("messageId")
                    point = sample_point(message_id if isinstance(message_id, str) else "")
                assert f.percent is not None
                if point * 100.0 >= f.percent:
                    return Filtered(step.index, "sample", f.when.source, f.percent)
                continue
            for name, edit in step.edits:
                value = (message if copy is None else copy).get(name)
                if not isinstance(value, dict):
                    continue
                new = edit(value)
                if new is not value:
                    if copy is None:
                        copy = dict(message)
                    copy[name] = new
        return message if copy is None else copy


def apply_filters(filters: Sequence[Filter], message: Message) -> Filtered | Message:
    """Apply a destination's filters to one message (see FilterSet.apply)."""
    return FilterSet(filters).apply(message)
