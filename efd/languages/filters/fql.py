"""Lexer, parser and printer of FQL, Segment's Filter Query Language (pure: no I/O); the tree
it parses into is efd/languages/filters/tree.py's.

The reference is docs/filters.md. Text is parsed into an immutable tree; nothing in it is ever
executed. The parser also checks what it can see without a message: a condition must be able
to yield true or false, `<` and its kin compare numbers, functions get the arguments they take,
a literal glob pattern is well formed. `to_fql` prints a tree back as text that parses to the
same tree.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from typing import Final, NoReturn
from typing import Literal as Lit

from efd import jsonjs
from efd.languages.filters.tree import (
    FUNCTIONS,
    And,
    Call,
    Compare,
    CompareOp,
    FqlError,
    In,
    ListExpr,
    Literal,
    Node,
    Not,
    Or,
    Path,
    Scalar,
    compile_glob,
    describe_kinds,
    kinds_of,
)

__all__ = [
    "FUNCTIONS",
    "And",
    "Call",
    "Compare",
    "FqlError",
    "In",
    "ListExpr",
    "Literal",
    "Node",
    "Not",
    "Or",
    "Path",
    "compile_glob",
    "parse",
    "to_fql",
]

# Guards the recursive-descent parser against pathological nesting (RecursionError).
MAX_DEPTH: Final = 64


# ---------------------------------------------------------------------------------------------
# Lexer


@dataclass(frozen=True, slots=True)
class _Token:
    kind: Lit["str", "num", "path", "op", "end"]
    value: str | int | float | tuple[str, ...]
    text: str  # the source spelling, for messages
    line: int
    column: int
    # A path of one segment written without escapes: a keyword or function name when it is one.
    word: str | None = None


_DIGITS_SET: Final = frozenset("0123456789")
_NUMBER: Final = re.compile(r"-?[0-9]+(\.[0-9]+)?([eE][+-]?[0-9]+)?")
# Segment's field names: a-z A-Z 0-9 _ -, anything else escaped with a backslash.
_NAME_CHARS: Final = frozenset("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789_-")
_NAME_START: Final = frozenset("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ_")
_OPERATORS: Final = ("!=", "<=", ">=", "=", "<", ">", "!", "(", ")", "[", "]", ",")
_WRONG_OPERATORS: Final = {
    "==": "'==' is not FQL; write '='",
    "&&": "'&&' is not FQL; write 'and'",
    "||": "'||' is not FQL; write 'or'",
    "&": "'&' is not FQL; write 'and'",
    "|": "'|' is not FQL; write 'or'",
}


_NAME_RUN: Final = re.compile(r"[A-Za-z0-9_-]*")
# What may follow a '.' and is no name: the operators, quotes and the dot itself.
_NOT_NAMES: Final = frozenset("=!<>()[],'\"&|.")


def _escapable(c: str) -> bool:
    return c.isprintable() and not c.isspace() and c not in _NOT_NAMES


def _escape_hint(c: str) -> str:
    return f"unexpected character {c!r}; in a field name, escape it with a backslash (\\{c})"


def _number_value(raw: str, *, whole: bool) -> int | float | None:
    """A number literal's value; None past a double's range."""
    if whole:
        return jsonjs.whole_number(raw)
    value = float(raw)
    return value if math.isfinite(value) else None


class _Lexer:
    def __init__(self, text: str) -> None:
        self.text = text
        self.i = 0
        self.line = 1
        self.line_start = 0

    def column(self, index: int) -> int:
        return index - self.line_start + 1

    def fail(self, message: str, index: int) -> NoReturn:
        raise FqlError(message, self.line, self.column(index))

    def tokens(self) -> list[_Token]:
        text, out = self.text, []
        n = len(text)
        while True:
            while self.i < n and text[self.i].isspace():
                if text[self.i] == "\n":
                    self.line_start = self.i + 1
                    self.line += 1
                self.i += 1
            if self.i >= n:
                out.append(_Token("end", "", "", self.line, self.column(self.i)))
                return out
            out.append(self.token())

    def token(self) -> _Token:
        text, i = self.text, self.i
        c = text[i]
        line, col = self.line, self.column(i)
        if c in "'\"":
            value = self.string()
            return _Token("str", value, text[i : self.i], line, col)
        if c in _DIGITS_SET or (c == "-" and text[i + 1 : i + 2] in _DIGITS_SET):
            m = _NUMBER.match(text, i)
            assert m is not None
            raw = m.group()
            whole = m.group(1) is None and m.group(2) is None
            if whole and text[m.end() : m.end() + 1] in _NAME_START:
                word = raw + _NAME_RUN.match(text, m.end()).group()  # type: ignore[union-attr]
                first = "a digit" if c != "-" else "'-'"
                self.fail(
                    f"'{word}' is not a number; to name a field that starts with {first}, "
                    f"escape its first character: \\{word}",
                    i,
                )
            num = _number_value(raw, whole=whole)
            if num is None:
                self.fail(
                    f"the number {jsonjs.number_spelling(raw)} is out of range: "
                    f"{jsonjs.OUT_OF_RANGE}",
                    i,
                )
            self.i = m.end()
            return _Token("num", num, raw, line, col)
        if c in _NAME_START or c == "\\":
            segments, plain = self.path()
            raw = text[i : self.i]
            word = segments[0] if plain and len(segments) == 1 else None
            return _Token("path", segments, raw, line, col, word)
        for wrong, hint in _WRONG_OPERATORS.items():
            if text.startswith(wrong, i):
                self.fail(hint, i)
        for op in _OPERATORS:
            if text.startswith(op, i):
                self.i += len(op)
                return _Token("op", op, op, line, col)
        if c in _NAME_CHARS:  # a digit or '-' not starting a number
            self.fail(f"unexpected {c!r}; a field name starts with a letter or '_'", i)
        if c == ".":
            self.fail("unexpected '.'; a field path starts with a name, e.g. context.page.url", i)
        if c.isprintable() and not c.isspace():
            self.fail(_escape_hint(c), i)
        self.fail(f"unexpected character {c!r}", i)

    def string(self) -> str:
        """Read a quoted string. A backslash before the quote, the other quote or a backslash
        stands for that character; any other backslash is kept, so that match() patterns
        such as 'ab\\*d' reach the glob as written."""
        text, start = self.text, self.i
        quote = text[start]
        out: list[str] = []
        j = start + 1
        start_line, start_col = self.line, self.column(start)
        while True:
            if j >= len(text):
                raise FqlError(
                    f"unterminated string: the {quote} opened here is never closed",
                    start_line,
                    start_col,
                )
            ch = text[j]
            if ch == quote:
                self.i = j + 1
                return "".join(out)
            if ch == "\\" and text[j + 1 : j + 2] in ("'", '"', "\\"):
                out.append(text[j + 1])
                j += 2
                continue
            if ch == "\n":
                self.line += 1
                self.line_start = j + 1
            out.append(ch)
            j += 1

    def path(self) -> tuple[tuple[str, ...], bool]:
        """Read a dotted field path; return its segments and whether it had no escapes."""
        text, n = self.text, len(self.text)
        segments: list[str] = []
        plain = True
        while True:
            chars: list[str] = []
            while self.i < n:
                c = text[self.i]
                if c == "\\":
                    if self.i + 1 >= n:
                        self.fail("a '\\' in a field name must be followed by a character", self.i)
                    chars.append(text[self.i + 1])
                    plain = False
                    self.i += 2
                    if chars[-1] == "\n":
                        self.line += 1
                        self.line_start = self.i
                elif c in _NAME_CHARS:
                    chars.append(c)
                    self.i += 1
                else:
                    break
            segments.append("".join(chars))
            if self.i < n and text[self.i] == ".":
                nxt = text[self.i + 1 : self.i + 2]
                if not nxt or (nxt not in _NAME_CHARS and nxt != "\\"):
                    if _escapable(nxt):
                        self.fail(_escape_hint(nxt), self.i + 1)
                    self.fail("expected a field name after '.'", self.i + 1)
                self.i += 1
                continue
            return tuple(segments), plain


# ---------------------------------------------------------------------------------------------
# Parser: recursive descent. Loosest first: or, and, not (! or not), comparison, operand.

_COMPARE: Final[dict[str, CompareOp]] = {
    "=": "=",
    "!=": "!=",
    "<": "<",
    "<=": "<=",
    ">": ">",
    ">=": ">=",
}
_KEYWORDS: Final = frozenset({"and", "or", "not", "in", "true", "false", "null"})
_CONSTANTS: Final[dict[str, Scalar]] = {"true": True, "false": False, "null": None}
_FUNCTION_LIST: Final = ", ".join(f"{name}()" for name in FUNCTIONS)


def _describe(tok: _Token) -> str:
    if tok.kind == "end":
        return "the end of the expression"
    if tok.kind == "str":
        return f"the string {tok.text}"
    if tok.kind == "num":
        return f"the number {tok.text}"
    if tok.kind == "path":
        if tok.word in _KEYWORDS:
            return f"'{tok.word}'"
        return f"the field {tok.text}"
    return f"'{tok.value}'"


class _Parser:
    def __init__(self, text: str) -> None:
        self.tokens = _Lexer(text).tokens()
        self.i = 0
        self.depth = 0

    # -- token helpers

    def peek(self) -> _Token:
        return self.tokens[self.i]

    def advance(self) -> _Token:
        tok = self.tokens[self.i]
        if tok.kind != "end":
            self.i += 1
        return tok

    def is_op(self, op: str) -> bool:
        tok = self.peek()
        return tok.kind == "op" and tok.value == op

    def is_word(self, word: str) -> bool:
        return self.peek().word == word

    def fail(self, message: str, tok: _Token | None = None) -> NoReturn:
        tok = tok or self.peek()
        raise FqlError(message, tok.line, tok.column)

    def fail_at(self, message: str, node: Node) -> NoReturn:
        raise FqlError(message, node.pos[0], node.pos[1])

    def nest(self, tok: _Token) -> None:
        self.depth += 1
        if self.depth > MAX_DEPTH:
            self.fail(f"the expression is nested more than {MAX_DEPTH} levels deep", tok)

    def keyword_hint(self) -> str:
        tok = self.peek()
        if tok.word is not None and tok.word.lower() in _KEYWORDS and tok.word not in _KEYWORDS:
            return f" (keywords are lower case: {tok.word.lower()})"
        if tok.word == "not" and self.tokens[self.i + 1].word == "in":
            return "; to test that a value is not in a list, write !(x in [...])"
        if (
            tok.kind == "path"
            and tok.word not in _KEYWORDS
            and self.tokens[self.i - 1].kind == "path"
        ):
            return "; is a text missing its quotes? e.g. event = 'Order Completed'"
        return ""

    # -- type checks

    def condition(self, node: Node) -> Node:
        """`node` stands where true or false is needed: refuse what can never be either."""
        kinds = kinds_of(node)
        if "any" in kinds or "bool" in kinds:
            return node
        self.fail_at(
            f"expected a condition (true or false), found {describe_kinds(kinds)}; "
            "compare it, e.g. properties.total > 100",
            node,
        )

    def numeric(self, node: Node, op: str) -> None:
        kinds = kinds_of(node)
        if "any" in kinds or "number" in kinds:
            return
        hint = ""
        if isinstance(node, Literal) and isinstance(node.value, str):
            hint = "; to compare a number written as a string, convert it with number()"
        self.fail_at(f"'{op}' compares numbers, but this is {describe_kinds(kinds)}{hint}", node)

    # -- grammar

    def parse(self, condition: bool) -> Node:
        if self.peek().kind == "end":
            self.fail("the expression is empty")
        node = self.parse_or()
        if condition:
            self.condition(node)
        if self.peek().kind != "end":
            self.fail(
                "expected 'and', 'or' or the end of the expression, "
                f"found {_describe(self.peek())}{self.keyword_hint()}"
            )
        return node

    def parse_or(self) -> Node:
        first = self.parse_and()
        if not self.is_word("or"):
            return first
        items = [self.condition(first)]
        while self.is_word("or"):
            self.advance()
            items.append(self.condition(self.parse_and()))
        return Or(tuple(items), pos=first.pos)

    def parse_and(self) -> Node:
        first = self.parse_not()
        if not self.is_word("and"):
            return first
        items = [self.condition(first)]
        while self.is_word("and"):
            self.advance()
            items.append(self.condition(self.parse_not()))
        return And(tuple(items), pos=first.pos)

    def parse_not(self) -> Node:
        tok = self.peek()
        if not (self.is_op("!") or tok.word == "not"):
            return self.parse_comparison()
        self.advance()
        self.nest(tok)
        inner = self.condition(self.parse_not())
        self.depth -= 1
        return Not(inner, pos=(tok.line, tok.column))

    def comparison_op(self) -> str | None:
        tok = self.peek()
        if tok.kind == "op" and isinstance(tok.value, str) and tok.value in _COMPARE:
            return tok.value
        if tok.word == "in":
            return "in"
        return None

    def parse_comparison(self) -> Node:
        left = self.parse_operand()
        op = self.comparison_op()
        if op is None:
            return left
        self.advance()
        if self.peek().kind == "end":
            self.fail(f"expected a value after '{op}', found the end of the expression")
        right = self.parse_operand()
        if self.comparison_op() is not None:
            self.fail("comparisons cannot be chained; combine them with 'and'")
        pos = left.pos
        if op == "in":
            kinds = kinds_of(right)
            if "any" not in kinds and "list" not in kinds:
                self.fail_at(
                    f"'in' looks in a list, e.g. type in ['track', 'page'], "
                    f"but this is {describe_kinds(kinds)}",
                    right,
                )
            return In(left, right, pos=pos)
        if op in ("<", "<=", ">", ">="):
            self.numeric(left, op)
            self.numeric(right, op)
        return Compare(_COMPARE[op], left, right, pos=pos)

    def parse_operand(self) -> Node:
        tok = self.peek()
        pos = (tok.line, tok.column)
        if tok.kind == "op" and tok.value == "(":
            self.advance()
            self.nest(tok)
            inner = self.parse_or()
            self.expect_close(")", f"')' to close the '(' at line {tok.line}, column {tok.column}")
            self.depth -= 1
            return inner
        if tok.kind == "op" and tok.value == "[":
            self.advance()
            self.nest(tok)
            items = self.parse_items("]", "a list")
            self.depth -= 1
            return ListExpr(items, pos=pos)
        if tok.kind == "str" or tok.kind == "num":
            self.advance()
            assert isinstance(tok.value, str | int | float)
            return Literal(tok.value, pos=pos)
        if tok.kind == "path":
            return self.parse_name(tok)
        if tok.kind == "end":
            self.fail("unexpected end of the expression; expected a value or a condition")
        if tok.kind == "op" and tok.value in _COMPARE:
            self.fail(f"expected a value before '{tok.value}', e.g. event = 'Order Completed'")
        self.fail(f"expected a value or a condition, found {_describe(tok)}")

    def parse_name(self, tok: _Token) -> Node:
        pos = (tok.line, tok.column)
        word = tok.word
        self.advance()
        is_call = self.is_op("(")
        if word is not None and word in _CONSTANTS and not is_call:
            return Literal(_CONSTANTS[word], pos=pos)
        if word is not None and word in _KEYWORDS:
            self.fail(f"expected a value or a condition, found '{word}'", tok)
        if not is_call:
            assert isinstance(tok.value, tuple)
            return Path(tok.value, pos=pos)
        if word is None:
            self.fail(f"{tok.text} is not a function; the functions are {_FUNCTION_LIST}", tok)
        if word not in FUNCTIONS:
            hint = ""
            if word.lower() in FUNCTIONS:
                hint = f" (function names are lower case: {word.lower()}())"
            self.fail(f"unknown function {word}(){hint}; the functions are {_FUNCTION_LIST}", tok)
        open_tok = self.advance()
        self.nest(open_tok)
        args = self.parse_items(")", f"the arguments of {word}()")
        self.depth -= 1
        call = Call(word, args, pos=pos)  # type: ignore[arg-type]  # checked: word in FUNCTIONS
        self.check_call(call, tok)
        return call

    def parse_items(self, close: str, what: str) -> tuple[Node, ...]:
        """Comma-separated expressions up to `close`; the opening bracket is consumed."""
        items: list[Node] = []
        if self.is_op(close):
            self.advance()
            return ()
        while True:
            items.append(self.parse_or())
            if self.is_op(","):
                self.advance()
                if self.is_op(close):
                    self.fail(f"expected a value after ',' in {what}")
                continue
            self.expect_close(close, f"',' or '{close}' in {what}")
            return tuple(items)

    def expect_close(self, close: str, expected: str) -> None:
        if not self.is_op(close):
            self.fail(f"expected {expected}, found {_describe(self.peek())}{self.keyword_hint()}")
        self.advance()

    def check_call(self, call: Call, tok: _Token) -> None:
        signature = FUNCTIONS[call.name]
        want = len(signature.args)
        if len(call.args) != want:
            plural = "argument" if want == 1 else "arguments"
            self.fail(
                f"{call.name}() takes {want} {plural}, given {len(call.args)}",
                tok,
            )
        for number, (arg, allowed) in enumerate(zip(call.args, signature.args, strict=True), 1):
            kinds = kinds_of(arg)
            if "any" in kinds or kinds & allowed:
                continue
            self.fail_at(
                f"argument {number} of {call.name}() must be {describe_kinds(allowed)}, "
                f"found {describe_kinds(kinds)}",
                arg,
            )
        if call.name == "match":
            self.check_match(call)

    def check_match(self, call: Call) -> None:
        text, pattern = call.args
        if (
            isinstance(text, Literal)
            and isinstance(text.value, str)
            and not isinstance(pattern, Literal)
            and _GLOB_CHARS.search(text.value)
        ):
            # The order Segment's examples swap at times: the text is matched against the
            # message's field as a pattern, false whatever the field holds.
            swapped = Call("match", (pattern, text))
            self.fail_at(
                "match() takes the text first and the pattern second; this looks like the "
                f"pattern: write {to_fql(swapped)}",
                text,
            )
        if isinstance(pattern, Literal) and isinstance(pattern.value, str):
            try:
                compile_glob(pattern.value)
            except ValueError as error:
                trailing = len(pattern.value) - len(pattern.value.rstrip("\\"))
                if trailing % 2:
                    # The string's own escapes took one backslash level already.
                    self.fail_at(_LONE_BACKSLASH, pattern)
                self.fail_at(f"match(): {error}", pattern)


_GLOB_CHARS: Final = re.compile(r"[*?\[]")
_LONE_BACKSLASH: Final = (
    "match(): the pattern ends with a lone '\\': in an FQL string '\\\\' is one backslash, "
    "so a pattern that matches a backslash is written '\\\\\\\\'"
)


def parse(text: str, *, condition: bool = True) -> Node:
    """Parse an FQL condition into its tree; FqlError naming the position otherwise.
    `condition=False` accepts any expression, e.g. lowercase(event) (for tests and tools)."""
    return _Parser(text).parse(condition)


# ---------------------------------------------------------------------------------------------
# Printer


def _quote(value: str) -> str:
    return '"' + value.replace("\\", "\\\\").replace('"', '\\"') + '"'


def _segment(name: str, first: bool) -> str:
    out = []
    for index, ch in enumerate(name):
        needs = ch not in _NAME_CHARS or (first and index == 0 and ch not in _NAME_START)
        out.append("\\" + ch if needs else ch)
    text = "".join(out)
    if first and name in _KEYWORDS:
        text = "\\" + text  # a field named like a keyword: escaped, it is a name again
    return text


def _number(value: int | float) -> str:
    return repr(value)


def to_fql(node: Node) -> str:
    """The text of `node`: parsing it gives `node` back."""
    if isinstance(node, Literal):
        value = node.value
        if value is None:
            return "null"
        if isinstance(value, bool):
            return "true" if value else "false"
        if isinstance(value, str):
            return _quote(value)
        return _number(value)
    if isinstance(node, Path):
        return ".".join(_segment(s, i == 0) for i, s in enumerate(node.segments))
    if isinstance(node, ListExpr):
        return "[" + ", ".join(to_fql(item) for item in node.items) + "]"
    if isinstance(node, Call):
        return f"{node.name}(" + ", ".join(to_fql(arg) for arg in node.args) + ")"
    if isinstance(node, Compare):
        return f"{_operand(node.left)} {node.op} {_operand(node.right)}"
    if isinstance(node, In):
        return f"{_operand(node.item)} in {_operand(node.collection)}"
    if isinstance(node, Not):
        return "!" + _operand(node.item)
    word = " and " if isinstance(node, And) else " or "
    return word.join(_operand(item, _GROUPS) for item in node.items)


_OPERATIONS: Final = (Compare, In, Not, And, Or)
_GROUPS: Final = (And, Or)


def _operand(node: Node, wrap: tuple[type, ...] = _OPERATIONS) -> str:
    """An operand of an operator, in parentheses when it is itself an operation that would
    otherwise bind differently (or, for and/or inside each other, read ambiguously)."""
    text = to_fql(node)
    return f"({text})" if isinstance(node, wrap) else text
