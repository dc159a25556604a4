"""Destination filters: FQL's parser, printer and evaluator, and the filter actions (pure)."""

from __future__ import annotations

import copy
import math
import pickle
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from efd.languages.filters import (
    Condition,
    Filter,
    Filtered,
    FilterSet,
    FqlError,
    apply_filters,
    compile_condition,
    evaluate,
    parse,
    parse_field_path,
    sample_point,
    to_fql,
)
from efd.languages.filters.tree import (
    FUNCTIONS,
    And,
    Call,
    Compare,
    In,
    ListExpr,
    Literal,
    Node,
    Not,
    Or,
    Path,
)


def holds(text: str, message: dict[str, Any]) -> bool:
    return compile_condition(parse(text))(message)


def value(text: str, message: dict[str, Any] | None = None) -> Any:
    """The value of an expression that need not be a condition, e.g. lowercase(event)."""
    return evaluate(parse(text, condition=False), message or {})


# -- Segment's own examples ------------------------------------------------------------------

# The object of the examples in Segment's Destination Filter Query Language reference.
SEGMENT_OBJECT: dict[str, Any] = {
    "event": "Button Clicked",
    "type": "track",
    "context": {"library": {"name": "analytics.js", "version": "1.0"}},
    "properties": {"features": ["discounts", "dark-mode"]},
}


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("event = 'Button Clicked'", True),
        ("event = 'Screen Tapped'", False),
        ("context.path.path = '/login'", False),
        ("type = 'identify' or type = 'track'", True),
        ("event = 'Button Clicked' and type = 'track'", True),
        ("match( context.library.version, '1.*' )", True),
        ("match( context.library.version, '2.*' )", False),
        ("type = 'track' and ( event = 'Click' or match( event, 'Button *' ) )", True),
        ("!contains( context.library.name, 'js' )", False),
        ("'dark-mode' in properties.features", True),
        ("'blink' in properties.features", False),
        # Its subexpression examples, on the same object.
        ("!( type in ['track', 'identify'] )", False),
    ],
)
def test_segment_reference_examples(text: str, expected: bool) -> None:
    assert holds(text, SEGMENT_OBJECT) is expected


def test_segment_example_with_match_swapped_is_refused_saying_so() -> None:
    # As printed there, 'Button *' is the text and event the pattern: false for any event.
    with pytest.raises(FqlError) as caught:
        parse("type = 'track' and ( event = 'Click' or match( 'Button *', event ) )")
    assert str(caught.value) == (
        "line 1, column 48: match() takes the text first and the pattern second; this looks "
        'like the pattern: write match(event, "Button *")'
    )


SUBEXPRESSION = (
    "( type = 'track' or type = 'identify' ) and "
    "( properties.enabled or match( traits.email, '*@company.com' ) )"
)


@pytest.mark.parametrize(
    ("message", "expected"),
    [
        ({"type": "track", "properties": {"enabled": True}}, True),
        ({"type": "identify", "traits": {"email": "ann@company.com"}}, True),
        ({"type": "identify", "traits": {"email": "ann@example.com"}}, False),
        ({"type": "page", "properties": {"enabled": True}}, False),
        # Only true itself is true: a truthy string is not.
        ({"type": "track", "properties": {"enabled": "yes"}}, False),
        ({"type": "track"}, False),
    ],
)
def test_segment_subexpression_example(message: dict[str, Any], expected: bool) -> None:
    assert holds(SUBEXPRESSION, message) is expected


@pytest.mark.parametrize(
    ("text", "pattern", "expected"),
    [  # Segment's table of glob patterns
        ("abcd", "a*d", True),
        ("", "*", True),
        ("abc", "ab", False),
        ("abcd", "a??d", True),
        ("abcd", "*d", True),
        ("ab*d", "ab\\*d", True),
        ("abCd", "ab[cC]d", True),
        ("abcd", "ab[a-z]d", True),
        ("abcd", "ab[A-Z]d", False),
        # and what efd adds or decides
        ("abcd", "ab\\*d", False),
        ("abxd", "ab[^cC]d", True),
        ("abcd", "ab[!cC]d", False),
        ("a]b", "a\\]b", True),
        ("https://shop.example/admin/users", "https://shop.example/*", True),
        ("line\nbreak", "line*", True),
        ("Order Completed", "order*", False),
        ("a-b", "a[x\\-]b", True),
    ],
)
def test_match_globs(text: str, pattern: str, expected: bool) -> None:
    message = {"text": text, "pattern": pattern}
    quoted = pattern.replace("\\", "\\\\").replace("'", "\\'")
    assert holds(f"match(text, '{quoted}')", message) is expected
    assert holds("match(text, pattern)", message) is expected  # a pattern from the message


def test_a_pattern_backslash_needs_no_doubling() -> None:
    # 'ab\*d' in FQL keeps its backslash for the glob, as Segment's example writes it.
    assert holds("match(event, 'ab\\*d')", {"event": "ab*d"})
    assert not holds("match(event, 'ab\\*d')", {"event": "abcd"})


