"""Audience query language: parser, type checks, requirements and evaluator (pure, fast)."""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import pytest

from efd.languages.audiences import (
    Event,
    ParseError,
    Profile,
    Requirements,
    compile_condition,
    compile_expression,
    evaluate_condition,
    evaluate_expression,
    parse_condition,
    parse_expression,
)
from efd.languages.audiences.tree import (
    Aggregate,
    And,
    Compare,
    Condition,
    EventQuery,
    Literal,
    Match,
    Not,
    Or,
    Presence,
    PropertyRef,
    TraitRef,
    Window,
    requirements,
)

NOW = 1_700_000_000.0
DAY = 86400.0
SPEC_AUDIENCE = (
    "event('Order Completed').where(property('revenue') >= 100).within(30 days).count() >= 3 "
    "and trait('plan') = 'pro'"
)
SPEC_TRAIT = "event('Order Completed').within(180 days).sum('revenue')"


def ev(name: str, ago_days: float = 1.0, **props: Any) -> Event:
    return Event(name, NOW - ago_days * DAY, props)


def cond(text: str, traits: dict[str, Any] | None = None, events: Sequence[Event] = ()) -> bool:
    return compile_condition(parse_condition(text))(Profile(traits or {}, events), NOW)


def value(text: str, events: Sequence[Event], traits: dict[str, Any] | None = None) -> Any:
    return compile_expression(parse_expression(text))(Profile(traits or {}, events), NOW)


def orders(*values: Any, prop: str = "v") -> list[Event]:
    """One 'O' event per value, a day apart, oldest first; None means property missing."""
    n = len(values)
    return [
        Event("O", NOW - (n - i) * DAY, {} if v is None else {prop: v})
        for i, v in enumerate(values)
    ]


def source(literal: Any) -> str:
    """The query-language spelling of a Python scalar."""
    if literal is None or isinstance(literal, bool):
        return {None: "null", True: "true", False: "false"}[literal]
    return repr(literal)


def a(name: str) -> Compare:
    """Shorthand AST for trait(name) = 1."""
    return Compare(TraitRef(name), "=", Literal(1))


def count_at_least_one(query: EventQuery) -> Compare:
    return Compare(Aggregate(query, "count"), ">=", Literal(1))


# ---------------------------------------------------------------------------------------------
# Parsing: the spec examples and every construct


def test_spec_audience_ast() -> None:
    query = EventQuery(
        "Order Completed",
        Compare(PropertyRef("revenue"), ">=", Literal(100)),
        Window(30, "days"),
    )
    expected = And(
        (
            Compare(Aggregate(query, "count"), ">=", Literal(3)),
            Compare(TraitRef("plan"), "=", Literal("pro")),
        )
    )
    parsed = parse_condition(SPEC_AUDIENCE)
    assert parsed.root == expected
    assert parsed.source == SPEC_AUDIENCE


def test_spec_trait_ast() -> None:
    parsed = parse_expression(SPEC_TRAIT)
    query = EventQuery("Order Completed", None, Window(180, "days"))
    assert parsed.root == Aggregate(query, "sum", "revenue")


def test_precedence_and_binds_tighter_than_or() -> None:
    root = parse_condition("trait('a') = 1 or trait('b') = 1 and trait('c') = 1").root
    assert root == Or((a("a"), And((a("b"), a("c")))))


def test_precedence_not_binds_tighter_than_and_but_looser_than_comparison() -> None:
    root = parse_condition("not trait('a') = 1 and trait('b') = 1").root
    assert root == And((Not(a("a")), a("b")))


def test_parentheses_override_precedence() -> None:
    root = parse_condition("(trait('a') = 1 or trait('b') = 1) and not (trait('c') = 1)").root
    assert root == And((Or((a("a"), a("b"))), Not(a("c"))))


def test_long_chains_are_flat() -> None:
    root = parse_condition("trait('a') = 1 and trait('b') = 1 and trait('c') = 1").root
    assert root == And((a("a"), a("b"), a("c")))


def test_double_not_and_keywords_ignore_case() -> None:
    root = parse_condition("NOT Not trait('a') = 1 AND trait('b') = 1 Or trait('c') = 1").root
    assert root == Or((And((Not(Not(a("a"))), a("b"))), a("c")))


def test_function_and_method_names_ignore_case_but_quoted_names_do_not() -> None:
    root = parse_condition("EVENT('Signed Up').Within(1 DAY).COUNT() >= 1").root
    assert root == count_at_least_one(EventQuery("Signed Up", None, Window(1, "days")))
    assert parse_condition("trait('Plan') = 1").root != parse_condition("trait('plan') = 1").root


def test_bare_event_query_means_count_at_least_one() -> None:
    assert parse_condition("event('A')").root == count_at_least_one(EventQuery("A"))
    assert parse_condition("not event('A')").root == Not(count_at_least_one(EventQuery("A")))


@pytest.mark.parametrize(
    ("source", "expected"),
    [
        ("'plain'", "plain"),
        ('"double"', "double"),
        (r"'it\'s'", "it's"),
        (r'"say \"hi\""', 'say "hi"'),
        ('"it\'s"', "it's"),
        ("'say \"hi\"'", 'say "hi"'),
        (r"'back\\slash'", "back\\slash"),
        (r"'a\nb\tc\rd'", "a\nb\tc\rd"),
        (r"'caf\u00e9'", "café"),
        ("'café ☕'", "café ☕"),
        ("''", ""),
    ],
)
def test_string_literals_and_escapes(source: str, expected: str) -> None:
    root = parse_condition(f"trait('x') = {source}").root
    assert root == Compare(TraitRef("x"), "=", Literal(expected))


