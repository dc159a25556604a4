"""The languages' toolkit (efd/languages/toolkit.py): positions, the errors FQL and the audience
language share in one wording, the nesting limit and the and/or/not loops (pure, fast)."""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Final, TypeAlias

import pytest

from efd.languages import toolkit
from efd.languages.audiences import ParseError, parse_condition
from efd.languages.audiences import tree as audience_tree
from efd.languages.filters import FqlError, parse
from efd.languages.filters import tree as fql_tree
from efd.languages.toolkit import (
    MAX_DEPTH,
    And,
    Literal,
    Not,
    Or,
    Scanner,
    SourceError,
    Token,
)

# ---------------------------------------------------------------------------------------------
# A toy language on the toolkit alone: names, numbers, '=', parentheses, and/or/not.


class ToyError(SourceError):
    pass


class ToyLexer(Scanner):
    error = ToyError
    language = "Toy"

    def token(self) -> Token:
        m = toolkit.NUMBER.match(self.text, self.i)
        if m:
            return self.number(m)
        m = re.compile(r"[a-z]+").match(self.text, self.i)
        if m:
            tok = Token("name", m.group(), m.group(), self.line, self.column(self.i), m.group())
            self.i = m.end()
            return tok
        op = self.operator(frozenset({"=", "(", ")"}), {"==": "'='"})
        if op is not None:
            return op
        self.fail(toolkit.unexpected_character(self.text[self.i]), self.i)


ToyNode: TypeAlias = Literal | And["ToyNode"] | Or["ToyNode"] | Not["ToyNode"]


class ToyParser(toolkit.Parser[ToyNode, ToyNode]):
    error = ToyError
    max_depth = 3

    def condition(self, node: ToyNode) -> ToyNode:
        if isinstance(node, Literal) and isinstance(node.value, int | float):
            self.fail_at(toolkit.need_condition("a number", "a = 1"), node)
        return node

    def comparison(self) -> ToyNode:
        tok = self.peek()
        if self.is_op("("):
            self.advance()
            with self.nested(tok):
                inner = self.parse_or()
                self.expect_close(tok)
            return inner
        if tok.kind == "end":
            self.fail(toolkit.UNEXPECTED_END)
        if tok.kind not in ("name", "num"):
            self.fail(toolkit.value_or_condition(self.describe(tok)))
        self.advance()
        assert isinstance(tok.value, str | int | float)
        return Literal(tok.value, pos=(tok.line, tok.column))


def toy(text: str) -> ToyNode:
    parser = ToyParser(ToyLexer(text))
    parser.expect_start()
    node = parser.parse_or()
    parser.expect_end()
    return node


def toy_error(text: str) -> ToyError:
    with pytest.raises(ToyError) as caught:
        toy(text)
    return caught.value


# -- positions


def test_tokens_carry_their_line_and_column_and_end_with_an_end_token() -> None:
    tokens, error = ToyLexer("a =\n  12\n\n(b)").scan()
    assert error is None
    where = [(t.kind, t.text, t.line, t.column) for t in tokens]
    assert where == [
        ("name", "a", 1, 1),
        ("op", "=", 1, 3),
        ("num", "12", 2, 3),
        ("op", "(", 4, 1),
        ("name", "b", 4, 2),
        ("op", ")", 4, 3),
        ("end", "", 4, 4),
    ]


def test_a_lexical_error_is_returned_with_the_tokens_before_it() -> None:
    tokens, error = ToyLexer("a\n  b @ c").scan()
    assert isinstance(error, ToyError)
    assert (error.line, error.column, error.message) == (2, 5, "unexpected character '@'")
    assert [t.text for t in tokens] == ["a", "b", ""]
    assert (tokens[-1].kind, tokens[-1].line, tokens[-1].column) == ("end", 2, 5)


def test_the_first_error_in_the_text_is_reported_lexical_or_not() -> None:
    assert toy_error("a and ) @").message == "expected a value or a condition, found ')'"
    assert (toy_error("a and b @").line, toy_error("a and b @").column) == (1, 9)
    # FQL reports the same way: the missing value comes before the string left open.
    with pytest.raises(FqlError) as caught:
        parse("a = = 'open")
    assert (caught.value.column, caught.value.message) == (
        5,
        "expected a value before '=', e.g. event = 'Order Completed'",
    )


