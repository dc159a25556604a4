"""What the expression languages share (pure): positioned errors and the wording of the errors
every language can make, the nodes their trees share (a literal, and, or, not), the token and
the scanner that tracks lines and columns, and a parser base with the token stream, the
nesting limit and the and/or/not precedence loops. FQL is efd/languages/filters/, the audience
language efd/languages/audiences/, Segment's trigger language efd/languages/triggers/; each
has its own lexer, parser and printer on this base.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any, ClassVar, Final, Generic, NoReturn, TypeAlias, TypeVar
from typing import Literal as Lit

from efd import jsonjs

Scalar: TypeAlias = str | int | float | bool | None

# Guards the recursive-descent parsers against pathological nesting (RecursionError).
MAX_DEPTH: Final = 64


class SourceError(ValueError):
    """A syntax or type error, with a 1-based line and column in the source text."""

    def __init__(self, message: str, line: int, column: int) -> None:
        super().__init__(f"line {line}, column {column}: {message}")
        self.message = message
        self.line = line
        self.column = column


# ---------------------------------------------------------------------------------------------
# The errors every language can make, in one wording.

EMPTY: Final = "the expression is empty"
END: Final = "the end of the expression"
UNEXPECTED_END: Final = "unexpected end of the expression; expected a value or a condition"
CHAINED: Final = "comparisons cannot be chained; combine them with 'and'"
TRAILING: Final = "expected 'and', 'or' or the end of the expression"


def too_deep(limit: int = MAX_DEPTH) -> str:
    return f"the expression is nested more than {limit} levels deep"


def unterminated_string(quote: str, *, at_line_end: bool = False) -> str:
    if at_line_end:
        return f"unterminated string: the {quote} opened here is not closed on its line"
    return f"unterminated string: the {quote} opened here is never closed"


def out_of_range(raw: str) -> str:
    return f"the number {jsonjs.number_spelling(raw)} is out of range: {jsonjs.OUT_OF_RANGE}"


def unexpected_character(c: str) -> str:
    return f"unexpected character {c!r}"


def wrong_operator(wrong: str, right: str, language: str) -> str:
    """Another language's operator, e.g. '&&', with what to write instead."""
    return f"'{wrong}' is not {language}; write {right}"


def value_after(op: str) -> str:
    return f"expected a value after '{op}', found {END}"


def value_or_condition(found: str) -> str:
    return f"expected a value or a condition, found {found}"


def need_condition(found: str, example: str) -> str:
    return f"expected a condition (true or false), found {found}; compare it, e.g. {example}"


# ---------------------------------------------------------------------------------------------
# The nodes the trees share. `pos` (line, column) is left out of equality, so trees compare by
# structure. And, Or and Not are generic in what they combine: each language's conditions.


@dataclass(frozen=True, kw_only=True)
class Node:
    pos: tuple[int, int] = field(default=(1, 1), compare=False, repr=False)


@dataclass(frozen=True)
class Literal(Node):
    value: Scalar


C = TypeVar("C", bound=Node)  # a condition of the language


@dataclass(frozen=True)
class And(Node, Generic[C]):
    items: tuple[C, ...]


@dataclass(frozen=True)
class Or(Node, Generic[C]):
    items: tuple[C, ...]


@dataclass(frozen=True)
class Not(Node, Generic[C]):
    item: C


# ---------------------------------------------------------------------------------------------
# Tokens and the scanner


TokenKind: TypeAlias = Lit["str", "num", "name", "op", "end"]


@dataclass(frozen=True, slots=True)
class Token:
    kind: TokenKind
    value: str | int | float | tuple[str, ...]
    text: str  # the source spelling, for messages
    line: int
    column: int
    # A name as the language compares it with its keywords and functions; None for a name
    # that can be none of them (and for tokens that are not names).
    word: str | None = None


# Unsigned: a language that lets '-' start a number says so in its own pattern.
NUMBER: Final = re.compile(r"[0-9]+(\.[0-9]+)?([eE][+-]?[0-9]+)?")