@pytest.mark.parametrize(
    ("text", "expected"),
    [  # Segment's table of null defaults
        ("contains( null, 'x' )", False),
        ("length( null )", 0),
        ("lowercase( null )", None),
        ("typeof( null )", "null"),
        ("match( null, '*' )", False),
    ],
)
def test_segment_null_defaults(text: str, expected: Any) -> None:
    assert value(text) == expected
    assert type(value(text)) is type(expected)
    missing = text.replace("null", "properties.missing")
    assert value(missing) == expected


def test_length_of_a_missing_field_is_zero() -> None:
    # Segment's example: length( userId ) > 0 needs no typeof() guard.
    assert not holds("length( userId ) > 0", {})
    assert holds("length( userId ) > 0", {"userId": "u1"})


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("length('a')", 1),
        ("length('ア')", 3),  # bytes, as Segment counts them
        ("length('')", 0),
        ("length(['a', 'b', 'c'])", 3),
        ("snakecase('test string')", "test_string"),
        ("kebabcase('test string')", "test-string"),
        ("titlecase('test string')", "Test String"),
        ("titlecase('iPhone user\tnew')", "IPhone User\tNew"),
        ("lowercase('Order COMPLETED')", "order completed"),
        ("uppercase('Order completed')", "ORDER COMPLETED"),
    ],
)
def test_functions_on_strings(text: str, expected: Any) -> None:
    assert value(text) == expected


PROPS: dict[str, Any] = {
    "properties": {
        "total": 150,
        "price": 19.99,
        "total_text": "150",
        "flag": True,
        "tags": ["a", 1, None],
        "address": {"city": "Paris"},
        "nothing": None,
        "name": "Ann Lee",
    }
}


@pytest.mark.parametrize(
    ("field", "expected"),
    [
        ("total", "number"),
        ("price", "number"),
        ("total_text", "string"),
        ("flag", "bool"),
        ("tags", "list"),
        ("address", "object"),
        ("nothing", "null"),
        ("missing", "null"),
    ],
)
def test_typeof(field: str, expected: str) -> None:
    assert value(f"typeof(properties.{field})", PROPS) == expected


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("bool(true)", True),
        ("bool(null)", False),
        ("bool(0)", False),
        ("bool(0.5)", True),
        ("bool('')", False),
        ("bool('false')", False),
        ("bool(' FALSE ')", False),
        ("bool('true')", True),
        ("bool('no')", True),
        ("bool([])", False),
        ("bool(['x'])", True),
        ("bool(properties.address)", True),
        ("string('x')", "x"),
        ("string(12)", "12"),
        ("string(1.0)", "1"),  # JavaScript's rendering, as in webhook bodies
        ("string(true)", "true"),
        ("string(null)", "null"),
        ("string(properties.tags)", '["a",1,null]'),
        ("string(properties.address)", '{"city":"Paris"}'),
        ("number(12)", 12),
        ("number('150')", 150),
        ("number(' -1.5e2 ')", -150.0),
        ("number('.5')", 0.5),
        ("number('12abc')", None),
        ("number('')", None),
        ("number('1e999')", None),
        ("number('nan')", None),
        ("number('1_000')", None),
        ("number(null)", None),
        ("number(properties.flag)", None),
        ("length(properties.address)", None),
        ("length(properties.total)", None),
        ("lowercase(properties.total)", None),
        ("contains(properties.tags, 'a')", False),
    ],
)
def test_conversions_and_wrong_types(text: str, expected: Any) -> None:
    result = value(text, PROPS)
    assert result == expected
    assert type(result) is type(expected)


def test_string_is_what_json_stringify_gives() -> None:
    # JSON.stringify(Infinity) is "null"; efd's messages never hold one, but the rule holds.
    assert value("string(properties.x)", {"properties": {"x": math.inf}}) == "null"
    assert value("string(properties.x)", {"properties": {"x": 1e21}}) == "1e+21"


