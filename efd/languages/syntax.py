"""What the two condition languages' trees share (pure): a node's place in the source text,
the literal node, and the error that names where the text is wrong. FQL's tree is
efd/languages/filters/tree.py, the audience language's efd/languages/audiences/tree.py."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TypeAlias

Scalar: TypeAlias = str | int | float | bool | None


class SourceError(ValueError):
    """A syntax or type error, with a 1-based line and column in the source text."""

    def __init__(self, message: str, line: int, column: int) -> None:
        super().__init__(f"line {line}, column {column}: {message}")
        self.message = message
        self.line = line
        self.column = column


# `pos` (line, column) is left out of equality, so trees compare by structure.
@dataclass(frozen=True, kw_only=True)
class Node:
    pos: tuple[int, int] = field(default=(1, 1), compare=False, repr=False)


@dataclass(frozen=True)
class Literal(Node):
    value: Scalar
