"""Destination filters: Segment's Filter Query Language (FQL).

`fql` parses text into a tree, `evaluate` compiles a tree into closures over a message. All of
it is pure. The reference is docs/filters.md.
"""

from efd.filters.evaluate import compile_condition, compile_node, evaluate
from efd.filters.fql import FqlError, Node, parse, to_fql

__all__ = [
    "FqlError",
    "Node",
    "compile_condition",
    "compile_node",
    "evaluate",
    "parse",
    "to_fql",
]