@pytest.mark.parametrize(
    ("source", "expected"),
    [
        ("100", 100),
        ("0", 0),
        ("-5", -5),
        ("2.5", 2.5),
        ("-0.25", -0.25),
        ("1e3", 1000.0),
        ("1.5E-2", 0.015),
        ("true", True),
        ("FALSE", False),
        ("null", None),
        ("123456789012345678901234567890", 123456789012345678901234567890),
    ],
)
def test_number_and_constant_literals(source: str, expected: Any) -> None:
    root = parse_condition(f"trait('x') >= {source}").root
    assert isinstance(root, Compare)
    assert isinstance(root.right, Literal)
    assert root.right.value == expected
    assert type(root.right.value) is type(expected)


@pytest.mark.parametrize(
    ("infix", "method"),
    [
        ("=", "equals"),
        ("==", "equals"),
        ("!=", "differs"),
        (">", "greater_than"),
        (">=", "at_least"),
        ("<", "less_than"),
        ("<=", "at_most"),
    ],
)
def test_infix_operators_and_their_method_forms_agree(infix: str, method: str) -> None:
    infix_root = parse_condition(f"trait('x') {infix} 5").root
    method_root = parse_condition(f"trait('x').{method}(5)").root
    assert infix_root == method_root
    assert isinstance(infix_root, Compare)
    assert infix_root.op == ("=" if infix == "==" else infix)


def test_match_presence_and_contains_forms() -> None:
    x = TraitRef("x")
    assert parse_condition("trait('x') contains 'a'").root == Compare(x, "contains", Literal("a"))
    assert parse_condition("trait('x') CONTAINS 'a'").root == Compare(x, "contains", Literal("a"))
    for op in ("contains", "one_of", "starts_with", "ends_with", "omits"):
        root = parse_condition(f"trait('x').{op}('a', 'b')").root
        assert root == Match(x, op, (Literal("a"), Literal("b")))
    assert parse_condition("trait('x').exists()").root == Presence(x, True)
    assert parse_condition("trait('x').absent()").root == Presence(x, False)


def test_values_on_both_sides_of_a_comparison() -> None:
    root = parse_condition("event('A').count() > trait('limit')").root
    assert root == Compare(Aggregate(EventQuery("A"), "count"), ">", TraitRef("limit"))
    root = parse_condition("3 <= event('A').count()").root
    assert root == Compare(Literal(3), "<=", Aggregate(EventQuery("A"), "count"))
    root = parse_condition("(event('A').count()) >= 2").root
    assert root == Compare(Aggregate(EventQuery("A"), "count"), ">=", Literal(2))


@pytest.mark.parametrize("func", ["sum", "avg", "min", "max", "first", "last", "mode", "unique"])
def test_every_property_aggregate_parses_in_both_spellings(func: str) -> None:
    short = parse_expression(f"event('A').{func}('p')").root
    long = parse_expression(f"event('A').{func}(property('p'))").root
    assert short == long == Aggregate(EventQuery("A"), func, "p")  # type: ignore[arg-type]


def test_count_mode_frequency_and_unique_count() -> None:
    assert parse_expression("event('A').count()").root == Aggregate(EventQuery("A"), "count")
    assert parse_expression("event('A').mode('p', 2)").root == Aggregate(
        EventQuery("A"), "mode", "p", 2
    )
    assert parse_expression("event('A').unique('p').count()").root == Aggregate(
        EventQuery("A"), "unique_count", "p"
    )


@pytest.mark.parametrize(
    ("text", "amount", "unit", "seconds"),
    [
        ("1 day", 1, "days", 86400.0),
        ("30 days", 30, "days", 2592000.0),
        ("1 hour", 1, "hours", 3600.0),
        ("12 HOURS", 12, "hours", 43200.0),
        ("1 minute", 1, "minutes", 60.0),
        ("90 minutes", 90, "minutes", 5400.0),
        ("7days", 7, "days", 604800.0),
    ],
)
def test_within_units(text: str, amount: int, unit: str, seconds: float) -> None:
    root = parse_expression(f"event('A').within({text}).count()").root
    assert root.query.within == Window(amount, unit)  # type: ignore[arg-type]
    assert root.query.within is not None
    assert root.query.within.seconds == seconds


def test_where_and_within_in_any_order_and_repeated_where_is_and() -> None:
    pred = Compare(PropertyRef("p"), ">", Literal(1))
    one = parse_expression("event('A').where(property('p') > 1).within(2 days).count()").root
    two = parse_expression("event('A').within(2 days).where(property('p') > 1).count()").root
    assert one == two == Aggregate(EventQuery("A", pred, Window(2, "days")), "count")
    both = parse_expression(
        "event('A').where(property('p') > 1).where(property('q') = 'x').count()"
    ).root
    assert both.query.where == And((pred, Compare(PropertyRef("q"), "=", Literal("x"))))


def test_where_accepts_full_boolean_logic_and_traits() -> None:
    root = parse_expression(
        "event('A').where(not (property('p') > 1 or property('q').exists()) "
        "and property('r') >= trait('floor')).count()"
    ).root
    assert root.query.where == And(
        (
            Not(
                Or(
                    (
                        Compare(PropertyRef("p"), ">", Literal(1)),
                        Presence(PropertyRef("q"), True),
                    )
                )
            ),
            Compare(PropertyRef("r"), ">=", TraitRef("floor")),
        )
    )


def test_whitespace_and_newlines_are_free() -> None:
    text = "\n  event( 'A' )\n    .where( property('p') >= 1 )\n    . count ( )  >=  2\n"
    assert (
        parse_condition(text).root
        == parse_condition("event('A').where(property('p')>=1).count()>=2").root
    )