# -- operators -------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("properties.total = 150", True),
        ("properties.total = 150.0", True),
        ("properties.total != 150", False),
        ("properties.total = '150'", False),  # a number and a string differ
        ("properties.total_text = 150", False),
        ("number(properties.total_text) = 150", True),
        ("properties.flag = true", True),
        ("properties.flag = 1", False),  # a boolean is not a number
        ("properties.nothing = null", True),
        ("properties.missing = null", True),  # missing and null are the same
        ("properties.missing != 'x'", True),
        ("properties.tags = ['a', 1, null]", True),
        ("properties.tags = ['a', true, null]", False),
        ("properties.tags = ['a', 1]", False),
        ("properties.address = properties.address", True),
        ("properties.name = 'ann lee'", False),  # case matters
        ("lowercase(properties.name) = 'ann lee'", True),
        ("'Paris' = properties.address.city", True),
        ("properties.total > 100", True),
        ("properties.total > 150", False),
        ("properties.total >= 150", True),
        ("properties.total < 150.5", True),
        ("properties.total <= 149", False),
        ("properties.price < 20", True),
        ("properties.total > -1", True),
        ("properties.total_text > 100", False),  # ordering compares numbers only
        ("number(properties.total_text) > 100", True),
        ("properties.missing > 0", False),
        ("properties.missing < 0", False),
        ("properties.flag > 0", False),
        ("length(properties.tags) = 3", True),
        ("1 in properties.tags", True),
        ("true in properties.tags", False),
        ("null in properties.tags", True),
        ("'b' in properties.tags", False),
        ("'a' in properties.name", False),  # in looks in lists, not strings
        ("'a' in properties.missing", False),
        ("properties.address.city in ['Paris', 'Rome']", True),
        ("properties.total in [150, 'x']", True),
        ("properties.total in ['150']", False),
        ("properties.address in [properties.address]", True),
    ],
)
def test_comparison_operators(text: str, expected: bool) -> None:
    assert holds(text, PROPS) is expected


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("properties.flag and properties.total = 150", True),
        ("properties.flag and properties.missing", False),
        ("properties.missing or properties.flag", True),
        ("properties.missing or properties.nothing", False),
        ("!properties.missing", True),  # not true, so its negation holds
        ("not properties.flag", False),
        ("!!properties.flag", True),
        ("not not properties.flag", True),
        ("!properties.total = 150", False),  # ! negates the whole comparison
        ("not properties.total = 1 and properties.flag", True),
        ("properties.total = 1 or properties.total = 150 and properties.flag", True),
        ("(properties.total = 1 or properties.total = 150) and !properties.flag", False),
        ("properties.total_text", False),  # a string is not a condition that holds
        ("bool(properties.total_text)", True),
    ],
)
def test_boolean_operators(text: str, expected: bool) -> None:
    assert holds(text, PROPS) is expected


def test_negation_is_the_complement() -> None:
    messages = [PROPS, {}, {"properties": None}, {"properties": {"total": "150"}}]
    for text in ("properties.total > 100", "properties.flag", "contains(properties.name, 'A')"):
        for message in messages:
            assert holds(f"!({text})", message) is not holds(text, message)


@pytest.mark.parametrize(
    ("text", "message", "expected"),
    [  # the issue's examples
        (
            'type = "track" and event = "Order Completed"',
            {"type": "track", "event": "Order Completed"},
            True,
        ),
        (
            'type = "track" and event = "Order Completed"',
            {"type": "page", "event": "Order Completed"},
            False,
        ),
        ("properties.total > 100", {"properties": {"total": 100.5}}, True),
        ("properties.total > 100", {"properties": {"total": 99}}, False),
        (
            'contains(context.page.url, "/admin")',
            {"context": {"page": {"url": "https://x.example/admin/a"}}},
            True,
        ),
        (
            'contains(context.page.url, "/admin")',
            {"context": {"page": {"url": "https://x.example/"}}},
            False,
        ),
        ('contains(context.page.url, "/admin")', {"context": {"page": None}}, False),
        ('match(event, "Order*")', {"event": "Order Refunded"}, True),
        ('match(event, "Order*")', {"event": "Big Order"}, False),
        ('match(event, "Order*")', {"event": 7}, False),
        ('lowercase(event) = "order completed"', {"event": "Order COMPLETED"}, True),
        ('typeof(userId) = "string"', {"userId": "u1"}, True),
        ('typeof(userId) = "string"', {"userId": None}, False),
    ],
)
def test_issue_examples(text: str, message: dict[str, Any], expected: bool) -> None:
    assert holds(text, message) is expected


def test_field_paths() -> None:
    message = {
        "properties": {"product 1": {"price": "19.99"}, "dark-mode": True, "1st": "yes"},
        "a.b": 1,
        "and": "word",
        "context": {"traits": {"email": "x@y"}},
    }
    assert holds("properties.product\\ 1.price = '19.99'", message)  # Segment's example
    assert holds("properties.dark-mode", message)  # '-' needs no escape
    assert holds("properties.1st = 'yes'", message)
    assert holds("a\\.b = 1", message)
    assert not holds("a.b = 1", message)
    assert holds("\\and = 'word'", message)  # a field named like a keyword
    assert holds("context.traits.email = 'x@y'", message)
    assert not holds("context.traits.email.x = 'x@y'", message)  # through a string: null
    assert holds("properties.product\\ 1.price.x = null", message)


def test_quotes_and_escapes_in_strings() -> None:
    message = {"event": 'It\'s "here"', "path": "a\\b"}
    assert holds("event = 'It\\'s \"here\"'", message)
    assert holds('event = "It\'s \\"here\\""', message)
    assert holds("path = 'a\\\\b'", message)
    assert holds("path = 'a\\b'", message)  # a backslash before another letter stays


def test_multi_line_expressions() -> None:
    text = "type = 'track'\n  and event = 'Order Completed'\n  and properties.total > 100"
    assert holds(text, {"type": "track", "event": "Order Completed", "properties": {"total": 101}})


