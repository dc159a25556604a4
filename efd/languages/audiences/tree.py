"""The audience language's tree (pure): the nodes a condition or an expression is parsed
into, and what a computation needs of the stored data (`requirements`). Its lexer, parser
and printer are efd/languages/audiences/lexer.py, parser.py and printer.py."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Final, TypeAlias
from typing import Literal as Lit

from efd.languages.toolkit import And as And
from efd.languages.toolkit import Literal as Literal
from efd.languages.toolkit import Node as _Node
from efd.languages.toolkit import Not as Not
from efd.languages.toolkit import Or as Or
from efd.languages.toolkit import Scalar as Scalar
from efd.languages.toolkit import SourceError


class ParseError(SourceError):
    """An audience condition or expression that does not parse or type-check."""


# ---------------------------------------------------------------------------------------------
# The tree: its nodes build on efd/languages/toolkit.py's (a position left out of equality),
# whose literal, and, or and not it shares.


@dataclass(frozen=True)
class TraitRef(_Node):
    name: str


@dataclass(frozen=True)
class PropertyRef(_Node):
    """property('x'): only valid inside where(), reads the event's property."""

    name: str


UNIT_SECONDS: Final[dict[str, int]] = {"days": 86400, "hours": 3600, "minutes": 60}


@dataclass(frozen=True)
class Window(_Node):
    amount: int
    unit: Lit["days", "hours", "minutes"]

    @property
    def seconds(self) -> float:
        return float(self.amount * UNIT_SECONDS[self.unit])


@dataclass(frozen=True)
class EventQuery(_Node):
    """event('Name') with its filters; not a value until an aggregate is applied."""

    event: str
    where: BoolNode | None = None
    within: Window | None = None


AggregateFunc: TypeAlias = Lit[
    "count", "sum", "avg", "min", "max", "first", "last", "mode", "unique", "unique_count"
]


@dataclass(frozen=True)
class Aggregate(_Node):
    """An event query reduced to one value. `prop` is None only for count."""

    query: EventQuery
    func: AggregateFunc
    prop: str | None = None
    min_frequency: int | None = None  # mode('p', N) only


CompareOp: TypeAlias = Lit["=", "!=", "<", "<=", ">", ">=", "contains"]
MatchOp: TypeAlias = Lit["contains", "one_of", "starts_with", "ends_with", "omits"]


@dataclass(frozen=True)
class Compare(_Node):
    left: ValueNode
    op: CompareOp
    right: ValueNode


@dataclass(frozen=True)
class Match(_Node):
    """Method comparators with a list of candidates, e.g. trait('x').one_of('a', 'b')."""

    operand: ValueNode
    op: MatchOp
    values: tuple[ValueNode, ...]


@dataclass(frozen=True)
class Presence(_Node):
    """.exists() (present=True) or .absent() (present=False)."""

    operand: ValueNode
    present: bool


ValueNode: TypeAlias = Literal | TraitRef | PropertyRef | Aggregate
BoolNode: TypeAlias = (
    Compare | Match | Presence | And["BoolNode"] | Or["BoolNode"] | Not["BoolNode"]
)
Node: TypeAlias = ValueNode | BoolNode | EventQuery

VALUE_TYPES: Final = (Literal, TraitRef, PropertyRef, Aggregate)
BOOL_TYPES: Final = (Compare, Match, Presence, And, Or, Not)


# ---------------------------------------------------------------------------------------------
# What storage must load to evaluate an expression.


@dataclass(frozen=True)
class Requirements:
    """Event names, trait names and the longest lookback an expression needs.

    lookback_seconds is None when some event query has no within() (all history is needed),
    and 0.0 when no event is referenced at all.
    """

    event_names: frozenset[str]
    trait_names: frozenset[str]
    lookback_seconds: float | None

    def union(self, other: Requirements) -> Requirements:
        lookback = (
            None
            if self.lookback_seconds is None or other.lookback_seconds is None
            else max(self.lookback_seconds, other.lookback_seconds)
        )
        return Requirements(
            self.event_names | other.event_names, self.trait_names | other.trait_names, lookback
        )


def requirements(node: Node) -> Requirements:
    events: set[str] = set()
    traits: set[str] = set()
    lookbacks: list[float | None] = []

    def walk(n: Node) -> None:
        if isinstance(n, TraitRef):
            traits.add(n.name)
        elif isinstance(n, Aggregate):
            walk(n.query)
        elif isinstance(n, EventQuery):
            events.add(n.event)
            lookbacks.append(None if n.within is None else n.within.seconds)
            if n.where is not None:
                walk(n.where)
        elif isinstance(n, Compare):
            walk(n.left)
            walk(n.right)
        elif isinstance(n, Match):
            walk(n.operand)
            for v in n.values:
                walk(v)
        elif isinstance(n, Presence):
            walk(n.operand)
        elif isinstance(n, And | Or):
            for item in n.items:
                walk(item)
        elif isinstance(n, Not):
            walk(n.item)

    walk(node)
    if any(lb is None for lb in lookbacks):
        lookback: float | None = None
    else:
        lookback = max((lb for lb in lookbacks if lb is not None), default=0.0)
    return Requirements(frozenset(events), frozenset(traits), lookback)


@dataclass(frozen=True)
class Condition:
    """A parsed audience condition (yields true/false)."""

    source: str
    root: BoolNode

    def requirements(self) -> Requirements:
        return requirements(self.root)


@dataclass(frozen=True)
class Expression:
    """A parsed computed-trait expression (yields a value)."""

    source: str
    root: Aggregate

    def requirements(self) -> Requirements:
        return requirements(self.root)