def test_positions_are_recorded_but_ignored_by_equality() -> None:
    root = parse_condition("trait('a') = 1 and\n  trait('b') = 2").root
    assert isinstance(root, And)
    assert root.items[0].pos == (1, 1)
    assert root.items[1].pos == (2, 3)
    assert parse_condition("  trait('a') = 1").root == parse_condition("trait('a') = 1").root


# ---------------------------------------------------------------------------------------------
# Requirements: what storage must load


def test_requirements_of_spec_examples() -> None:
    assert parse_condition(SPEC_AUDIENCE).requirements() == Requirements(
        frozenset({"Order Completed"}), frozenset({"plan"}), 30 * DAY
    )
    assert parse_expression(SPEC_TRAIT).requirements() == Requirements(
        frozenset({"Order Completed"}), frozenset(), 180 * DAY
    )


def test_requirements_longest_lookback_and_traits_inside_where() -> None:
    req = parse_condition(
        "event('A').within(2 hours) and event('B').within(3 days).count() > 1 "
        "or event('A').where(property('p') = trait('t')).within(90 minutes)"
    ).requirements()
    assert req == Requirements(frozenset({"A", "B"}), frozenset({"t"}), 3 * DAY)


def test_requirements_unbounded_when_any_query_lacks_within() -> None:
    req = parse_condition("event('A').within(2 days) or not event('B')").requirements()
    assert req.lookback_seconds is None
    assert req.event_names == frozenset({"A", "B"})


def test_requirements_without_events_need_no_history() -> None:
    req = parse_condition("trait('a').exists() and trait('b') != trait('c')").requirements()
    assert req == Requirements(frozenset(), frozenset({"a", "b", "c"}), 0.0)


def test_requirements_union() -> None:
    r1 = Requirements(frozenset({"A"}), frozenset({"x"}), 10.0)
    r2 = Requirements(frozenset({"B"}), frozenset(), 20.0)
    r3 = Requirements(frozenset(), frozenset({"y"}), None)
    assert r1.union(r2) == Requirements(frozenset({"A", "B"}), frozenset({"x"}), 20.0)
    assert r1.union(r3).lookback_seconds is None
    assert requirements(Literal(1)) == Requirements(frozenset(), frozenset(), 0.0)


# ---------------------------------------------------------------------------------------------
# Errors: message, line and column