# -- errors ----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "line", "column", "words"),
    [
        ("", 1, 1, "the expression is empty"),
        ("   ", 1, 4, "the expression is empty"),
        ('userId = oops"', 1, 14, "unterminated string"),  # Segment's example of invalid FQL
        ("type = 'track", 1, 8, "unterminated string"),
        ('type = "track" and event = Debug Ping', 1, 34, "missing its quotes"),
        ('type = "track" AND event = "x"', 1, 16, "keywords are lower case: and"),
        ("type == 'track'", 1, 6, "write '='"),
        ("a = 1 && b = 2", 1, 7, "write 'and'"),
        ("a = 1 || b = 2", 1, 7, "write 'or'"),
        ("a = 1 | b = 2", 1, 7, "write 'or'"),
        ("(a = 1", 1, 7, "expected ')' to close the '(' at line 1, column 1"),
        ("a = (1", 1, 7, "expected ')'"),
        ("a = 1)", 1, 6, "expected 'and', 'or' or the end of the expression, found ')'"),
        ("a = ", 1, 5, "expected a value after '='"),
        ("= 1", 1, 1, "expected a value before '='"),
        ("a = 1 and", 1, 10, "unexpected end of the expression"),
        ("a = b = c", 1, 7, "comparisons cannot be chained"),
        ("a in 'x'", 1, 6, "'in' looks in a list"),
        ("type not in ['a']", 1, 6, "!(x in [...])"),
        ("properties.total > '100'", 1, 20, "convert it with number()"),
        ("'a' < 1", 1, 1, "'<' compares numbers, but this is a string"),
        ("true >= 1", 1, 1, "compares numbers, but this is true or false"),
        ("a > lowercase(b)", 1, 5, "compares numbers, but this is null or a string"),
        ("length(event)", 1, 1, "expected a condition (true or false), found a number"),
        ("'track'", 1, 1, "expected a condition"),
        ("a = 1 and 5", 1, 11, "expected a condition"),
        ("!lowercase(a)", 1, 2, "expected a condition"),
        ("contains(event)", 1, 1, "contains() takes 2 arguments, given 1"),
        ("typeof(a, b) = 'x'", 1, 1, "typeof() takes 1 argument, given 2"),
        ("contains(event, 5)", 1, 17, "argument 2 of contains() must be"),
        ("length(5) > 1", 1, 8, "argument 1 of length() must be"),
        ("explode(event)", 1, 1, "unknown function explode()"),
        ("Contains(event, 'x')", 1, 1, "function names are lower case: contains()"),
        ("a.b(1)", 1, 1, "a.b is not a function"),
        ("match(event, '[a')", 1, 14, "never closed"),
        ("match(event, '[]')", 1, 14, "empty"),
        ("match(event, '[z-a]')", 1, 14, "runs backwards"),
        ("match(event, 'a\\\\')", 1, 14, "lone"),
        ("a = [1, ]", 1, 9, "expected a value after ','"),
        ("a = [1 2]", 1, 8, "expected ',' or ']'"),
        ("a = 1e999", 1, 5, "out of range"),
        ("prénom = 'x'", 1, 3, "escape it with a backslash"),
        ("a. b = 1", 1, 3, "expected a field name after '.'"),
        ("a = .5", 1, 5, "unexpected '.'"),
        ("a = -b", 1, 5, "unexpected '-'"),
        ("a = @", 1, 5, "unexpected character '@'"),
        ("a\\", 1, 2, "must be followed by a character"),
        ("true(1)", 1, 1, "found 'true'"),
        ("a = in", 1, 5, "found 'in'"),
        ("type = 'track'\n  and\n  event = Debug Ping", 3, 17, "missing its quotes"),
        ("type = 'track' and\n  (event = 'x'\n", 3, 1, "to close the '(' at line 2, column 3"),
    ],
)
def test_parse_errors_name_the_position(text: str, line: int, column: int, words: str) -> None:
    with pytest.raises(FqlError) as caught:
        parse(text)
    assert (caught.value.line, caught.value.column) == (line, column), str(caught.value)
    assert words in caught.value.message
    assert str(caught.value).startswith(f"line {line}, column {column}: ")


@pytest.mark.parametrize(
    ("text", "error"),
    [
        (
            "properties.n = " + "1" * 10_000,
            "line 1, column 16: the number 111111111111… (10000 digits) is out of range: "
            "numbers are limited to a double's range, about ±1.8e308",
        ),
        (
            "a = -" + "9" * 400 + ".5",
            "line 1, column 5: the number -99999999999… (401 digits) is out of range: "
            "numbers are limited to a double's range, about ±1.8e308",
        ),
        (
            "a = 1e999",
            "line 1, column 5: the number 1e999 is out of range: "
            "numbers are limited to a double's range, about ±1.8e308",
        ),
        (
            'match(event, "\\\\")',
            "line 1, column 14: match(): the pattern ends with a lone '\\': in an FQL string "
            "'\\\\' is one backslash, so a pattern that matches a backslash is written '\\\\\\\\'",
        ),
        (
            "properties.é = 1",
            "line 1, column 12: unexpected character 'é'; in a field name, escape it with a "
            "backslash (\\é)",
        ),
        (
            "1st = 'x'",
            "line 1, column 1: '1st' is not a number; to name a field that starts with a digit, "
            "escape its first character: \\1st",
        ),
        (
            "a = 1 or -2nd = 'x'",
            "line 1, column 10: '-2nd' is not a number; to name a field that starts with '-', "
            "escape its first character: \\-2nd",
        ),
        (
            "match('Button *', event)",
            "line 1, column 7: match() takes the text first and the pattern second; this looks "
            'like the pattern: write match(event, "Button *")',
        ),
    ],
)
def test_errors_say_what_to_write_in_fql(text: str, error: str) -> None:
    with pytest.raises(FqlError) as caught:
        parse(text)
    assert str(caught.value) == error