def test_nodes_keep_their_position_out_of_equality() -> None:
    node = toy("x or\n  y and not z")
    assert node == Or((Literal("x"), And((Literal("y"), Not(Literal("z"))))))
    assert isinstance(node, Or)
    assert node.pos == (1, 1)
    inner = node.items[1]
    assert isinstance(inner, And)
    assert inner.pos == (2, 3)
    negation = inner.items[1]
    assert isinstance(negation, Not)
    assert negation.pos == (2, 9)


def test_the_error_names_line_and_column_in_its_text() -> None:
    error = toy_error("a or\n\n   b ==")
    assert str(error) == "line 3, column 6: '==' is not Toy; write '='"


# -- the boolean loops


def test_and_binds_tighter_than_or_and_not_tighter_than_and() -> None:
    a, b, c, d = (Literal(x) for x in "abcd")
    assert toy("a or b and c or d") == Or((a, And((b, c)), d))
    assert toy("not a and b") == And((Not(a), b))
    assert toy("not (a and b)") == Not(And((a, b)))
    assert toy("not not a") == Not(Not(a))
    assert toy("(a or b) and c") == And((Or((a, b)), c))


def test_each_operand_of_and_or_not_is_checked_as_a_condition() -> None:
    for text, column in (("1 and a", 1), ("a or 2", 6), ("not 3", 5)):
        error = toy_error(text)
        assert error.column == column
        assert error.message == "expected a condition (true or false), found a number; " + (
            "compare it, e.g. a = 1"
        )
    assert toy("1") == Literal(1)  # alone, the language decides


# -- the depth limit


def test_nesting_is_limited_at_the_token_that_goes_too_deep() -> None:
    assert toy("(((a)))") == Literal("a")
    assert toy("not not not a") == Not(Not(Not(Literal("a"))))
    error = toy_error("((((a))))")
    assert (error.column, error.message) == (4, "the expression is nested more than 3 levels deep")
    error = toy_error("not (not (not (not a)))")
    assert error.column == 10  # not, (, not, then the second (
    # The depth is given back when a level closes: siblings do not add up.
    assert toy("(((a))) and (((b))) or not not not c") is not None


def nest_fql(depth: int) -> str:
    return "(" * depth + "a = 1" + ")" * depth


def nest_audience(depth: int) -> str:
    return "(" * depth + "trait('a') = 1" + ")" * depth


def negate_fql(depth: int) -> str:
    return "!" * depth + "a"


def negate_audience(depth: int) -> str:
    return "not " * depth + "trait('a') = 1"


@pytest.mark.parametrize(
    ("fql", "audience", "audience_step"),
    [(nest_fql, nest_audience, 1), (negate_fql, negate_audience, len("not "))],
)
def test_both_languages_nest_as_deep_as_the_limit_and_no_deeper(
    fql: Callable[[int], str], audience: Callable[[int], str], audience_step: int
) -> None:
    parse(fql(MAX_DEPTH))
    parse_condition(audience(MAX_DEPTH))
    with pytest.raises(FqlError) as fql_error:
        parse(fql(MAX_DEPTH + 1))
    with pytest.raises(ParseError) as audience_error:
        parse_condition(audience(MAX_DEPTH + 1))
    message = "the expression is nested more than 64 levels deep"
    assert fql_error.value.message == audience_error.value.message == message
    # At the opening that goes one level too deep.
    assert fql_error.value.column == MAX_DEPTH + 1
    assert audience_error.value.column == MAX_DEPTH * audience_step + 1


# ---------------------------------------------------------------------------------------------
# The errors both languages make, in one wording.