@pytest.mark.parametrize(
    ("text", "line", "column", "message"),
    [
        ("", 1, 1, "the expression is empty"),
        ("   \n  ", 2, 3, "the expression is empty"),
        (
            "event('A').where(property('revenue' >= 100)).count() >= 1",
            1,
            37,
            "expected ')' after property name, found '>='",
        ),
        ("event(Order Completed)", 1, 7, "expected a quoted event name"),
        ("trait(plan) = 'pro'", 1, 7, "expected a quoted trait name"),
        ("trait('') = 1", 1, 7, "trait name cannot be empty"),
        ("trait('a' = 1", 1, 11, "expected ')' after trait name, found '='"),
        ("trait 'a'", 1, 7, "expected '(' after 'trait', found the string 'a'"),
        ("trait('a') = 'pro", 1, 14, "unterminated string: the ' opened here is never closed"),
        ("trait('a') = 'pro\n'", 1, 14, "the ' opened here is not closed on its line"),
        ("trait('a') = 'x\\", 1, 14, "the ' opened here is never closed"),
        ("trait('a') = 'a\\qb'", 1, 16, "unknown escape '\\q' in string"),
        ("trait('a') = '\\u12'", 1, 15, "\\u must be followed by 4 hex digits"),
        ("trait('a') = '\\ud800'", 1, 15, "surrogates are not allowed"),
        ("trait('a') = 1e999", 1, 14, "number 1e999 is out of range"),
        (
            "trait('a') = " + "1" * 10_000,
            1,
            14,
            "the number 111111111111… (10000 digits) is out of range: numbers are limited to "
            "a double's range, about ±1.8e308",
        ),
        ("trait('a') = @", 1, 14, "unexpected character '@'"),
        (
            "trait('a') = 1 && trait('b') = 1",
            1,
            16,
            "'&&' is not in the audience language; write 'and'",
        ),
        (
            "trait('a') = 1 || trait('b') = 1",
            1,
            16,
            "'||' is not in the audience language; write 'or'",
        ),
        ("!trait('a')", 1, 1, "'!' is not in the audience language; write 'not' or '!='"),
        (
            "trait('a') =",
            1,
            13,
            "expected a value after '=', found the end of the expression",
        ),
        ("trait('a') = 1 and", 1, 19, "unexpected end of the expression"),
        ("trait('a') = 1 and or", 1, 20, "expected a value or a condition, found 'or'"),
        ("trait('a') = pro", 1, 14, "unexpected name 'pro'; strings must be quoted"),
        ("traits('a') = 1", 1, 1, "unknown function 'traits'"),
        ("trait('a') = - 'x'", 1, 16, "expected a number after '-'"),
        ("trait('a') = )", 1, 14, "expected a value or a condition, found ')'"),
        ("1 < trait('a') < 3", 1, 16, "comparisons cannot be chained"),
        ("trait('a') = 1 trait('b') = 2", 1, 16, "expected 'and', 'or' or the end"),
        ("trait('a') exists", 1, 12, "methods are called with a dot: .exists(...)"),
        ("(trait('a') = 1", 1, 16, "expected ')' to close the '(' at line 1, column 1"),
        ("trait('a').", 1, 12, "expected a method name after '.'"),
        ("trait('a').exists", 1, 18, "expected '(' after 'exists'"),
        ("trait('a').exists(1)", 1, 19, "exists() takes no arguments"),
        ("trait('a').equals()", 1, 19, "equals() needs a value"),
        ("trait('a').equals(1, 2)", 1, 20, "equals() takes one value; expected ')'"),
        ("trait('a').one_of('x' 'y')", 1, 23, "expected ',' or ')' after the value"),
        ("trait('a').bigger(1)", 1, 12, "unknown method 'bigger' for a value"),
        ("trait('a')", 1, 1, "an audience condition must be true or false"),
        ("42", 1, 1, "an audience condition must be true or false"),
        ("event('A').sum('p')", 1, 1, "an audience condition must be true or false"),
        ("trait('a') and trait('b') = 1", 1, 1, "expected a condition (true or false)"),
        ("trait('b') = 1 or\n  trait('a')", 2, 3, "expected a condition (true or false)"),
        ("not trait('a')", 1, 5, "expected a condition (true or false)"),
        ("event('A') >= 1", 1, 1, "an event query must end with an aggregate"),
        ("(trait('a') = 1) = true", 1, 2, "conditions cannot be compared"),
        ("trait('a').exists().exists()", 1, 21, "cannot call .exists() on a condition"),
        ("event('A').total() > 1", 1, 12, "unknown method 'total' for an event query"),
        ("event('A').count(1) > 1", 1, 18, "count() takes no arguments"),
        ("event('A').sum() > 1", 1, 16, "sum() needs a quoted property name"),
        ("event('A').sum(revenue) > 1", 1, 16, "sum() needs a quoted property name"),
        ("event('A').sum('') > 1", 1, 16, "property name cannot be empty"),
        ("event('A').sum(property()) > 1", 1, 25, "expected a quoted property name"),
        ("event('A').sum('p' > 1", 1, 20, "expected ')' after property name"),
        ("event('A').mode('p', 0) > 1", 1, 22, "minimum frequency must be a whole number"),
        ("event('A').mode('p', 1.5) > 1", 1, 22, "minimum frequency must be a whole number"),
        ("event('A').unique('p').count(1) > 1", 1, 30, "count() takes no arguments"),
        ("event('A').count().within(1 day) > 1", 1, 20, "within() must come before the aggregate"),
        ("event('A').within(30 weeks)", 1, 22, "unknown time unit 'weeks'"),
        ("event('A').within(30)", 1, 21, "expected a time unit (days, hours or minutes) after 30"),
        ("event('A').within(0 days)", 1, 19, "within() duration must be a whole number"),
        ("event('A').within(-1 days)", 1, 19, "within() duration must be a whole number"),
        ("event('A').within(1.5 days)", 1, 19, "within() duration must be a whole number"),
        ("event('A').within(days)", 1, 19, "within() duration must be a whole number"),
        (
            "event('A').within(" + "9" * 308 + " days)",
            1,
            19,
            "within() duration is out of range: at most about 1.8e308 seconds",
        ),
        ("event('A').within(parent: 5 days)", 1, 19, "within(parent: ...) (funnel audiences)"),
        ("event('A').within(1 day 2)", 1, 25, "expected ')' after the within() duration"),
        ("event('A').within(1 day).within(2 days)", 1, 26, "within() is given twice"),
        ("event('A').where(trait('a'))", 1, 18, "expected a condition (true or false)"),
        ("event('A').where(property('p') = 1", 1, 35, "expected ')' to close where("),
        ("event('A').where(event('B'))", 1, 18, "event() cannot be used inside where()"),
        ("property('p') = 1", 1, 1, "property() is only allowed inside where()"),
        (
            "event('A').count(\n) >=\n\n   3 and\n\ttrait('a') = ~",
            5,
            15,
            "unexpected character '~'",
        ),
    ],
)
def test_parse_errors(text: str, line: int, column: int, message: str) -> None:
    with pytest.raises(ParseError) as info:
        parse_condition(text)
    err = info.value
    assert message in err.message
    assert (err.line, err.column) == (line, column), err.message
    assert str(err) == f"line {line}, column {column}: {err.message}"


@pytest.mark.parametrize(
    ("text", "column", "message"),
    [
        ("trait(plan) = 'x", 7, "expected a quoted trait name"),
        ("trait('plan') = 'x", 17, "unterminated string"),
        ("trait('a') = @ and trait(b)", 14, "unexpected character '@'"),
        ("@", 1, "unexpected character '@'"),
    ],
)
def test_the_first_error_in_the_text_is_reported(text: str, column: int, message: str) -> None:
    with pytest.raises(ParseError) as info:
        parse_condition(text)
    assert (info.value.column, message in info.value.message) == (column, True)


def test_parse_error_is_a_value_error() -> None:
    with pytest.raises(ValueError, match=r"^line 1, column 1: the expression is empty$"):
        parse_condition("")


def test_multiline_error_positions() -> None:
    text = "event('Order Completed')\n  .where(property('revenue') >= 100)\n  .within(30 dayz)"
    with pytest.raises(ParseError) as info:
        parse_condition(text)
    assert (info.value.line, info.value.column) == (3, 14)
    assert "unknown time unit 'dayz'" in info.value.message


@pytest.mark.parametrize(
    ("text", "line", "column", "message"),
    [
        ("event('A')", 1, 1, "a computed trait needs an aggregate"),
        ("event('A').where(property('p') = 1)", 1, 1, "a computed trait needs an aggregate"),
        ("event('A').count() >= 1", 1, 1, "a computed trait must yield a value"),
        ("trait('a').exists()", 1, 1, "a computed trait must yield a value"),
        ("trait('a')", 1, 1, "a computed trait must be an event query with an aggregate"),
        ("  'constant'", 1, 3, "a computed trait must be an event query with an aggregate"),
        ("event('A').sum('p') and event('B')", 1, 1, "expected a condition (true or false)"),
        ("", 1, 1, "the expression is empty"),
    ],
)
def test_expression_type_errors(text: str, line: int, column: int, message: str) -> None:
    with pytest.raises(ParseError) as info:
        parse_expression(text)
    assert message in info.value.message
    assert (info.value.line, info.value.column) == (line, column)


