"""The trigger language's parser (pure): efd/languages/triggers/lexer.py's tokens to
efd/languages/triggers/tree.py's tree, on efd/languages/toolkit.py's parser base.

The grammar is what Segment's parser reads one way only: tests joined by and or by or, one
level of parentheses, and `!` only in front of contains() and match(). Segment's parser
takes more and reads it loosely (`a and b or c` as one or of three, `not a` as a, a test of
an unknown field as nothing); each of those is an error here, saying what to write.
"""

from __future__ import annotations

import re
from typing import Final

from efd.jsonjs import js_number
from efd.languages import toolkit
from efd.languages.toolkit import And, Not, Or, Token, value_after
from efd.languages.triggers.lexer import CONNECTIVES, Lexer
from efd.languages.triggers.tree import (
    OBJECT_FIELDS,
    TOP_FIELDS,
    Condition,
    Field,
    FieldKind,
    Operator,
    Trigger,
    TriggerError,
)

__all__ = ["parse"]

FUNCTIONS: Final = frozenset({"contains", "match"})
_COMPARISONS: Final = frozenset({"=", "!=", "<", "<=", ">", ">="})
_NUMBER_COMPARISONS: Final = frozenset({"<", "<=", ">", ">="})
_CONSTANTS: Final = frozenset({"true", "false", "null"})
FUNCTION_OPERATORS: Final[frozenset[Operator]] = frozenset(
    {"contains", "not_contains", "starts_with", "not_starts_with", "ends_with", "not_ends_with"}
)
_FIELDS: Final[dict[str, FieldKind]] = {kind: kind for kind in TOP_FIELDS + OBJECT_FIELDS}
_FIELD_LIST: Final = "type, event, name, userId, or a path in properties, traits or context"
# How Segment's evaluator cuts a property name into the keys it walks.
_PATH_SEPARATORS: Final = re.compile(r"[.\[\]]+")

MIXED: Final = (
    "'and' and 'or' cannot be mixed without parentheses (Segment would apply one of them to "
    "every condition); group them, e.g. (a and b) or c"
)
NESTED: Final = "parentheses cannot be nested in a trigger: Segment reads one level"
NEGATION: Final = (
    "'!' negates only contains() and match(), written right before them, e.g. "
    '!contains(event, "test"); to negate a comparison, use != (or = instead of !=)'
)
NOT_WORD: Final = (
    "'not' is not trigger syntax; negate with !contains(...) or !match(...), or compare with !="
)
CALL_IN_GROUP: Final = (
    "inside parentheses, contains() and match() must come last: Segment's parser ends the "
    "group at their ')'; move the call to the end of the group, or out of it"
)
MATCH_PATTERN: Final = (
    "match() takes a pattern with one '*', at its start or its end: \"prefix*\" or "
    '"*suffix"; for text anywhere inside, use contains()'
)


def parse(text: str) -> Trigger:
    """Parse a trigger into its tree; TriggerError naming the position otherwise."""
    parser = _Parser(Lexer(text))
    parser.expect_start()
    node = parser.trigger()
    parser.expect_end()
    return node


