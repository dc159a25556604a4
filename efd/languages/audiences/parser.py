"""The audience language's parser (pure): efd's subset of Segment's audience query language,
from efd/languages/audiences/lexer.py's tokens to efd/languages/audiences/tree.py's tree, on
efd/languages/toolkit.py's parser base.

The reference is docs/audience-language.md. Text is parsed into an immutable AST; nothing in the
text is ever executed. `parse_condition` and `parse_expression` also check the result type:
an audience condition must be true/false, a computed trait must be an aggregate.
"""

from __future__ import annotations

from typing import Final
from typing import Literal as Lit

from efd.languages import toolkit
from efd.languages.audiences.lexer import Lexer
from efd.languages.audiences.tree import (
    BOOL_TYPES,
    VALUE_TYPES,
    Aggregate,
    AggregateFunc,
    And,
    BoolNode,
    Compare,
    CompareOp,
    Condition,
    EventQuery,
    Expression,
    Literal,
    Match,
    MatchOp,
    Node,
    ParseError,
    Presence,
    PropertyRef,
    Scalar,
    TraitRef,
    ValueNode,
    Window,
)
from efd.languages.toolkit import Token

__all__ = ["parse_condition", "parse_expression"]

# ---------------------------------------------------------------------------------------------
# Parser: recursive descent on the toolkit's and/or/not loops. Precedence, loosest first: or,
# and, not, comparison, method chain.

_COMPARE_OPS: Final[dict[str, CompareOp]] = {
    "=": "=",
    "==": "=",
    "!=": "!=",
    "<": "<",
    "<=": "<=",
    ">": ">",
    ">=": ">=",
}
_METHOD_COMPARE: Final[dict[str, CompareOp]] = {
    "equals": "=",
    "differs": "!=",
    "greater_than": ">",
    "at_least": ">=",
    "less_than": "<",
    "at_most": "<=",
}
_METHOD_MATCH: Final[dict[str, MatchOp]] = {
    "contains": "contains",
    "one_of": "one_of",
    "starts_with": "starts_with",
    "ends_with": "ends_with",
    "omits": "omits",
}
_PROP_AGGREGATES: Final[dict[str, AggregateFunc]] = {
    "sum": "sum",
    "avg": "avg",
    "min": "min",
    "max": "max",
    "first": "first",
    "last": "last",
    "mode": "mode",
    "unique": "unique",
}
_UNITS: Final[dict[str, Lit["days", "hours", "minutes"]]] = {
    "day": "days",
    "days": "days",
    "hour": "hours",
    "hours": "hours",
    "minute": "minutes",
    "minutes": "minutes",
}
_KEYWORDS: Final = frozenset({"and", "or", "not", "contains"})
_QUERY_METHODS: Final = "where, within, count, sum, avg, min, max, first, last, mode or unique"
_VALUE_METHODS: Final = (
    "equals, differs, greater_than, at_least, less_than, at_most, contains, one_of, "
    "starts_with, ends_with, omits, exists or absent"
)
_ALL_METHODS: Final = frozenset(
    {"where", "within", "count", "exists", "absent", *_PROP_AGGREGATES, *_METHOD_COMPARE}
    | set(_METHOD_MATCH)
)
_NEED_CONDITION: Final = toolkit.need_condition("a value", "trait('plan') = 'pro'")


def _compare(left: ValueNode, op: CompareOp, right: ValueNode) -> BoolNode:
    """Build a comparison; `= null` and `!= null` are presence tests (.absent() / .exists())."""
    if op in ("=", "!="):
        for this, other in ((left, right), (right, left)):
            if isinstance(other, Literal) and other.value is None:
                return Presence(this, op == "!=", pos=left.pos)
    return Compare(left, op, right, pos=left.pos)


