"""The audience language's printer: what it prints parses back to the tree it printed (pure)."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from efd.languages.audiences import parse_condition, parse_expression, to_text
from efd.languages.audiences.tree import (
    Aggregate,
    AggregateFunc,
    And,
    BoolNode,
    Compare,
    CompareOp,
    EventQuery,
    Literal,
    Match,
    MatchOp,
    Not,
    Or,
    Presence,
    PropertyRef,
    TraitRef,
    ValueNode,
    Window,
)


@pytest.mark.parametrize(
    ("text", "printed"),
    [
        (
            "event('Order Completed').where(property('revenue') > 100).within(7 days).count() >= 3",
            "event('Order Completed').where(property('revenue') > 100).within(7 days).count() >= 3",
        ),
        (
            "TRAIT('plan') == 'pro' AND NOT trait('x').exists()",
            "trait('plan') = 'pro' and not trait('x').exists()",
        ),
        ("trait('a') != null", "trait('a').exists()"),
        ("event('A')", "event('A').count() >= 1"),
        (
            "trait('a') = 1 or trait('b') = 2 and trait('c') = 3",
            "trait('a') = 1 or (trait('b') = 2 and trait('c') = 3)",
        ),
        ("not (trait('a') = 1)", "not (trait('a') = 1)"),
        ("not not trait('a').absent()", "not not trait('a').absent()"),
        ("trait('s').one_of('a', \"b's\", '\\n')", "trait('s').one_of('a', 'b\\'s', '\\n')"),
        ("trait('n').at_least(-2.5)", "trait('n') >= -2.5"),
        ("trait('t') contains 'x'", "trait('t') contains 'x'"),
        (
            "event('A').within(1 hour).where(property('p') = 1).where(trait('q') = 2).count() > 0",
            "event('A').where(property('p') = 1 and trait('q') = 2).within(1 hours).count() > 0",
        ),
    ],
)
def test_conditions_print_in_one_spelling_that_parses_back(text: str, printed: str) -> None:
    condition = parse_condition(text)
    assert to_text(condition.root) == printed
    assert parse_condition(printed).root == condition.root


@pytest.mark.parametrize(
    "text",
    [
        "event('A').count()",
        "event('A').sum('revenue')",
        "event('A').sum(property('revenue'))",
        "event('A').mode('plan', 2)",
        "event('A').unique('sku').count()",
        "event('A').where(property('p').starts_with('x')).within(30 minutes).last('p')",
    ],
)
def test_expressions_parse_back(text: str) -> None:
    expression = parse_expression(text)
    assert parse_expression(to_text(expression.root)).root == expression.root


# -- any tree the parser can give back: printed, then parsed, it is the same tree

NAMES = st.text(min_size=1, max_size=6)
SCALARS = st.one_of(
    st.booleans(),
    st.integers(min_value=-(2**53), max_value=2**53),
    st.floats(allow_nan=False, allow_infinity=False),
    st.text(max_size=6),
)
COMPARE_OPS: list[CompareOp] = ["=", "!=", "<", "<=", ">", ">=", "contains"]
MATCH_OPS: list[MatchOp] = ["contains", "one_of", "starts_with", "ends_with", "omits"]
PROPERTY_AGGREGATES: list[AggregateFunc] = [
    "sum",
    "avg",
    "min",
    "max",
    "first",
    "last",
    "mode",
    "unique",
]


def conditions(values: st.SearchStrategy[ValueNode]) -> st.SearchStrategy[BoolNode]:
    atoms: st.SearchStrategy[BoolNode] = st.one_of(
        st.builds(Compare, values, st.sampled_from(COMPARE_OPS), values),
        st.builds(
            Match, values, st.sampled_from(MATCH_OPS), st.lists(values, min_size=1, max_size=3)
        ).map(lambda m: Match(m.operand, m.op, tuple(m.values))),
        st.builds(Presence, values, st.booleans()),
    )

    def combine(inner: st.SearchStrategy[BoolNode]) -> st.SearchStrategy[BoolNode]:
        group = st.lists(inner, min_size=2, max_size=3).map(tuple)
        return st.one_of(st.builds(And, group), st.builds(Or, group), st.builds(Not, inner))

    return st.recursive(atoms, combine, max_leaves=6)


def queries() -> st.SearchStrategy[EventQuery]:
    inside = st.one_of(
        st.builds(Literal, SCALARS),
        st.builds(TraitRef, NAMES),
        st.builds(PropertyRef, NAMES),
    )
    windows = st.builds(
        Window,
        st.integers(min_value=1, max_value=10**6),
        st.sampled_from(["days", "hours", "minutes"]),
    )
    return st.builds(EventQuery, NAMES, st.none() | conditions(inside), st.none() | windows)


def aggregates() -> st.SearchStrategy[Aggregate]:
    return st.one_of(
        st.builds(Aggregate, queries(), st.just("count")),
        st.builds(Aggregate, queries(), st.sampled_from(PROPERTY_AGGREGATES), NAMES),
        st.builds(Aggregate, queries(), st.just("unique_count"), NAMES),
        st.builds(
            Aggregate, queries(), st.just("mode"), NAMES, st.integers(min_value=1, max_value=99)
        ),
    )


OUTSIDE: st.SearchStrategy[ValueNode] = st.one_of(
    st.builds(Literal, SCALARS), st.builds(TraitRef, NAMES), aggregates()
)


@settings(max_examples=300, deadline=None)
@given(conditions(OUTSIDE))
def test_any_condition_prints_to_text_that_parses_to_it(root: BoolNode) -> None:
    assert parse_condition(to_text(root)).root == root


@settings(max_examples=100, deadline=None)
@given(aggregates())
def test_any_expression_prints_to_text_that_parses_to_it(root: Aggregate) -> None:
    assert parse_expression(to_text(root)).root == root