class _Parser(toolkit.Parser[Trigger, Trigger]):
    error = TriggerError

    def __init__(self, lexer: Lexer) -> None:
        super().__init__(lexer)
        # The and / or nodes written in parentheses, by identity: the others must not sit
        # inside the other connective.
        self.grouped: set[int] = set()

    # -- the hooks of the toolkit's loops

    def at_not(self) -> bool:
        return False

    def condition(self, node: Trigger | Not[Trigger]) -> Trigger:
        # The loops hand over each operand of an and or an or: one that is itself the other
        # connective, and not in parentheses, mixes the two.
        if isinstance(node, Not):  # the loops make none: at_not() is never true
            self.fail_at(NEGATION, node)
        if isinstance(node, And | Or) and id(node) not in self.grouped:
            self.fail_at(MIXED, node)
        return node

    def trigger(self) -> Trigger:
        """An and / or chain, as the toolkit's loops read it."""
        node = self.parse_or()
        if isinstance(node, Not):
            self.fail_at(NEGATION, node)
        return node

    def describe_name(self, tok: Token) -> str:
        if tok.word in CONNECTIVES or tok.word in _CONSTANTS or tok.word in FUNCTIONS:
            return f"'{tok.word}'"
        return f"the field {tok.text}"

    def hint(self) -> str:
        tok = self.peek()
        word = tok.word
        if word is None:
            return ""
        lower = word.lower()
        if lower != word and lower in CONNECTIVES | _CONSTANTS:
            return f"; write it in lower case: {lower}"
        if word == "not":
            return f"; {NOT_WORD}"
        behind = self.behind()
        ends_condition = behind is not None and (
            behind.kind in ("str", "num") or behind.word in _CONSTANTS or behind.value == ")"
        )
        if tok.kind == "name" and ends_condition:
            return "; join conditions with 'and' or 'or'"
        return ""

    # -- a test

    def comparison(self) -> Trigger:
        tok = self.peek()
        if tok.kind == "op" and tok.value == "(":
            return self.group(tok)
        if tok.kind == "op" and tok.value == "!":
            nxt = self.ahead(1)
            adjacent = nxt.line == tok.line and nxt.column == tok.column + 1
            if nxt.word in FUNCTIONS and adjacent:
                self.advance()
                return self.function(negate=True, start=tok)
            self.fail(NEGATION, tok)
        if tok.kind != "name":
            self.fail(f'expected a condition, e.g. type = "track", {self.found()}')
        if tok.word in FUNCTIONS:
            return self.function(negate=False, start=tok)
        if tok.word == "not":
            self.fail(NOT_WORD, tok)
        if tok.word in CONNECTIVES:
            self.fail(f"expected a condition before '{tok.word}'", tok)
        field = self.field()
        op_tok = self.peek()
        if op_tok.kind != "op" or op_tok.value not in _COMPARISONS:
            hint = ""
            if op_tok.word in FUNCTIONS:
                hint = f'; {op_tok.word} is a function: {op_tok.word}({tok.text}, "text")'
            self.fail(
                f"expected an operator (=, !=, <, <=, >, >=) after {tok.text}, {self.found()}{hint}"
            )
        self.advance()
        op = str(op_tok.value)
        return self.condition_of(field, op, self.value(op), tok)

    def group(self, tok: Token) -> Trigger:
        if self.depth:
            self.fail(NESTED, tok)
        self.advance()
        with self.nested(tok):
            if self.is_op(")"):
                self.fail("expected a condition inside the parentheses", self.peek())
            inner = self.trigger()
        self.expect_close(tok)
        if isinstance(inner, And | Or):
            for item in inner.items[:-1]:
                if isinstance(item, Condition) and item.op in FUNCTION_OPERATORS:
                    self.fail_at(CALL_IN_GROUP, item)
            self.grouped.add(id(inner))
        return inner

    def field(self) -> Field:
        tok = self.advance()
        assert isinstance(tok.value, tuple)
        head, rest = tok.value[0], tok.value[1:]
        kind = _FIELDS.get(head)
        if kind is None:
            close = [k for k in _FIELDS if k.lower() == head.lower()]
            hint = f"; did you mean {close[0]}?" if close else ""
            self.fail(f"unknown field {tok.text}: a trigger tests {_FIELD_LIST}{hint}", tok)
        pos = (tok.line, tok.column)
        if kind in TOP_FIELDS:
            if rest:
                self.fail(f'{kind} has no fields; compare it: {kind} = "..."', tok)
            return Field(kind, pos=pos)
        path = tuple(p for p in _PATH_SEPARATORS.split(".".join(rest)) if p)
        if not rest:
            self.fail(f"expected a path in {kind}, e.g. {kind}.total", tok)
        if not path:
            self.fail(f"the field {tok.text} names no key in {kind}", tok)
        return Field(kind, path, pos=pos)

    def value(self, op: str) -> Token:
        tok = self.peek()
        if tok.kind == "end":
            self.fail(value_after(op))
        if op in _NUMBER_COMPARISONS and tok.kind != "num":
            self.fail(f"'{op}' compares numbers: expected a number, {self.found()}")
        if tok.kind == "name" and tok.word not in _CONSTANTS:
            if tok.word is not None and tok.word.lower() in _CONSTANTS:
                self.fail(f"expected a value, {self.found()}")
            self.fail(
                "expected a value (a string in double quotes, a number, true, false or null), "
                f'{self.found()}; to compare with the text, write "{tok.text}"'
            )
        if tok.kind == "op":
            self.fail(f"expected a value after '{op}', {self.found()}")
        return self.advance()

    def condition_of(self, field: Field, op: str, value: Token, start: Token) -> Condition:
        """The test as Segment's evaluator applies it: its operator picked from the field,
        the operator and the value as Segment's parser picks it."""
        pos = (start.line, start.column)
        word = value.word if value.kind == "name" else None
        if op in _NUMBER_COMPARISONS:
            return Condition(field, _op(op), _number(value), pos=pos)
        if field.kind != "type" and field.kind != "event" and word == "null":
            return Condition(field, "exists" if op == "!=" else "not_exists", pos=pos)
        if field.kind not in ("type", "event", "name") and op == "=" and word in ("true", "false"):
            return Condition(field, "is_true" if word == "true" else "is_false", pos=pos)
        if field.kind in OBJECT_FIELDS and value.kind == "num":
            number_op: Operator = "number_equals" if op == "=" else "number_not_equals"
            return Condition(field, number_op, _number(value), pos=pos)
        return Condition(field, _op(op), _text(value), pos=pos)

    def function(self, *, negate: bool, start: Token) -> Condition:
        name_tok = self.advance()
        name = str(name_tok.word)
        usage = f'{name}(event, "text")' if name == "contains" else f'{name}(event, "Order*")'
        if not self.is_op("("):
            self.fail(f"{name} is a function: expected '(' after it, e.g. {usage}")
        self.advance()
        if self.peek().kind != "name":
            self.fail(f"expected a field as the first argument of {name}(), {self.found()}")
        field_tok = self.peek()
        field = self.field()
        if field.kind == "type":
            self.fail(f'{name}() cannot test type; compare it instead: type = "track"', field_tok)
        self.expect_op(",", f"expected ',' after the first argument of {name}()")
        arg = self.peek()
        if arg.kind != "str":
            self.fail(f"the second argument of {name}() is text in double quotes, {self.found()}")
        self.advance()
        self.expect_op(")", f"expected ')' after the second argument of {name}()")
        text = str(arg.value)
        pos = (start.line, start.column)
        if name == "contains":
            return Condition(field, "not_contains" if negate else "contains", text, pos=pos)
        if text.count("*") != 1 or not (text.startswith("*") or text.endswith("*")):
            self.fail(MATCH_PATTERN, arg)
        if text.endswith("*"):
            return Condition(
                field, "not_starts_with" if negate else "starts_with", text[:-1], pos=pos
            )
        return Condition(field, "not_ends_with" if negate else "ends_with", text[1:], pos=pos)


_SPELLED: Final[dict[str, Operator]] = {o: o for o in ("=", "!=", "<", "<=", ">", ">=")}


def _op(op: str) -> Operator:
    return _SPELLED[op]


def _number(tok: Token) -> float:
    assert isinstance(tok.value, int | float)
    return float(tok.value)


def _text(tok: Token) -> str:
    """A value as Segment's parser turns it into text: numbers as JavaScript prints them."""
    if tok.kind == "num":
        return js_number(_number(tok))
    return str(tok.value if tok.kind == "str" else tok.word)