def test_what_the_hints_say_to_write_works() -> None:
    assert holds("match(event, '\\\\\\\\')", {"event": "\\"})
    assert holds("properties.\\é = 1", {"properties": {"é": 1}})
    assert holds("\\1st = 'x' and \\-2nd = 'y'", {"1st": "x", "-2nd": "y"})
    assert holds('match(event, "Button *")', {"event": "Button Clicked"})
    # A text without a glob's characters first is taken as written: the pattern may be the
    # message's own.
    assert holds("match('abc', properties.pattern)", {"properties": {"pattern": "a?c"}})
    big = str(int(1.7976931348623157e308))
    assert holds(f"a = {big}", {"a": int(big)})


def test_nesting_is_bounded() -> None:
    assert holds("(" * 60 + "a = 1" + ")" * 60, {"a": 1})
    with pytest.raises(FqlError, match="nested more than 64 levels"):
        parse("(" * 100 + "a = 1" + ")" * 100)
    with pytest.raises(FqlError, match="nested more than 64 levels"):
        parse("!" * 100 + "a")
    with pytest.raises(FqlError, match="nested more than 64 levels"):
        parse("a in " + "[" * 100 + "]" * 100)


def test_every_function_is_tested() -> None:
    covered = {
        "contains",
        "match",
        "length",
        "lowercase",
        "uppercase",
        "snakecase",
        "kebabcase",
        "titlecase",
        "typeof",
        "bool",
        "string",
        "number",
    }
    assert set(FUNCTIONS) == covered


# -- the printer and the parser agree; the evaluator never raises ----------------------------

NAMES = st.text(min_size=1, max_size=6)
FEW_NAMES = st.sampled_from(["type", "event", "properties", "a", "b", "and", "x y"])


def paths(names: st.SearchStrategy[str]) -> st.SearchStrategy[Path]:
    return st.lists(names, min_size=1, max_size=3).map(lambda s: Path(tuple(s)))


NUMBERS = st.one_of(st.integers(), st.floats(allow_nan=False, allow_infinity=False))
SCALARS = st.one_of(st.none(), st.booleans(), NUMBERS, st.text(max_size=8))


def _not_swapped(call: Call) -> bool:
    """What the parser refuses as match()'s arguments swapped: a glob as the text."""
    text, pattern = call.args
    return not (
        isinstance(text, Literal)
        and isinstance(text.value, str)
        and any(c in text.value for c in "*?[")
        and not isinstance(pattern, Literal)
    )


def trees(names: st.SearchStrategy[str]) -> st.SearchStrategy[Node]:
    """Conditions that pass the parser's checks, built from the grammar's every form."""
    path = paths(names)
    literal = SCALARS.map(Literal)
    text = st.one_of(st.text(max_size=6).map(Literal), st.just(Literal(None)), path)
    pattern = st.one_of(st.text(alphabet="ab*?", max_size=5).map(Literal), path)

    def text_call(arg: st.SearchStrategy[Node]) -> st.SearchStrategy[Node]:
        names_ = ["lowercase", "uppercase", "snakecase", "kebabcase", "titlecase"]
        return st.builds(lambda n, a: Call(n, (a,)), st.sampled_from(names_), arg)

    number = st.one_of(
        NUMBERS.map(Literal),
        path,
        st.builds(lambda a: Call("length", (a,)), st.one_of(text, path)),
        st.builds(lambda a: Call("number", (a,)), st.one_of(text, NUMBERS.map(Literal))),
    )

    def values(children: st.SearchStrategy[Node]) -> st.SearchStrategy[Node]:
        return st.one_of(
            st.lists(children, max_size=3).map(lambda xs: ListExpr(tuple(xs))),
            text_call(st.one_of(text, path)),
            st.builds(lambda n, a: Call(n, (a,)), st.sampled_from(["typeof", "string"]), children),
        )

    value = st.recursive(st.one_of(literal, path), values, max_leaves=4)

    def conditions(children: st.SearchStrategy[Node]) -> st.SearchStrategy[Node]:
        ops = st.sampled_from(["<", "<=", ">", ">="])
        return st.one_of(
            st.builds(Compare, st.sampled_from(["=", "!="]), value, value),
            st.builds(Compare, ops, number, number),
            st.builds(
                In,
                value,
                st.one_of(path, st.lists(value, max_size=3).map(lambda xs: ListExpr(tuple(xs)))),
            ),
            st.builds(Not, children),
            st.lists(children, min_size=2, max_size=3).map(lambda xs: And(tuple(xs))),
            st.lists(children, min_size=2, max_size=3).map(lambda xs: Or(tuple(xs))),
            st.builds(lambda a, b: Call("contains", (a, b)), text, text),
            st.builds(lambda a, b: Call("match", (a, b)), text, pattern).filter(_not_swapped),
            st.builds(lambda a: Call("bool", (a,)), value),
        )

    base = st.one_of(path, st.booleans().map(Literal))
    return st.recursive(base, conditions, max_leaves=8)