class _Parser(toolkit.Parser[Node, BoolNode]):
    error = ParseError

    def __init__(self, text: str) -> None:
        super().__init__(Lexer(text))
        self.in_where = False

    def hint(self) -> str:
        # `trait('x') exists` is a natural mistake: methods need a dot and parentheses.
        tok = self.peek()
        if tok.kind == "name" and tok.value in _ALL_METHODS and tok.value != "contains":
            return f" (methods are called with a dot: .{tok.value}(...))"
        return ""

    # -- type helpers

    def condition(self, node: Node) -> BoolNode:
        if isinstance(node, EventQuery):
            # A bare event query in a condition means "happened at least once".
            count = Aggregate(node, "count", pos=node.pos)
            return Compare(count, ">=", Literal(1, pos=node.pos), pos=node.pos)
        if isinstance(node, BOOL_TYPES):
            return node
        self.fail_at(_NEED_CONDITION, node)

    def as_value(self, node: Node) -> ValueNode:
        if isinstance(node, EventQuery):
            self.fail_at(
                "an event query must end with an aggregate before it can be compared, "
                "e.g. event('Signed Up').count() >= 1",
                node,
            )
        if isinstance(node, VALUE_TYPES):
            return node
        self.fail_at("expected a value, found a condition; conditions cannot be compared", node)

    # -- grammar below not: comparison, method chain

    def comparison_op(self) -> CompareOp | None:
        tok = self.peek()
        if tok.kind == "op" and isinstance(tok.value, str) and tok.value in _COMPARE_OPS:
            return _COMPARE_OPS[tok.value]
        if tok.kind == "name" and tok.value == "contains":
            return "contains"
        return None

    def comparison(self) -> Node:
        left = self.parse_chain()
        op = self.comparison_op()
        if op is None:
            return left
        self.advance()
        if self.peek().kind == "end":
            self.fail(toolkit.value_after(op))
        right = self.parse_chain()
        node = _compare(self.as_value(left), op, self.as_value(right))
        if self.comparison_op() is not None:
            self.fail(toolkit.CHAINED)
        return node

    def parse_chain(self) -> Node:
        node = self.parse_primary()
        while self.is_op("."):
            self.advance()
            name = self.peek()
            if name.kind != "name":
                self.fail(f"expected a method name after '.', found {self.describe(name)}")
            self.advance()
            self.expect_op("(", f"expected '(' after '{name.text}'")
            node = self.parse_method(node, name)
        return node

    def parse_primary(self) -> Node:
        tok = self.peek()
        if tok.kind == "op" and tok.value == "(":
            self.advance()
            with self.nested(tok):
                inner = self.parse_or()
                self.expect_close(tok)
            return inner
        if tok.kind in ("str", "num"):
            self.advance()
            assert isinstance(tok.value, str | int | float)
            return Literal(tok.value, pos=(tok.line, tok.column))
        if tok.kind == "op" and tok.value == "-":
            self.advance()
            num = self.peek()
            if not isinstance(num.value, int | float) or num.kind != "num":
                self.fail(f"expected a number after '-', found {self.describe(num)}")
            self.advance()
            return Literal(-num.value, pos=(tok.line, tok.column))
        if tok.kind == "name":
            return self.parse_name(tok)
        if tok.kind == "end":
            self.fail(toolkit.UNEXPECTED_END)
        self.fail(toolkit.value_or_condition(self.describe(tok)))

    def parse_name(self, tok: Token) -> Node:
        pos = (tok.line, tok.column)
        word = tok.value
        constants: dict[str | int | float, Scalar] = {"true": True, "false": False, "null": None}
        if word in constants:
            self.advance()
            return Literal(constants[word], pos=pos)
        if word in _KEYWORDS:
            self.fail(toolkit.value_or_condition(f"'{tok.text}'"))
        if word not in ("event", "trait", "property"):
            self.advance()
            if self.is_op("("):
                self.fail(
                    f"unknown function '{tok.text}'; expected event(), trait() or property()", tok
                )
            self.fail(
                f"unexpected name '{tok.text}'; strings must be quoted, e.g. '{tok.text}'", tok
            )
        if word == "event" and self.in_where:
            self.fail("event() cannot be used inside where()")
        if word == "property" and not self.in_where:
            self.fail("property() is only allowed inside where()")
        self.advance()
        self.expect_op("(", f"expected '(' after '{tok.text}'")
        name = self.read_name(str(word))
        if word == "event":
            return EventQuery(name, pos=pos)
        if word == "trait":
            return TraitRef(name, pos=pos)
        return PropertyRef(name, pos=pos)

    def read_name(self, what: str) -> str:
        """Read `'name')` after `event(`, `trait(` or `property(`."""
        tok = self.peek()
        if tok.kind != "str":
            example = {"event": "'Order Completed'", "trait": "'plan'", "property": "'revenue'"}
            self.fail(
                f"expected a quoted {what} name, e.g. {what}({example[what]}), "
                f"found {self.describe(tok)}"
            )
        if tok.value == "":
            self.fail(f"{what} name cannot be empty")
        self.advance()
        self.expect_op(")", f"expected ')' after {what} name")
        return str(tok.value)

    # -- methods

    def parse_method(self, node: Node, name_tok: Token) -> Node:
        """Apply `.name(` ... `)`; the opening parenthesis is already consumed."""
        name = str(name_tok.value)
        if isinstance(node, EventQuery):
            return self.query_method(node, name, name_tok)
        if isinstance(node, Aggregate) and node.func == "unique" and name == "count":
            self.no_arguments("count")
            return Aggregate(node.query, "unique_count", node.prop, pos=node.pos)
        if isinstance(node, VALUE_TYPES):
            return self.value_method(node, name, name_tok)
        self.fail(f"cannot call .{name_tok.text}() on a condition", name_tok)

    def query_method(self, query: EventQuery, name: str, name_tok: Token) -> Node:
        if name == "where":
            outer, self.in_where = self.in_where, True
            cond = self.condition(self.parse_or())
            self.in_where = outer
            self.expect_op(")", "expected ')' to close where(")
            where = cond if query.where is None else And((query.where, cond), pos=query.where.pos)
            return EventQuery(query.event, where, query.within, pos=query.pos)
        if name == "within":
            if query.within is not None:
                self.fail("within() is given twice for this event query", name_tok)
            return EventQuery(query.event, query.where, self.read_window(), pos=query.pos)
        if name == "count":
            self.no_arguments("count")
            return Aggregate(query, "count", pos=query.pos)
        if name in _PROP_AGGREGATES:
            func = _PROP_AGGREGATES[name]
            prop = self.read_property_arg(name)
            min_frequency = None
            if func == "mode" and self.is_op(","):
                self.advance()
                min_frequency = self.read_positive_int("mode() minimum frequency")
            self.expect_op(")", "expected ')' after property name")
            return Aggregate(query, func, prop, min_frequency, pos=query.pos)
        self.fail(
            f"unknown method '{name_tok.text}' for an event query; expected {_QUERY_METHODS}",
            name_tok,
        )

    def value_method(self, operand: ValueNode, name: str, name_tok: Token) -> Node:
        pos = operand.pos
        if name in _METHOD_COMPARE:
            arg = self.read_value_arg(name)
            self.expect_op(")", f"{name}() takes one value; expected ')'")
            return _compare(operand, _METHOD_COMPARE[name], arg)
        if name in _METHOD_MATCH:
            args = [self.read_value_arg(name)]
            while self.is_op(","):
                self.advance()
                args.append(self.read_value_arg(name))
            self.expect_op(")", "expected ',' or ')' after the value")
            return Match(operand, _METHOD_MATCH[name], tuple(args), pos=pos)
        if name in ("exists", "absent"):
            self.no_arguments(name)
            return Presence(operand, name == "exists", pos=pos)
        if isinstance(operand, Aggregate) and name in ("where", "within"):
            self.fail(f"{name}() must come before the aggregate ({operand.func}())", name_tok)
        self.fail(
            f"unknown method '{name_tok.text}' for a value; expected {_VALUE_METHODS}", name_tok
        )

    def no_arguments(self, name: str) -> None:
        if not self.is_op(")"):
            self.fail(f"{name}() takes no arguments")
        self.advance()

    def read_value_arg(self, method: str) -> ValueNode:
        tok = self.peek()
        if self.is_op(")"):
            self.fail(f"{method}() needs a value, e.g. {method}('pro')")
        with self.nested(tok):  # arguments can hold method chains that nest again
            return self.as_value(self.parse_chain())

    def read_property_arg(self, method: str) -> str:
        """sum('revenue') or, as in Segment's reference, sum(property('revenue'))."""
        tok = self.peek()
        if tok.kind == "name" and tok.value == "property":
            self.advance()
            self.expect_op("(", "expected '(' after 'property'")
            return self.read_name_in_call()
        if tok.kind != "str":
            self.fail(
                f"{method}() needs a quoted property name, e.g. {method}('revenue'), "
                f"found {self.describe(tok)}"
            )
        if tok.value == "":
            self.fail("property name cannot be empty")
        self.advance()
        return str(tok.value)

    def read_name_in_call(self) -> str:
        tok = self.peek()
        if tok.kind != "str" or tok.value == "":
            self.fail(f"expected a quoted property name, found {self.describe(tok)}")
        self.advance()
        self.expect_op(")", "expected ')' after property name")
        return str(tok.value)

    def read_positive_int(self, what: str) -> int:
        tok = self.peek()
        if tok.kind != "num" or not isinstance(tok.value, int) or tok.value < 1:
            self.fail(f"{what} must be a whole number of at least 1, found {self.describe(tok)}")
        self.advance()
        return tok.value

    def read_window(self) -> Window:
        start = self.peek()
        if start.kind == "name" and start.value == "parent":
            self.fail("within(parent: ...) (funnel audiences) is not supported")
        amount = self.read_positive_int("within() duration")
        unit_tok = self.peek()
        if unit_tok.kind != "name":
            self.fail(
                f"expected a time unit (days, hours or minutes) after {amount}, "
                f"found {self.describe(unit_tok)}"
            )
        unit = _UNITS.get(str(unit_tok.value))
        if unit is None:
            self.fail(f"unknown time unit '{unit_tok.text}'; expected days, hours or minutes")
        window = Window(amount, unit, pos=(start.line, start.column))
        try:
            window.seconds  # noqa: B018  # its seconds are what evaluation needs
        except OverflowError:
            self.fail("within() duration is out of range: at most about 1.8e308 seconds", start)
        self.advance()
        self.expect_op(")", "expected ')' after the within() duration")
        return window