def test_deep_nesting_is_a_parse_error_not_a_crash() -> None:
    with pytest.raises(ParseError, match="nested more than 64 levels"):
        parse_condition("(" * 500 + "trait('a') = 1" + ")" * 500)
    with pytest.raises(ParseError, match="nested more than 64 levels"):
        parse_condition("not " * 500 + "trait('a') = 1")
    with pytest.raises(ParseError, match="nested more than 64 levels"):
        parse_condition("trait('a').equals(" * 500 + "1" + ")" * 500)
    # Reasonable nesting is fine.
    assert cond("(" * 30 + "trait('a') = 1" + ")" * 30, {"a": 1}) is True


def test_code_is_never_executed() -> None:
    with pytest.raises(ParseError, match="unknown function '__import__'"):
        parse_condition("__import__('os').system('false') = 0")


# ---------------------------------------------------------------------------------------------
# Evaluation: the spec examples


def test_spec_audience_evaluates() -> None:
    big = [ev("Order Completed", d, revenue=150) for d in (1, 10, 29)]
    assert cond(SPEC_AUDIENCE, {"plan": "pro"}, big) is True
    assert cond(SPEC_AUDIENCE, {"plan": "free"}, big) is False
    assert cond(SPEC_AUDIENCE, {}, big) is False
    assert cond(SPEC_AUDIENCE, {"plan": "pro"}, big[:2]) is False
    # One order too small, one too old, one of another event: still only two that count.
    noise = [
        ev("Order Completed", 2, revenue=99.99),
        ev("Order Completed", 31, revenue=500),
        ev("Order Refunded", 1, revenue=500),
    ]
    assert cond(SPEC_AUDIENCE, {"plan": "pro"}, big[:2] + noise) is False
    assert cond(SPEC_AUDIENCE, {"plan": "pro"}, [*big[:2], ev("Order Completed", 3, revenue=100)])


def test_spec_trait_evaluates() -> None:
    events = [
        ev("Order Completed", 1, revenue=10),
        ev("Order Completed", 100, revenue=2.5),
        ev("Order Completed", 181, revenue=1000),
        ev("Page Viewed", 1, revenue=1000),
    ]
    assert value(SPEC_TRAIT, events) == 12.5
    assert value(SPEC_TRAIT, []) == 0


def test_bare_event_query_is_true_when_the_event_happened() -> None:
    assert cond("event('Signed Up')", events=[ev("Signed Up")]) is True
    assert cond("event('Signed Up')", events=[ev("Logged In")]) is False
    assert cond("not event('Signed Up')", events=[]) is True


def test_convenience_evaluators() -> None:
    profile = Profile({"plan": "pro"}, [ev("A", revenue=3)])
    assert evaluate_condition(parse_condition("trait('plan') = 'pro'"), profile, NOW) is True
    assert evaluate_expression(parse_expression("event('A').sum('revenue')"), profile, NOW) == 3


# ---------------------------------------------------------------------------------------------
# within(): the edge is included, the future is included


@pytest.mark.parametrize(
    ("window", "seconds"), [("30 days", 30 * DAY), ("2 hours", 7200.0), ("15 minutes", 900.0)]
)
def test_within_edge_is_inclusive(window: str, seconds: float) -> None:
    text = f"event('A').within({window}).count()"
    assert value(text, [Event("A", NOW - seconds, {})]) == 1
    assert value(text, [Event("A", NOW - seconds - 0.001, {})]) == 0
    assert value(text, [Event("A", NOW - seconds + 0.001, {})]) == 1
    assert value(text, [Event("A", NOW, {})]) == 1
    assert value(text, [Event("A", NOW + 60, {})]) == 1  # clock skew: future counts


def test_within_uses_the_given_now() -> None:
    expr = compile_expression(parse_expression("event('A').within(1 day).count()"))
    profile = Profile({}, [Event("A", 1000.0, {})])
    assert expr(profile, 1000.0 + DAY) == 1
    assert expr(profile, 1000.0 + DAY + 1) == 0


def test_without_within_all_history_counts() -> None:
    assert value("event('A').count()", [Event("A", 0.0, {}), ev("A", 5000)]) == 2


def test_within_combined_with_where() -> None:
    events = [ev("A", 1, p=5), ev("A", 1, p=1), ev("A", 3, p=5)]
    assert value("event('A').where(property('p') > 2).within(2 days).count()", events) == 1
    text = "event('A').where(property('p') > 2).within(1 hour).count()"
    assert value(text, [Event("A", NOW - 3600, {"p": 5})]) == 1
    assert value(text, [Event("A", NOW - 3600.001, {"p": 5})]) == 0


# ---------------------------------------------------------------------------------------------
# Comparisons and type rules