@settings(max_examples=400, deadline=None)
@given(trees(NAMES))
def test_printing_and_parsing_round_trip(tree: Node) -> None:
    text = to_fql(tree)
    again = parse(text)
    assert again == tree
    assert to_fql(again) == text  # also tells 1 from true and 1.0, which == does not


JSON = st.recursive(
    st.one_of(SCALARS, st.floats()),  # NaN and infinities too: nothing may raise
    lambda children: st.one_of(
        st.lists(children, max_size=3), st.dictionaries(FEW_NAMES, children, max_size=4)
    ),
    max_leaves=12,
)


@settings(max_examples=400, deadline=None)
@given(trees(FEW_NAMES), st.dictionaries(FEW_NAMES, JSON, max_size=5))
def test_the_evaluator_never_raises(tree: Node, message: dict[str, Any]) -> None:
    text = to_fql(tree)
    result = holds(text, message)
    assert result in (True, False)
    assert holds(f"!({text})", message) is not result


# -- actions ---------------------------------------------------------------------------------


def drop(when: str) -> Filter:
    return Filter(Condition(when), "drop")


def sample(when: str, percent: float) -> Filter:
    return Filter(Condition(when), "sample", percent=percent)


def fields(action: str, when: str = "all", **objects: list[str]) -> Filter:
    paths_ = tuple((name, tuple(parse_field_path(p) for p in ps)) for name, ps in objects.items())
    return Filter(Condition(when), action, fields=paths_)  # type: ignore[arg-type]


def message(message_id: str = "m-1", **extra: Any) -> dict[str, Any]:
    body: dict[str, Any] = {
        "version": 1,
        "type": "track",
        "event": "Order Completed",
        "userId": "u1",
        "messageId": message_id,
        "properties": {
            "total": 120,
            "email": "ann@example.com",
            "phone": "555",
            "products": [
                {"sku": "a1", "price": 10, "newElement": "x"},
                {"sku": "b2", "price": 20},
                "loose",
            ],
            "address": {"city": "Paris", "street": "1 rue"},
        },
        "context": {"ip": "203.0.113.9", "page": {"url": "https://x.example/a", "title": "A"}},
    }
    body.update(extra)
    return body


def test_no_filters_pass_the_message_itself() -> None:
    msg = message()
    assert apply_filters([], msg) is msg
    assert not FilterSet([])


def test_drop() -> None:
    filters = [drop('type = "track" and event = "Debug Ping"')]
    assert apply_filters(filters, message(event="Order Completed"))["event"] == "Order Completed"  # type: ignore[index]
    result = apply_filters(filters, message(event="Debug Ping"))
    assert result == Filtered(0, "drop", 'type = "track" and event = "Debug Ping"')
    assert isinstance(result, Filtered)
    assert result.reason == 'filters[0] drop, if type = "track" and event = "Debug Ping"'


def test_drop_all() -> None:
    assert isinstance(apply_filters([drop("all")], message()), Filtered)


def test_drop_fields_the_issue_example() -> None:
    msg = message(type="identify", traits={"email": "ann@example.com", "plan": "pro"})
    f = fields("drop_fields", properties=["email", "phone"], context=["ip"], traits=["email"])
    result = apply_filters([f], msg)
    assert isinstance(result, dict)
    assert "email" not in result["properties"]
    assert "phone" not in result["properties"]
    assert result["properties"]["total"] == 120
    assert result["context"] == {"page": msg["context"]["page"]}
    assert result["traits"] == {"plan": "pro"}
    assert result["userId"] == "u1"


def test_drop_fields_nested_and_through_lists() -> None:
    result = apply_filters(
        [fields("drop_fields", properties=["products.newElement", "address.street"])], message()
    )
    assert isinstance(result, dict)
    props = result["properties"]
    assert props["products"] == [{"sku": "a1", "price": 10}, {"sku": "b2", "price": 20}, "loose"]
    assert props["address"] == {"city": "Paris"}


def test_drop_fields_of_what_is_absent_changes_nothing() -> None:
    msg = message()
    f = fields("drop_fields", properties=["nope", "address.nope", "email.x"], traits=["email"])
    assert apply_filters([f], msg) is msg