SHARED: Final = [
    # (FQL text, audience text, message, FQL column, audience column)
    ("", "", "the expression is empty", 1, 1),
    ("  \n ", "  \n ", "the expression is empty", 2, 2),
    ("a = 1 and", "trait('a') = 1 and", toolkit.UNEXPECTED_END, 10, 19),
    (
        "a =",
        "trait('a') =",
        "expected a value after '=', found the end of the expression",
        4,
        13,
    ),
    ("a = 1 and )", "trait('a') = 1 and )", "expected a value or a condition, found ')'", 11, 20),
    ("a = 1 = 2", "trait('a') = 1 = 2", toolkit.CHAINED, 7, 16),
    ("a = 'x", "trait('a') = 'x", "unterminated string: the ' opened here is never closed", 5, 14),
    ("a = \x07", "trait('a') = \x07", "unexpected character '\\x07'", 5, 14),
    (
        "a = 1e999",
        "trait('a') = 1e999",
        "the number 1e999 is out of range: numbers are limited to a double's range, about ±1.8e308",
        5,
        14,
    ),
    (
        "(a = 1",
        "(trait('a') = 1",
        "expected ')' to close the '(' at line 1, column 1, found the end of the expression",
        7,
        16,
    ),
    (
        "a = 1 'x'",
        "trait('a') = 1 'x'",
        "expected 'and', 'or' or the end of the expression, found the string 'x'",
        7,
        16,
    ),
    (
        "a = 1 2",
        "trait('a') = 1 2",
        "expected 'and', 'or' or the end of the expression, found the number 2",
        7,
        16,
    ),
]


@pytest.mark.parametrize(("fql", "audience", "message", "fql_column", "column"), SHARED)
def test_both_languages_word_a_shared_error_alike(
    fql: str, audience: str, message: str, fql_column: int, column: int
) -> None:
    with pytest.raises(FqlError) as fql_error:
        parse(fql)
    with pytest.raises(ParseError) as audience_error:
        parse_condition(audience)
    assert fql_error.value.message == message
    assert audience_error.value.message == message
    assert fql_error.value.column == fql_column
    assert audience_error.value.column == column


@pytest.mark.parametrize(
    ("fql", "audience", "wrong", "right"),
    [
        ("a = 1 && b = 1", "trait('a') = 1 && trait('b') = 1", "&&", "'and'"),
        ("a = 1 || b = 1", "trait('a') = 1 || trait('b') = 1", "||", "'or'"),
        ("a = 1 | b = 1", "trait('a') = 1 | trait('b') = 1", "|", "'or'"),
    ],
)
def test_another_languages_operator_is_named_with_what_to_write(
    fql: str, audience: str, wrong: str, right: str
) -> None:
    with pytest.raises(FqlError) as fql_error:
        parse(fql)
    with pytest.raises(ParseError) as audience_error:
        parse_condition(audience)
    assert fql_error.value.message == f"'{wrong}' is not FQL; write {right}"
    assert audience_error.value.message == (
        f"'{wrong}' is not in the audience language; write {right}"
    )


def test_an_audience_string_ends_on_its_line() -> None:
    with pytest.raises(ParseError) as caught:
        parse_condition("trait('a') = 'x\n'")
    assert (
        caught.value.message == "unterminated string: the ' opened here is not closed on its line"
    )
    # FQL's strings may hold newlines: only the end of the text leaves one open.
    assert parse("a = 'x\ny'") == fql_tree.Compare("=", fql_tree.Path(("a",)), Literal("x\ny"))


def test_the_languages_share_literal_and_or_not() -> None:
    assert fql_tree.And is audience_tree.And is And
    assert fql_tree.Or is audience_tree.Or is Or
    assert fql_tree.Not is audience_tree.Not is Not
    assert fql_tree.Literal is audience_tree.Literal is Literal
    assert issubclass(FqlError, SourceError)
    assert issubclass(ParseError, SourceError)


# ---------------------------------------------------------------------------------------------
# Printing


def test_print_boolean_groups_and_within_or_and_what_not_applies_to() -> None:
    def show(node: ToyNode) -> str:
        if isinstance(node, And | Or | Not):
            return toolkit.print_boolean(
                node, show, not_prefix="not ", grouped=lambda n: isinstance(n, And | Or)
            )
        return str(node.value)

    a, b, c = (Literal(x) for x in "abc")
    assert show(Or((a, And((b, c))))) == "a or (b and c)"
    assert show(And((Or((a, b)), c))) == "(a or b) and c"
    assert show(Not(And((a, b)))) == "not (a and b)"
    assert show(Not(Not(a))) == "not not a"
    nodes: list[ToyNode] = [
        Or((a, And((b, c)))),
        And((Or((a, b)), c)),
        Not(And((a, b))),
        Not(Not(a)),
    ]
    for node in nodes:
        assert toy(show(node)) == node