@pytest.mark.parametrize(
    ("left", "op", "right", "expected"),
    [
        (5, "=", 5, True),
        (5, "=", 5.0, True),
        (5, "=", 6, False),
        ("pro", "=", "pro", True),
        ("Pro", "=", "pro", False),
        (True, "=", True, True),
        (False, "!=", True, True),
        (5, "!=", 6, True),
        (5, "!=", 5, False),
        ("a", "!=", "b", True),
        (5, "<", 6, True),
        (6, "<", 6, False),
        (6, "<=", 6, True),
        (7, ">", 6.5, True),
        (6.5, ">=", 6.5, True),
        ("apple", "<", "banana", True),
        ("b", ">=", "a", True),
        ("", "<", "a", True),
        ("hello world", "contains", "lo w", True),
        ("hello", "contains", "xyz", False),
        (["a", "b"], "contains", "b", True),
        (["a", "b"], "contains", "c", False),
        ([1, 2], "contains", 2.0, True),
        ([True], "contains", 1, False),
    ],
)
def test_comparisons_of_same_kind(left: Any, op: str, right: Any, expected: bool) -> None:
    traits = {"l": left, "r": right}
    # Both the literal fast path and the generic two-value path must agree.
    if not isinstance(right, list):
        assert cond(f"trait('l') {op} {source(right)}", traits) is expected
    assert cond(f"trait('l') {op} trait('r')", traits) is expected


@pytest.mark.parametrize("op", ["=", "!=", "<", "<=", ">", ">=", "contains"])
@pytest.mark.parametrize(
    ("left", "right"),
    [
        ("5", 5),
        (5, "5"),
        (True, 1),
        (1, True),
        (False, 0),
        (None, 0),
        (0, None),
        (None, ""),
        ("", None),
        ([1], "1"),
        ({"a": 1}, "a"),
        (1.5, [1.5]),
    ],
)
def test_mismatched_kinds_are_always_false(left: Any, right: Any, op: str) -> None:
    assert cond(f"trait('l') {op} trait('r')", {"l": left, "r": right}) is False
    # A literal null with = or != is a presence test instead (see test_null_semantics).
    if not isinstance(right, list) and not (right is None and op in ("=", "!=")):
        assert cond(f"trait('l') {op} {source(right)}", {"l": left}) is False


@pytest.mark.parametrize("op", ["<", "<=", ">", ">="])
def test_ordering_is_only_for_numbers_and_strings(op: str) -> None:
    assert cond(f"trait('l') {op} true", {"l": True}) is False
    assert cond(f"trait('l') {op} trait('r')", {"l": True, "r": True}) is False
    assert cond(f"trait('l') {op} null", {}) is False
    assert cond(f"trait('l') {op} trait('r')", {"l": [1], "r": [1]}) is False


def test_null_semantics() -> None:
    x = TraitRef("x")
    assert parse_condition("trait('x') = null").root == Presence(x, False)
    assert parse_condition("null = trait('x')").root == Presence(x, False)
    assert parse_condition("trait('x') != null").root == Presence(x, True)
    assert parse_condition("trait('x').equals(null)").root == Presence(x, False)
    assert parse_condition("trait('x').differs(null)").root == Presence(x, True)
    assert cond("trait('x') != null", {"x": 0}) is True
    assert cond("trait('x') != null", {"x": None}) is False
    assert cond("trait('x') = null", {"x": False}) is False
    # Otherwise null (or missing) is unknown: no comparison with it succeeds, even null = null.
    for op in ("=", "!=", "<", "<=", ">", ">=", "contains"):
        assert cond(f"trait('a') {op} trait('b')", {}) is False
        assert cond(f"trait('a') {op} trait('b')", {"a": None, "b": 1}) is False
        assert cond(f"trait('a') {op} trait('b')", {"a": "s", "b": None}) is False
    assert cond("trait('x').one_of(null, 'a')", {}) is False
    assert cond("trait('x') contains null", {"x": [None]}) is False
    # An AST built by hand with a null literal follows the same rule.
    manual = Condition("", Compare(x, "=", Literal(None)))
    assert compile_condition(manual)(Profile({}, []), NOW) is False


def test_missing_trait_is_null() -> None:
    assert cond("trait('plan') = null", {}) is True
    assert cond("trait('plan') = 'pro'", {}) is False
    # != needs a value to differ from (Segment's "differs"); not (=) includes the missing.
    assert cond("trait('plan') != 'pro'", {}) is False
    assert cond("trait('plan') != 'pro'", {"plan": "free"}) is True
    assert cond("not trait('plan') = 'pro'", {}) is True


@pytest.mark.parametrize(
    ("traits", "exists"),
    [({}, False), ({"x": None}, False), ({"x": False}, True), ({"x": 0}, True), ({"x": ""}, True)],
)
def test_exists_and_absent(traits: dict[str, Any], exists: bool) -> None:
    assert cond("trait('x').exists()", traits) is exists
    assert cond("trait('x').absent()", traits) is (not exists)


@pytest.mark.parametrize(
    ("method", "x", "expected"),
    [
        ("contains('zz', 'ell')", "hello", True),
        ("contains('zz', 'yy')", "hello", False),
        ("contains('b')", ["a", "b"], True),
        ("contains('b')", 5, False),
        ("one_of('free', 'pro')", "pro", True),
        ("one_of('free', 'pro')", "team", False),
        ("one_of(1, 2)", 2.0, True),
        ("one_of(1, 2)", True, False),
        ("starts_with('he', 'x')", "hello", True),
        ("starts_with('lo')", "hello", False),
        ("starts_with('1')", 123, False),
        ("ends_with('x', 'lo')", "hello", True),
        ("ends_with('he')", "hello", False),
        ("omits('xyz')", "hello", True),
        ("omits('xyz', 'ell')", "hello", False),
        ("omits('a')", None, False),
        ("omits('a')", ["b"], False),
        ("omits(1)", "hello", False),
        ("equals('a')", "a", True),
        ("differs('a')", "b", True),
        ("greater_than(1)", 2, True),
        ("at_least(2)", 2, True),
        ("less_than(1)", 1, False),
        ("at_most(1)", 1, True),
    ],
)
def test_method_comparators(method: str, x: Any, expected: bool) -> None:
    assert cond(f"trait('x').{method}", {"x": x}) is expected