class Scanner:
    """Cuts a text into tokens, tracking lines and columns; a language's lexer subclasses it
    and reads one token in `token()` (whitespace is skipped between tokens)."""

    error: ClassVar[type[SourceError]] = SourceError
    # How the hint for another language's operator names this one: "'&&' is not {language}".
    language: ClassVar[str] = "this language"

    def __init__(self, text: str) -> None:
        self.text = text
        self.i = 0
        self.line = 1
        self.line_start = 0

    def column(self, index: int) -> int:
        return index - self.line_start + 1

    def fail(self, message: str, index: int) -> NoReturn:
        raise self.error(message, self.line, self.column(index))

    def newline(self, next_index: int) -> None:
        """A newline was read; the next line starts at `next_index`."""
        self.line += 1
        self.line_start = next_index

    def token(self) -> Token:
        raise NotImplementedError

    def is_space(self, c: str) -> bool:
        """Whether `c` separates tokens (a language with fewer blanks narrows it)."""
        return c.isspace()

    def scan(self) -> tuple[list[Token], SourceError | None]:
        """Tokens up to the end or to the first lexical error, which is returned, not raised,
        so that the parser reports whichever error comes first in the text. The last token is
        always an end token (at the error's position after an error)."""
        tokens: list[Token] = []
        text, n = self.text, len(self.text)
        try:
            while True:
                while self.i < n and self.is_space(text[self.i]):
                    if text[self.i] == "\n":
                        self.newline(self.i + 1)
                    self.i += 1
                if self.i >= n:
                    tokens.append(Token("end", "", "", self.line, self.column(self.i)))
                    return tokens, None
                tokens.append(self.token())
        except SourceError as error:
            tokens.append(Token("end", "", "", error.line, error.column))
            return tokens, error

    def number(self, match: re.Match[str]) -> Token:
        """The number token of a NUMBER-like match at the current index; an error past a
        double's range."""
        raw = match.group()
        value: int | float | None
        if match.group(1) is None and match.group(2) is None:
            value = jsonjs.whole_number(raw)
        else:
            value = float(raw)
            value = value if math.isfinite(value) else None
        if value is None:
            self.fail(out_of_range(raw), self.i)
        token = Token("num", value, raw, self.line, self.column(self.i))
        self.i = match.end()
        return token

    def operator(self, operators: frozenset[str], wrong: Mapping[str, str]) -> Token | None:
        """The operator at the current index, the longest spelling first; an error naming what
        to write for a spelling in `wrong` (another language's operator)."""
        text, i = self.text, self.i
        for size in (2, 1):
            spelling = text[i : i + size]
            if len(spelling) < size:
                continue
            if spelling in operators:
                self.i += size
                return Token("op", spelling, spelling, self.line, self.column(i))
            if spelling in wrong:
                self.fail(wrong_operator(spelling, wrong[spelling], self.language), i)
        return None


# ---------------------------------------------------------------------------------------------
# The parser base

N = TypeVar("N", bound=Node)  # any node of the language


