"""The trigger language's tree (pure): what a Segment Actions trigger, e.g.
`type = "track" and event = "Order Completed"`, is parsed into. A test holds the operator the
way Segment's evaluator applies it (`= null` on a property is `not_exists`, `= 5` on a property
is `number_equals`, and so on), so that evaluating a test is one rule per operator. Its lexer,
parser, printer and evaluator are the modules beside this one."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Final, TypeAlias
from typing import Literal as Lit

from efd.languages.toolkit import And as And
from efd.languages.toolkit import Node as _Node
from efd.languages.toolkit import Or as Or
from efd.languages.toolkit import SourceError


class TriggerError(SourceError):
    """A trigger that does not parse."""


FieldKind: TypeAlias = Lit["type", "event", "name", "userId", "properties", "traits", "context"]
# The fields read from the message itself; the others name a path inside an object.
TOP_FIELDS: Final[tuple[FieldKind, ...]] = ("type", "event", "name", "userId")
OBJECT_FIELDS: Final[tuple[FieldKind, ...]] = ("properties", "traits", "context")

Operator: TypeAlias = Lit[
    "=",
    "!=",
    "<",
    "<=",
    ">",
    ">=",
    "number_equals",
    "number_not_equals",
    "contains",
    "not_contains",
    "starts_with",
    "not_starts_with",
    "ends_with",
    "not_ends_with",
    "exists",
    "not_exists",
    "is_true",
    "is_false",
]
TEXT_OPERATORS: Final[frozenset[Operator]] = frozenset(
    {
        "=",
        "!=",
        "contains",
        "not_contains",
        "starts_with",
        "not_starts_with",
        "ends_with",
        "not_ends_with",
    }
)
NUMBER_OPERATORS: Final[frozenset[Operator]] = frozenset(
    {"<", "<=", ">", ">=", "number_equals", "number_not_equals"}
)
VALUELESS_OPERATORS: Final[frozenset[Operator]] = frozenset(
    {"exists", "not_exists", "is_true", "is_false"}
)


@dataclass(frozen=True)
class Field(_Node):
    """What a test reads: `kind` and, for properties, traits and context, the path inside
    that object as Segment's evaluator walks it (a name split at '.', '[' and ']')."""

    kind: FieldKind
    path: tuple[str, ...] = ()


@dataclass(frozen=True)
class Condition(_Node):
    """One condition. `value` is text for the text operators, a number for the number
    operators and None for the rest."""

    field: Field
    op: Operator
    value: str | float | None = None


# A trigger: a test, or tests joined by one of and / or, a level of parentheses at most.
Trigger: TypeAlias = Condition | And["Trigger"] | Or["Trigger"]