# ---------------------------------------------------------------------------------------------
# Entry points


def parse_condition(text: str) -> Condition:
    """Parse an audience condition; it must yield true/false."""
    parser = _Parser(text)
    parser.expect_start()
    node = parser.parse_or()
    parser.expect_end()
    if isinstance(node, VALUE_TYPES):
        parser.fail_at(
            "an audience condition must be true or false, but this yields a value; "
            "compare it, e.g. event('Order Completed').count() >= 1",
            node,
        )
    return Condition(text, parser.condition(node))


def parse_expression(text: str) -> Expression:
    """Parse a computed-trait expression; it must be an event query with an aggregate."""
    parser = _Parser(text)
    parser.expect_start()
    node = parser.parse_or()
    parser.expect_end()
    if isinstance(node, Aggregate):
        return Expression(text, node)
    if isinstance(node, EventQuery):
        parser.fail_at(
            "a computed trait needs an aggregate, e.g. .count() or .sum('revenue'), "
            "after the event query",
            node,
        )
    if isinstance(node, BOOL_TYPES):
        parser.fail_at(
            "a computed trait must yield a value, but this is a condition (true or false); "
            "use an aggregate such as event('Order Completed').sum('revenue')",
            node,
        )
    parser.fail_at(
        "a computed trait must be an event query with an aggregate, "
        "e.g. event('Order Completed').sum('revenue')",
        node,
    )