def test_method_arguments_can_be_traits() -> None:
    assert cond("trait('x').one_of(trait('a'), trait('b'))", {"x": 2, "b": 2}) is True
    assert cond("trait('x').starts_with(trait('p'))", {"x": "abc", "p": "ab"}) is True
    assert cond("trait('x').starts_with(trait('p'))", {"x": "abc"}) is False


def test_literals_on_the_left_and_constant_conditions() -> None:
    assert cond("100 <= trait('x')", {"x": 150}) is True
    assert cond("'pro' = trait('x')", {"x": "pro"}) is True
    assert cond("1 = 1") is True
    assert cond("'a' = 'b'") is False


def test_compare_aggregate_with_trait() -> None:
    events = [ev("A"), ev("A")]
    assert cond("event('A').count() >= trait('n')", {"n": 2}, events) is True
    assert cond("event('A').count() >= trait('n')", {"n": 3}, events) is False
    assert cond("event('A').count() >= trait('n')", {}, events) is False


# ---------------------------------------------------------------------------------------------
# Boolean logic: truth tables (also checks that cost-based reordering keeps meaning)


@pytest.mark.parametrize("x", [False, True])
@pytest.mark.parametrize("y", [False, True])
@pytest.mark.parametrize("z", [False, True])
def test_boolean_truth_tables(x: bool, y: bool, z: bool) -> None:
    traits = {"x": x}
    events = [ev("Y")] if y else []
    events += [ev("Z")] if z else []
    tx, ey, ez = "trait('x') = true", "event('Y')", "event('Z').count() > 0"
    assert cond(f"{ey} and {tx}", traits, events) is (y and x)
    assert cond(f"{ey} or {tx}", traits, events) is (y or x)
    assert cond(f"{tx} or {ey} and {ez}", traits, events) is (x or (y and z))
    assert cond(f"({tx} or {ey}) and {ez}", traits, events) is ((x or y) and z)
    assert cond(f"not {tx} and not {ey} or {ez}", traits, events) is ((not x and not y) or z)
    assert cond(f"not ({tx} and {ey} and {ez})", traits, events) is (not (x and y and z))


class Untouchable(list[Event]):
    """Events that fail the test if anything scans them."""

    def __iter__(self) -> Any:
        raise AssertionError("events were scanned")


def test_trait_checks_run_before_event_scans() -> None:
    # Written event-first on purpose: the evaluator tests the cheap trait comparison first.
    fn = compile_condition(parse_condition("event('A').count() > 2 and trait('plan') = 'pro'"))
    assert fn(Profile({"plan": "free"}, Untouchable()), NOW) is False
    fn = compile_condition(parse_condition("event('A') or not trait('plan') = 'pro'"))
    assert fn(Profile({}, Untouchable()), NOW) is True
    with pytest.raises(AssertionError, match="scanned"):
        fn(Profile({"plan": "pro"}, Untouchable()), NOW)


# ---------------------------------------------------------------------------------------------
# where() predicates


def test_where_predicates() -> None:
    events = [
        ev("A", revenue=150, tags=["vip", "eu"], country="France", coupon=None),
        ev("A", revenue=50, tags=["us"], country="United States"),
        ev("A", revenue="150", country="Germany", coupon="X"),
        ev("A"),
    ]

    def n(where: str, traits: dict[str, Any] | None = None) -> Any:
        return value(f"event('A').where({where}).count()", events, traits)

    assert n("property('revenue') >= 100") == 1  # the string '150' is not a number
    assert n("property('revenue') < 100") == 1
    assert n("property('revenue') = '150'") == 1
    assert n("property('revenue') != 150") == 1  # only 50: '150' and missing don't compare
    assert n("property('tags') contains 'eu'") == 1
    assert n("property('country') contains 'an'") == 2  # France, Germany
    assert n("property('country').starts_with('United')") == 1
    assert n("property('coupon').exists()") == 1
    assert n("property('coupon').absent()") == 3
    assert n("property('revenue') > 100 or property('country') = 'Germany'") == 2
    assert n("not property('revenue') > 100") == 3
    assert n("property('revenue') >= 100 and property('tags') contains 'vip'") == 1
    assert n("property('revenue') >= trait('floor')", {"floor": 40}) == 2
    assert n("property('revenue') >= trait('floor')") == 0
    assert n("property('missing') = null") == 4


# ---------------------------------------------------------------------------------------------
# Aggregates, including empty sets and odd values


def test_count() -> None:
    assert value("event('O').count()", orders(1, None, "x")) == 3
    assert value("event('O').count()", []) == 0
    assert value("event('O').count()", [ev("P")]) == 0


def test_sum_ignores_non_numbers() -> None:
    mixed = orders(1, 2.5, "3", True, None, [4], {"n": 5}, math.nan, math.inf, -1)
    assert value("event('O').sum('v')", mixed) == 2.5
    assert value("event('O').sum('v')", orders(1, 2)) == 3
    assert type(value("event('O').sum('v')", orders(1, 2))) is int
    assert value("event('O').sum('v')", orders("a", None)) == 0
    assert value("event('O').sum('v')", []) == 0


def test_avg() -> None:
    assert value("event('O').avg('v')", orders(1, 2, "9", None, False)) == 1.5
    assert value("event('O').avg('v')", orders(2, 2)) == 2.0
    assert value("event('O').avg('v')", orders("a")) is None
    assert value("event('O').avg('v')", []) is None


def test_min_and_max() -> None:
    events = orders(3, -2.5, "-100", True, None, 10, math.nan, -math.inf)
    assert value("event('O').min('v')", events) == -2.5
    assert value("event('O').max('v')", events) == 10
    assert value("event('O').min('v')", orders("a")) is None
    assert value("event('O').max('v')", []) is None