class Parser(Generic[N, C]):
    """Recursive descent over a scanner's tokens. Loosest first: or, and, not, then what the
    language calls a comparison (`comparison()`). `condition()` takes a node where true or
    false is needed and returns it as a condition, or fails."""

    error: ClassVar[type[SourceError]] = SourceError
    max_depth: ClassVar[int] = MAX_DEPTH

    def __init__(self, scanner: Scanner) -> None:
        self.tokens, self.lex_error = scanner.scan()
        self.i = 0
        self.depth = 0

    # -- the token stream

    def peek(self) -> Token:
        tok = self.tokens[self.i]
        if tok.kind == "end" and self.lex_error is not None:
            raise self.lex_error
        return tok

    def ahead(self, offset: int) -> Token:
        """The token `offset` places on (the end token past the end), without raising the
        lexical error there."""
        return self.tokens[min(self.i + offset, len(self.tokens) - 1)]

    def behind(self) -> Token | None:
        return self.tokens[self.i - 1] if self.i else None

    def advance(self) -> Token:
        tok = self.tokens[self.i]
        if tok.kind != "end":
            self.i += 1
        return tok

    def is_op(self, op: str) -> bool:
        tok = self.peek()
        return tok.kind == "op" and tok.value == op

    def is_word(self, word: str) -> bool:
        return self.peek().word == word

    def fail(self, message: str, tok: Token | None = None) -> NoReturn:
        tok = tok or self.peek()
        raise self.error(message, tok.line, tok.column)

    def fail_at(self, message: str, node: Node) -> NoReturn:
        raise self.error(message, node.pos[0], node.pos[1])

    @contextmanager
    def nested(self, tok: Token) -> Iterator[None]:
        """One level deeper (a parenthesis, a negation, an argument list): an error at `tok`
        past the limit."""
        self.depth += 1
        if self.depth > self.max_depth:
            self.fail(too_deep(self.max_depth), tok)
        yield
        self.depth -= 1

    # -- messages

    def describe(self, tok: Token) -> str:
        """A token as "found ..." names it."""
        if tok.kind == "end":
            return END
        if tok.kind == "str":
            return f"the string {tok.text}"
        if tok.kind == "num":
            return f"the number {tok.text}"
        if tok.kind == "name":
            return self.describe_name(tok)
        return f"'{tok.value}'"

    def describe_name(self, tok: Token) -> str:
        return f"'{tok.text}'"

    def hint(self) -> str:
        """What to add after "found ..." at the current token: a pointer to the right
        syntax, or nothing."""
        return ""

    def found(self) -> str:
        return f"found {self.describe(self.peek())}{self.hint()}"

    def expect_op(self, op: str, expected: str) -> Token:
        """Consume `op`; otherwise fail with `expected` (e.g. "expected ')' after ..."), what
        was found and the hint."""
        if not self.is_op(op):
            self.fail(f"{expected}, {self.found()}")
        return self.advance()

    def expect_close(self, open_tok: Token) -> None:
        """The ')' that closes the '(' at `open_tok`."""
        where = f"line {open_tok.line}, column {open_tok.column}"
        self.expect_op(")", f"expected ')' to close the '(' at {where}")

    def expect_start(self) -> None:
        if self.peek().kind == "end":
            self.fail(EMPTY)

    def expect_end(self) -> None:
        if self.peek().kind != "end":
            self.fail(f"{TRAILING}, {self.found()}")

    # -- the boolean loops

    def condition(self, node: N | And[C] | Or[C] | Not[C]) -> C:
        raise NotImplementedError

    def comparison(self) -> N:
        raise NotImplementedError

    def at_not(self) -> bool:
        return self.is_word("not")

    def parse_or(self) -> N | And[C] | Or[C] | Not[C]:
        first = self.parse_and()
        if not self.is_word("or"):
            return first
        items = [self.condition(first)]
        while self.is_word("or"):
            self.advance()
            items.append(self.condition(self.parse_and()))
        return Or(tuple(items), pos=first.pos)

    def parse_and(self) -> N | And[C] | Or[C] | Not[C]:
        first = self.parse_not()
        if not self.is_word("and"):
            return first
        items = [self.condition(first)]
        while self.is_word("and"):
            self.advance()
            items.append(self.condition(self.parse_not()))
        return And(tuple(items), pos=first.pos)

    def parse_not(self) -> N | And[C] | Or[C] | Not[C]:
        if not self.at_not():
            return self.comparison()
        tok = self.advance()
        with self.nested(tok):
            inner = self.condition(self.parse_not())
        return Not(inner, pos=(tok.line, tok.column))


# ---------------------------------------------------------------------------------------------
# Printing


def print_boolean(
    node: And[Any] | Or[Any] | Not[Any],
    show: Callable[[Any], str],
    *,
    not_prefix: str,
    grouped: Callable[[Any], bool],
) -> str:
    """The text of and, or and not: `show` prints an operand, `grouped(operand)` says whether
    it needs parentheses under not (and and/or inside and/or always get them, so that the
    text reads one way only)."""
    if isinstance(node, Not):
        inner = show(node.item)
        return not_prefix + (f"({inner})" if grouped(node.item) else inner)
    word = " and " if isinstance(node, And) else " or "
    parts = []
    for item in node.items:
        text = show(item)
        parts.append(f"({text})" if isinstance(item, And | Or) else text)
    return word.join(parts)


def print_literal(value: Scalar, quote: Callable[[str], str]) -> str:
    """The text of a literal: null, true and false as words, a string as `quote` writes it in
    its language, a number as Python writes it (which both lexers read back)."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, str):
        return quote(value)
    return repr(value)
