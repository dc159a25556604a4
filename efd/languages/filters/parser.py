"""FQL's parser (pure): efd/languages/filters/lexer.py's tokens to efd/languages/filters/tree.py's
tree, on efd/languages/toolkit.py's parser base.

The reference is docs/filters.md. Nothing in the text is ever executed. The parser also checks
what it can see without a message: a condition must be able to yield true or false, `<` and
its kin compare numbers, functions get the arguments they take, a literal glob pattern is well
formed.
"""

from __future__ import annotations

import re
from typing import Final

from efd.languages import toolkit
from efd.languages.filters.lexer import KEYWORDS, Lexer
from efd.languages.filters.printer import to_fql
from efd.languages.filters.tree import (
    FUNCTIONS,
    Call,
    Compare,
    CompareOp,
    FqlError,
    In,
    ListExpr,
    Literal,
    Node,
    Path,
    Scalar,
    compile_glob,
    describe_kinds,
    kinds_of,
)
from efd.languages.toolkit import Token

__all__ = ["parse"]

_COMPARE: Final[dict[str, CompareOp]] = {
    "=": "=",
    "!=": "!=",
    "<": "<",
    "<=": "<=",
    ">": ">",
    ">=": ">=",
}
_CONSTANTS: Final[dict[str, Scalar]] = {"true": True, "false": False, "null": None}
_FUNCTION_LIST: Final = ", ".join(f"{name}()" for name in FUNCTIONS)
_GLOB_CHARS: Final = re.compile(r"[*?\[]")
_LONE_BACKSLASH: Final = (
    "match(): the pattern ends with a lone '\\': in an FQL string '\\\\' is one backslash, "
    "so a pattern that matches a backslash is written '\\\\\\\\'"
)


def parse(text: str, *, condition: bool = True) -> Node:
    """Parse an FQL condition into its tree; FqlError naming the position otherwise.
    `condition=False` accepts any expression, e.g. lowercase(event) (for tests and tools)."""
    parser = _Parser(Lexer(text))
    parser.expect_start()
    node = parser.parse_or()
    if condition:
        parser.condition(node)
    parser.expect_end()
    return node


class _Parser(toolkit.Parser[Node, Node]):
    error = FqlError

    def at_not(self) -> bool:
        return self.is_op("!") or self.is_word("not")

    def describe_name(self, tok: Token) -> str:
        if tok.word in KEYWORDS:
            return f"'{tok.word}'"
        return f"the field {tok.text}"

    def hint(self) -> str:
        tok = self.peek()
        if tok.word is not None and tok.word.lower() in KEYWORDS and tok.word not in KEYWORDS:
            return f" (keywords are lower case: {tok.word.lower()})"
        if tok.word == "not" and self.ahead(1).word == "in":
            return "; to test that a value is not in a list, write !(x in [...])"
        before = self.behind()
        if tok.kind == "name" and tok.word not in KEYWORDS and before and before.kind == "name":
            return "; is a text missing its quotes? e.g. event = 'Order Completed'"
        return ""

    # -- type checks

    def condition(self, node: Node) -> Node:
        """`node` stands where true or false is needed: refuse what can never be either."""
        kinds = kinds_of(node)
        if "any" in kinds or "bool" in kinds:
            return node
        self.fail_at(
            toolkit.need_condition(describe_kinds(kinds), "properties.total > 100"),
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

    # -- grammar below not: comparison, operand

    def comparison_op(self) -> str | None:
        tok = self.peek()
        if tok.kind == "op" and isinstance(tok.value, str) and tok.value in _COMPARE:
            return tok.value
        if tok.word == "in":
            return "in"
        return None

    def comparison(self) -> Node:
        left = self.operand()
        op = self.comparison_op()
        if op is None:
            return left
        self.advance()
        if self.peek().kind == "end":
            self.fail(toolkit.value_after(op))
        right = self.operand()
        if self.comparison_op() is not None:
            self.fail(toolkit.CHAINED)
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

    def operand(self) -> Node:
        tok = self.peek()
        pos = (tok.line, tok.column)
        if self.is_op("("):
            self.advance()
            with self.nested(tok):
                inner = self.parse_or()
                self.expect_close(tok)
            return inner
        if self.is_op("["):
            self.advance()
            with self.nested(tok):
                items = self.items("]", "a list")
            return ListExpr(items, pos=pos)
        if tok.kind == "str" or tok.kind == "num":
            self.advance()
            assert isinstance(tok.value, str | int | float)
            return Literal(tok.value, pos=pos)
        if tok.kind == "name":
            return self.name(tok)
        if tok.kind == "end":
            self.fail(toolkit.UNEXPECTED_END)
        if tok.kind == "op" and tok.value in _COMPARE:
            self.fail(f"expected a value before '{tok.value}', e.g. event = 'Order Completed'")
        self.fail(toolkit.value_or_condition(self.describe(tok)))

    def name(self, tok: Token) -> Node:
        pos = (tok.line, tok.column)
        word = tok.word
        self.advance()
        is_call = self.is_op("(")
        if word is not None and word in _CONSTANTS and not is_call:
            return Literal(_CONSTANTS[word], pos=pos)
        if word is not None and word in KEYWORDS:
            self.fail(toolkit.value_or_condition(f"'{word}'"), tok)
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
        with self.nested(open_tok):
            args = self.items(")", f"the arguments of {word}()")
        call = Call(word, args, pos=pos)  # type: ignore[arg-type]  # checked: word in FUNCTIONS
        self.check_call(call, tok)
        return call

    def items(self, close: str, what: str) -> tuple[Node, ...]:
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
            self.expect_op(close, f"expected ',' or '{close}' in {what}")
            return tuple(items)

    # -- functions

    def check_call(self, call: Call, tok: Token) -> None:
        signature = FUNCTIONS[call.name]
        want = len(signature.args)
        if len(call.args) != want:
            plural = "argument" if want == 1 else "arguments"
            self.fail(f"{call.name}() takes {want} {plural}, given {len(call.args)}", tok)
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