def test_allow_fields() -> None:
    msg = message()
    result = apply_filters(
        [fields("allow_fields", properties=["total", "products.sku", "address"], context=["ip"])],
        msg,
    )
    assert isinstance(result, dict)
    # Only the listed fields of each object named; a list's objects keep only theirs, and a
    # value that is not an object has no listed field to keep.
    assert result["properties"] == {
        "total": 120,
        "products": [{"sku": "a1"}, {"sku": "b2"}],
        "address": {"city": "Paris", "street": "1 rue"},
    }
    assert result["context"] == {"ip": "203.0.113.9"}
    assert result["event"] == "Order Completed"
    assert result["messageId"] == "m-1"


def test_allow_fields_leaves_objects_it_does_not_name() -> None:
    msg = message()
    result = apply_filters([fields("allow_fields", traits=["email"])], msg)
    assert result is msg  # no traits in a track message: nothing to reduce


def test_allow_fields_with_an_empty_list_empties_the_object() -> None:
    result = apply_filters([fields("allow_fields", properties=[])], message())
    assert isinstance(result, dict)
    assert result["properties"] == {}


def test_a_shorter_allowed_path_keeps_the_whole_value() -> None:
    for paths_ in (["address", "address.city"], ["address.city", "address"]):
        result = apply_filters([fields("allow_fields", properties=paths_)], message())
        assert isinstance(result, dict)
        assert result["properties"] == {"address": {"city": "Paris", "street": "1 rue"}}


def test_allow_fields_that_keep_everything_return_the_message_itself() -> None:
    msg = message()
    everything = list(msg["properties"])
    assert apply_filters([fields("allow_fields", properties=everything)], msg) is msg


def test_a_non_object_top_level_value_is_left_alone() -> None:
    msg = message(properties=None)
    assert apply_filters([fields("allow_fields", properties=["total"])], msg) is msg


def test_field_filters_apply_only_when_their_condition_holds() -> None:
    f = fields("drop_fields", 'event = "Signed Up"', properties=["email"])
    msg = message()
    assert apply_filters([f], msg) is msg
    result = apply_filters([f], message(event="Signed Up"))
    assert isinstance(result, dict)
    assert "email" not in result["properties"]


def test_two_allow_filters_keep_what_both_allow() -> None:
    result = apply_filters(
        [
            fields("allow_fields", properties=["total", "email"]),
            fields("allow_fields", properties=["email", "phone"]),
        ],
        message(),
    )
    assert isinstance(result, dict)
    assert result["properties"] == {"email": "ann@example.com"}


def test_the_order_is_segments_whatever_the_order_configured() -> None:
    # Listed last, the sample filter still runs first: it is the one named.
    filters = [
        fields("allow_fields", properties=["total"]),
        fields("drop_fields", properties=["total"]),
        drop("all"),
        sample("all", 0),
    ]
    result = apply_filters(filters, message())
    assert result == Filtered(3, "sample", "all", 0)
    # Without the sample, the drop comes before any field filter.
    assert apply_filters(filters[:3], message()) == Filtered(2, "drop", "all")
    # drop_fields runs before allow_fields: allowed 'total' but dropped first, nothing is left.
    result = apply_filters(filters[:2], message())
    assert isinstance(result, dict)
    assert result["properties"] == {}


def test_conditions_see_the_message_as_received() -> None:
    # The first filter removes properties.email; the second still sees it.
    filters = [
        fields("drop_fields", properties=["email"]),
        fields("drop_fields", 'contains(properties.email, "@example.com")', context=["ip"]),
    ]
    result = apply_filters(filters, message())
    assert isinstance(result, dict)
    assert "email" not in result["properties"]
    assert "ip" not in result["context"]


def test_filters_never_modify_the_message() -> None:
    msg = message(traits={"email": "x"})
    before = copy.deepcopy(msg)
    filters = [
        fields("drop_fields", properties=["email", "products.price", "address.city"]),
        fields("allow_fields", properties=["products", "address"], context=["page.url"]),
        fields("drop_fields", traits=["email"]),
    ]
    for destination in range(3):  # several destinations share the one message
        result = apply_filters(filters[destination:], msg)
        assert result is not msg
        assert msg == before
    result = apply_filters(filters, msg)
    assert isinstance(result, dict)
    assert result["properties"] == {
        "products": [{"sku": "a1", "newElement": "x"}, {"sku": "b2"}, "loose"],
        "address": {"street": "1 rue"},
    }
    assert result["context"] == {"page": {"url": "https://x.example/a"}}
    assert result["traits"] == {}


@settings(max_examples=300, deadline=None)
@given(
    st.dictionaries(FEW_NAMES, JSON, max_size=4),
    st.sampled_from(["drop_fields", "allow_fields"]),
    st.lists(st.lists(FEW_NAMES, min_size=1, max_size=3), max_size=3),
)
def test_field_filters_never_modify_any_message(
    props: dict[str, Any], action: str, paths_: list[list[str]]
) -> None:
    msg = {"type": "track", "messageId": "m", "properties": props, "context": props}
    before = copy.deepcopy(msg)
    joined = [".".join(path) for path in paths_ if all("." not in p for p in path)]
    result = apply_filters([fields(action, properties=joined)], msg)
    assert msg == before
    assert isinstance(result, dict)
    assert result["context"] is msg["context"]  # an object no filter names is shared, unchanged
    if action == "allow_fields":
        allowed = {path.split(".")[0] for path in joined}
        assert set(result["properties"]) <= allowed
    else:
        dropped = {path for path in joined if "." not in path}
        assert not dropped & set(result["properties"])


