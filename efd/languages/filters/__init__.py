"""Destination filters: Segment's Filter Query Language (FQL) and the actions it guards.

`parser` parses text into a tree (`lexer` cuts it into tokens, `printer` prints a tree
back), `evaluate` compiles a tree into closures over a message, `actions` applies a
destination's filters (sample, drop, drop_fields, allow_fields) to one message. All of it is
pure. The reference is docs/filters.md.
"""

from efd.languages.filters.actions import (
    ACTIONS,
    FIELD_OBJECTS,
    Action,
    Condition,
    Filter,
    Filtered,
    FilterSet,
    apply_filters,
    parse_field_path,
    sample_point,
)
from efd.languages.filters.evaluate import compile_condition, compile_node, evaluate
from efd.languages.filters.parser import parse
from efd.languages.filters.printer import to_fql
from efd.languages.filters.tree import FqlError, Node

__all__ = [
    "ACTIONS",
    "FIELD_OBJECTS",
    "Action",
    "Condition",
    "Filter",
    "FilterSet",
    "Filtered",
    "FqlError",
    "Node",
    "apply_filters",
    "compile_condition",
    "compile_node",
    "evaluate",
    "parse",
    "parse_field_path",
    "sample_point",
    "to_fql",
]