def test_first_and_last_follow_timestamps_not_input_order() -> None:
    events = [
        Event("O", NOW - 5, {"v": "middle"}),
        Event("O", NOW - 1, {}),  # latest event lacks the property: skipped
        Event("O", NOW - 9, {"v": "oldest"}),
        Event("O", NOW - 20, {"v": None}),  # null is skipped too
        Event("O", NOW - 2, {"v": "newest"}),
    ]
    assert value("event('O').first('v')", events) == "oldest"
    assert value("event('O').last('v')", events) == "newest"
    assert value("event('O').first('v')", []) is None
    assert value("event('O').last('v')", orders(None)) is None


def test_first_and_last_ties_use_input_order() -> None:
    events = [Event("O", NOW, {"v": "a"}), Event("O", NOW, {"v": "b"}), Event("O", NOW, {"v": "c"})]
    assert value("event('O').first('v')", events) == "a"
    assert value("event('O').last('v')", events) == "c"


def test_first_and_last_return_any_json_value() -> None:
    assert value("event('O').last('v')", orders({"a": [1]})) == {"a": [1]}
    assert value("event('O').first('v')", orders(False, True)) is False


def test_mode() -> None:
    assert value("event('O').mode('v')", orders("a", "b", "b", "c")) == "b"
    assert value("event('O').mode('v')", []) is None
    assert value("event('O').mode('v')", orders(None, None)) is None
    # 1 and 1.0 are the same number; True and '1' are other values.
    assert value("event('O').mode('v')", orders(True, "1", 1, 1.0)) == 1


def test_mode_ties_go_to_the_value_seen_first() -> None:
    assert value("event('O').mode('v')", orders("b", "a", "a", "b")) == "b"
    # Earliest by timestamp, whatever the input order.
    shuffled = [
        Event("O", NOW - 1, {"v": "late"}),
        Event("O", NOW - 9, {"v": "early"}),
        Event("O", NOW - 2, {"v": "late"}),
        Event("O", NOW - 3, {"v": "early"}),
    ]
    assert value("event('O').mode('v')", shuffled) == "early"


def test_mode_minimum_frequency() -> None:
    events = orders("a", "b", "b")
    assert value("event('O').mode('v', 2)", events) == "b"
    assert value("event('O').mode('v', 3)", events) is None


def test_mode_of_lists_and_objects() -> None:
    events = orders([1, 2], {"k": 1}, {"k": 1}, [1, 2], {"k": 1})
    assert value("event('O').mode('v')", events) == {"k": 1}


def test_unique() -> None:
    events = orders("b", "a", "b", None, 1, 1.0, True, "1", [1], [1], {"k": 1})
    assert value("event('O').unique('v')", events) == ["b", "a", 1, True, "1", [1], {"k": 1}]
    assert value("event('O').unique('v')", []) == []
    assert value("event('O').unique('v').count()", events) == 7
    assert value("event('O').unique('v').count()", []) == 0


def test_unique_is_ordered_by_first_timestamp() -> None:
    shuffled = [
        Event("O", NOW - 1, {"v": "x"}),
        Event("O", NOW - 9, {"v": "y"}),
        Event("O", NOW - 5, {"v": "x"}),
    ]
    assert value("event('O').unique('v')", shuffled) == ["y", "x"]


def test_unique_list_compared_in_a_condition() -> None:
    events = orders("red", "blue")
    assert cond("event('O').unique('v') contains 'blue'", events=events) is True
    assert cond("event('O').unique('v').count() >= 3", events=events) is False


@pytest.mark.parametrize(
    ("func", "expected"),
    [
        ("count()", 2),
        ("sum('v')", 30),
        ("avg('v')", 15.0),
        ("min('v')", 10),
        ("max('v')", 20),
        ("first('v')", 10),
        ("last('v')", 20),
        ("mode('v')", 10),
        ("unique('v')", [10, 20]),
        ("unique('v').count()", 2),
    ],
)
def test_every_aggregate_respects_where_and_within(func: str, expected: Any) -> None:
    events = [
        ev("O", 3, v=10),
        ev("O", 2, v=20),
        ev("O", 1, v=99, skip=True),  # excluded by where()
        ev("O", 8, v=1000),  # excluded by within()
        ev("P", 1, v=5000),  # another event
    ]
    text = f"event('O').where(property('skip').absent()).within(7 days).{func}"
    assert value(text, events) == expected


@pytest.mark.parametrize(
    ("func", "empty"),
    [
        ("count()", 0),
        ("sum('v')", 0),
        ("avg('v')", None),
        ("min('v')", None),
        ("max('v')", None),
        ("first('v')", None),
        ("last('v')", None),
        ("mode('v')", None),
        ("unique('v')", []),
        ("unique('v').count()", 0),
    ],
)
def test_every_aggregate_on_an_empty_set(func: str, empty: Any) -> None:
    assert value(f"event('O').{func}", []) == empty
    assert value(f"event('O').within(1 day).{func}", [ev("O", 2, v=1)]) == empty


def test_aggregates_of_null_in_conditions_are_false() -> None:
    # avg of nothing is null, and null compares with nothing but null.
    assert cond("event('O').avg('v') >= 0") is False
    assert cond("event('O').avg('v') < 0") is False
    assert cond("event('O').avg('v') = null") is True


def test_results_are_plain_bools_and_compiled_functions_are_reusable() -> None:
    fn = compile_condition(parse_condition("event('A').count() >= 2 or trait('x') = 1"))
    yes = Profile({}, [ev("A"), ev("A")])
    no = Profile({"x": 2}, [ev("A")])
    for _ in range(3):
        assert fn(yes, NOW) is True
        assert fn(no, NOW) is False