# -- sampling --------------------------------------------------------------------------------


def test_sampling_is_deterministic_per_message_id() -> None:
    filters = [sample('event = "Page Scrolled"', 10)]
    choices = {}
    for i in range(200):
        msg = message(f"id-{i}", event="Page Scrolled")
        choices[i] = isinstance(apply_filters(filters, msg), Filtered)
    for i in range(200):  # a redelivery: the same message again, even with other content
        msg = message(f"id-{i}", event="Page Scrolled", properties={"again": True})
        assert isinstance(apply_filters(filters, msg), Filtered) is choices[i]
    assert 0 < sum(choices.values()) < 200


def test_sampling_keeps_about_the_percent() -> None:
    for percent in (10, 50, 90):
        filters = [sample("all", percent)]
        kept = sum(
            not isinstance(apply_filters(filters, {"messageId": f"msg-{i}"}), Filtered)
            for i in range(20_000)
        )
        # Binomial with n = 20,000: six standard deviations is at most 2.1 percentage points.
        assert abs(kept / 20_000 * 100 - percent) < 2.2, (percent, kept)


def test_a_smaller_sample_is_a_subset_of_a_larger_one() -> None:
    ids = [f"order-{i}" for i in range(2000)]

    def kept(percent: float) -> set[str]:
        filters = [sample("all", percent)]
        return {
            i for i in ids if not isinstance(apply_filters(filters, {"messageId": i}), Filtered)
        }

    small, large = kept(10), kept(20)
    assert small < large
    assert kept(0) == set()
    assert kept(100) == set(ids)


def test_sample_point_is_in_the_unit_interval_and_spread() -> None:
    points = [sample_point(f"id-{i}") for i in range(1000)]
    assert all(0 <= p < 1 for p in points)
    assert len(set(points)) == 1000
    assert sample_point("id-1") == sample_point("id-1")
    assert sample_point("\ud800") == sample_point("\ud800")  # a lone surrogate is hashed too


def test_sample_only_applies_when_its_condition_holds() -> None:
    filters = [sample('event = "Page Scrolled"', 0)]
    assert not isinstance(apply_filters(filters, message(event="Order Completed")), Filtered)
    result = apply_filters(filters, message(event="Page Scrolled"))
    assert result == Filtered(0, "sample", 'event = "Page Scrolled"', 0)
    assert isinstance(result, Filtered)
    assert result.reason == 'filters[0] sample 0 %, if event = "Page Scrolled": sampled out'


def test_a_message_without_a_message_id_is_sampled_as_an_empty_one() -> None:
    filters = [sample("all", 50)]
    expected = isinstance(apply_filters(filters, {"messageId": ""}), Filtered)
    assert isinstance(apply_filters(filters, {}), Filtered) is expected
    assert isinstance(apply_filters(filters, {"messageId": 5}), Filtered) is expected


# -- conditions and filter sets travel to other processes as text ----------------------------


def test_conditions_compare_and_pickle_by_text() -> None:
    condition = Condition('event = "x"')
    assert condition == Condition('event = "x"')
    assert condition != Condition('event = "y"')
    assert hash(condition) == hash(Condition('event = "x"'))
    again = pickle.loads(pickle.dumps(condition))  # noqa: S301
    assert again == condition
    assert again.matches({"event": "x"})
    assert not again.matches({"event": "y"})
    assert Condition("all").root is None
    assert Condition("all").matches({})
    assert Condition(" all\n").matches({})
    with pytest.raises(FqlError, match='write "all" in lower case'):
        Condition("All")
    assert not Condition("\\All").matches({})  # a field named All, written so on purpose


def test_filter_sets_pickle() -> None:
    filters = FilterSet([drop('event = "Debug Ping"'), fields("drop_fields", properties=["email"])])
    again = pickle.loads(pickle.dumps(filters))  # noqa: S301
    assert isinstance(again.apply(message(event="Debug Ping")), Filtered)
    result = again.apply(message())
    assert isinstance(result, dict)
    assert "email" not in result["properties"]


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("email", ("email",)),
        ("page.url", ("page", "url")),
        ("a\\.b.c", ("a.b", "c")),
        ("a\\\\.b", ("a\\", "b")),
        ("product 1.price", ("product 1", "price")),
    ],
)
def test_field_paths_of_field_filters(text: str, expected: tuple[str, ...]) -> None:
    assert parse_field_path(text) == expected


@pytest.mark.parametrize("text", ["", ".", "a.", ".a", "a..b", "a\\"])
def test_bad_field_paths(text: str) -> None:
    with pytest.raises(ValueError, match=r"empty name|lone"):
        parse_field_path(text)
