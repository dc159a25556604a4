"""The trigger language (efd/languages/triggers): every construct it parses, what it means on
a message (Segment's evaluator's semantics; tests/integration/test_triggers_compat.py checks
them against Segment's code), every error it reports, and that neither parsing nor matching
ever raises anything else."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from efd.languages.toolkit import And, Or
from efd.languages.triggers import Condition, Field, TriggerError, matches, parse, to_trigger


def holds(text: str, message: Any) -> bool:
    return matches(parse(text), message)


def error(text: str) -> TriggerError:
    with pytest.raises(TriggerError) as caught:
        parse(text)
    return caught.value


ORDER = {
    "type": "track",
    "event": "Order Completed",
    "userId": "u1",
    "name": "Home",
    "properties": {
        "total": 30,
        "price": 9.5,
        "sku": "ABC-123",
        "paid": True,
        "gift": False,
        "none": None,
        "zero": 0,
        "empty": "",
        "items": [{"id": "a"}, {"id": "b"}],
        "a b": 1,
        "a.b": "flat",
        "and": "word",
        "emoji": "😀x",
        "big": 12345678901234567890,
    },
    "traits": {"plan": "pro", "seats": 5},
    "context": {"page": {"url": "https://example.com/cart"}, "locale": "en-GB"},
}


# ---------------------------------------------------------------------------------------------
# Parsing: the tree of each construct


@pytest.mark.parametrize(
    ("text", "field", "op", "value"),
    [
        ('type = "track"', Field("type"), "=", "track"),
        ('event != "x"', Field("event"), "!=", "x"),
        ('name = "Home"', Field("name"), "=", "Home"),
        ('userId = "u1"', Field("userId"), "=", "u1"),
        ("properties.total = 30", Field("properties", ("total",)), "number_equals", 30.0),
        ("properties.total != 30", Field("properties", ("total",)), "number_not_equals", 30.0),
        ("traits.seats < 5", Field("traits", ("seats",)), "<", 5.0),
        ("traits.seats <= -1.5", Field("traits", ("seats",)), "<=", -1.5),
        ("context.n > 0", Field("context", ("n",)), ">", 0.0),
        ("context.n >= 007", Field("context", ("n",)), ">=", 7.0),
        ("properties.a != null", Field("properties", ("a",)), "exists", None),
        ("properties.a = null", Field("properties", ("a",)), "not_exists", None),
        ("properties.a = true", Field("properties", ("a",)), "is_true", None),
        ("properties.a = false", Field("properties", ("a",)), "is_false", None),
        ('properties.a = "5"', Field("properties", ("a",)), "=", "5"),
        # Segment's parser: != true compares with the text "true".
        ("properties.a != true", Field("properties", ("a",)), "!=", "true"),
        ("name != null", Field("name"), "exists", None),
        ("userId = null", Field("userId"), "not_exists", None),
        ("userId = true", Field("userId"), "is_true", None),
        ("name = true", Field("name"), "=", "true"),
        # type and event compare text, whatever the value.
        ("type = null", Field("type"), "=", "null"),
        ("event = true", Field("event"), "=", "true"),
        ("event = 1.50", Field("event"), "=", "1.5"),
        ("event = -0", Field("event"), "=", "0"),
        ("event = 12345678901234567890123", Field("event"), "=", "1.2345678901234568e+22"),
        ("event < 5", Field("event"), "<", 5.0),
        ("userId = 5", Field("userId"), "=", "5"),
        ('contains(event, "Order")', Field("event"), "contains", "Order"),
        ('!contains(properties.sku, "X")', Field("properties", ("sku",)), "not_contains", "X"),
        (
            'match(context.page.url, "https*")',
            Field("context", ("page", "url")),
            "starts_with",
            "https",
        ),
        ('!match(userId, "u*")', Field("userId"), "not_starts_with", "u"),
        ('match(name, "*me")', Field("name"), "ends_with", "me"),
        ('!match(traits.plan, "*o")', Field("traits", ("plan",)), "not_ends_with", "o"),
        ('match(event, "*")', Field("event"), "starts_with", ""),
        # Strings are as written: a backslash is an ordinary character.
        ('event = "a\\b"', Field("event"), "=", "a\\b"),
        ('event = ""', Field("event"), "=", ""),
        ('event = "a\tb"', Field("event"), "=", "a\tb"),
        ('event = "a\nb"', Field("event"), "=", "a\nb"),
        # Paths: escapes, and keys split where Segment's evaluator splits them.
        ("properties.a\\ b = 1", Field("properties", ("a b",)), "number_equals", 1.0),
        ("properties.a\\.b = 1", Field("properties", ("a", "b")), "number_equals", 1.0),
        ("properties.a\\[0\\] = 1", Field("properties", ("a", "0")), "number_equals", 1.0),
        (
            "properties.items.\\0.id = 1",
            Field("properties", ("items", "0", "id")),
            "number_equals",
            1.0,
        ),
        ("properties.\\and = 1", Field("properties", ("and",)), "number_equals", 1.0),
        ("properties.order-id_2 = 1", Field("properties", ("order-id_2",)), "number_equals", 1.0),
        ("properties.true = 1", Field("properties", ("true",)), "number_equals", 1.0),
        ('event="x"', Field("event"), "=", "x"),
    ],
)
def test_condition_trees(text: str, field: Field, op: str, value: Any) -> None:
    tree = parse(text)
    assert tree == Condition(field, op, value)  # type: ignore[arg-type]
    assert parse(to_trigger(tree)) == tree


def test_and_or_and_one_level_of_parentheses() -> None:
    a, b, c = (Condition(Field("event"), "=", x) for x in "abc")
    assert parse('event = "a" and event = "b"') == And((a, b))
    assert parse('event = "a" or event = "b" or event = "c"') == Or((a, b, c))
    tree = parse('(event = "a" or event = "b") and event = "c"')
    assert tree == And((Or((a, b)), c))
    assert to_trigger(tree) == '(event = "a" or event = "b") and event = "c"'
    assert parse('event = "a" or (event = "b" and event = "c")') == Or((a, And((b, c))))
    assert parse('(event = "a")') == a
    assert parse('(event = "a" and contains(event, "b"))') == And(
        (a, Condition(Field("event"), "contains", "b"))
    )
    assert parse('event = "a" and\n  event = "b"') == And((a, b))
    assert parse('(event = "a")or\tevent = "b"') == Or((a, b))


def test_positions() -> None:
    tree = parse('type = "track" and\n  contains(event, "x") and event = "a\nb" and name = "c"')
    assert isinstance(tree, And)
    assert [item.pos for item in tree.items] == [(1, 1), (2, 3), (2, 28), (3, 8)]


# ---------------------------------------------------------------------------------------------
# Matching


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ('type = "track" and event = "Order Completed"', True),
        ('type = "Track"', False),  # text compares case and all
        ('type = "identify" or event = "Order Completed"', True),
        ('(type = "identify" or type = "track") and userId = "u1"', True),
        ("properties.total = 30", True),
        ("properties.total = 30.0", True),
        ('properties.total = "30"', False),  # = with text wants text
        ("properties.total != 31", True),
        ("properties.missing != 31", False),  # the number operators want a number
        ('properties.missing != "x"', True),  # != text is true for anything but that text
        ('properties.total != "30"', True),
        ("properties.total > 29.5", True),
        ("properties.total >= 30", True),
        ("properties.total < 30", False),
        ("properties.price <= 9.5", True),
        ("properties.sku > 1", False),
        ("properties.big = 12345678901234567000", True),  # both are the same double
        ("properties.paid = true", True),
        ("properties.gift = false", True),
        ("properties.none = false", False),
        ("properties.paid != true", True),  # compares with the text "true"
        ("properties.none = null", True),
        ("properties.missing = null", True),
        ("properties.zero != null", True),
        ("properties.none != null", False),
        ('contains(properties.sku, "C-1")', True),
        ('contains(properties.total, "3")', False),
        ('!contains(properties.sku, "Z")', True),
        ('!contains(properties.missing, "Z")', False),  # the text operators want text
        ('match(context.page.url, "https://*")', True),
        ('match(context.locale, "*GB")', True),
        ('!match(context.locale, "*US")', True),
        ('match(event, "*")', True),
        ('match(properties.missing, "*")', False),
        ("context.page.url != null", True),
        ('properties.items.\\1.id = "b"', True),
        ("properties.items.length = 2", True),
        ("properties.sku.length = 7", True),
        ('properties.sku.\\0 = "A"', True),
        ("properties.emoji.length = 3", True),  # UTF-16 units, as JavaScript counts
        ('properties.emoji.\\2 = "x"', True),
        ("properties.items.\\01 != null", False),  # not an index JavaScript reads
        ("properties.a\\ b = 1", True),
        ('properties.a\\.b = "flat"', False),  # the key a.b is never read: a, then b
        ('properties.\\and = "word"', True),
        # A walk that meets 0, "", false or null stops there and yields it.
        ("properties.zero.x.y = 0", True),
        ('properties.empty.x = ""', True),
        ("properties.gift.x = false", True),
        ("properties.none.x = null", True),
        ("properties.total.x != null", False),
        ('name = "Home" and userId = true', False),
        ("userId = true", False),
        ("traits.seats = 5 and traits.plan != null", True),
    ],
)
def test_matching(text: str, expected: bool) -> None:
    assert holds(text, ORDER) is expected


def test_messages_without_fields_or_not_objects() -> None:
    assert holds('event != "x"', {}) is True
    assert holds('event = "x"', {}) is False
    assert holds("properties.a = null", {"properties": "text"}) is True
    assert holds("properties.length = 4", {"properties": "text"}) is True
    assert holds('type = "track"', None) is False
    assert holds('type != "track"', None) is False
    assert holds('type != "track"', ["track"]) is True
    assert holds("properties.big < 0", {"properties": {"big": -(10**400)}}) is True


# ---------------------------------------------------------------------------------------------
# Errors: where, and what to write instead


@pytest.mark.parametrize(
    ("text", "position", "message"),
    [
        ("", (1, 1), "the expression is empty"),
        ("   ", (1, 4), "the expression is empty"),
        ('type = "a" and event = "b" or name = "c"', (1, 1), "'and' and 'or' cannot be mixed"),
        ('type = "a" or event = "b" and name = "c"', (1, 15), "'and' and 'or' cannot be mixed"),
        ('((type = "a"))', (1, 2), "parentheses cannot be nested"),
        ('(type = "a" and (event = "b"))', (1, 17), "parentheses cannot be nested"),
        ("()", (1, 2), "expected a condition inside the parentheses"),
        ('(type = "a"', (1, 12), "expected ')' to close the '(' at line 1, column 1"),
        ('(contains(event, "a") and type = "b")', (1, 2), "contains() and match() must come last"),
        ('type = "a")', (1, 11), "expected 'and', 'or' or the end of the expression, found ')'"),
        ('type = "a" AND event = "b"', (1, 12), "write it in lower case: and"),
        ('type = "a" event = "b"', (1, 12), "join conditions with 'and' or 'or'"),
        ('userId = null event = "b"', (1, 15), "join conditions with 'and' or 'or'"),
        ('(type = "a") event = "b"', (1, 14), "join conditions with 'and' or 'or'"),
        ('type = "a" and', (1, 15), "expected a condition, e.g. type"),
        ('and type = "a"', (1, 1), "expected a condition before 'and'"),
        ('type = "a" or(event = "b")', (1, 14), "write a space after 'or'"),
        ('type = "a" and!contains(event, "b")', (1, 15), "write a space after 'and'"),
        ('type = "a" && event = "b"', (1, 12), "'&&' is not trigger syntax; write 'and'"),
        ('type = "a" || event = "b"', (1, 12), "'||' is not trigger syntax; write 'or'"),
        ('type == "a"', (1, 6), "'==' is not trigger syntax; write '='"),
        ('type <> "a"', (1, 6), "'<>' is not trigger syntax; write '!='"),
        ('not contains(event, "x")', (1, 1), "'not' is not trigger syntax"),
        ('!type = "a"', (1, 1), "'!' negates only contains() and match()"),
        ('! contains(event, "x")', (1, 1), "'!' negates only contains() and match()"),
        ('!(type = "a")', (1, 1), "'!' negates only contains() and match()"),
        ("type = 'track'", (1, 8), "a string is written in double quotes"),
        ('type = "track', (1, 8), 'unterminated string: the " opened here is never closed'),
        ('type = "a"or event = "b"', (1, 11), "expected a space after the string, found 'o'"),
        ('event = 1and type = "a"', (1, 10), "expected a space after the number"),
        ("event = 1e3", (1, 9), "has an exponent"),
        ("event = 1.", (1, 11), "expected a digit after the decimal point"),
        ("event = 1.5.3", (1, 12), "a number has one decimal point"),
        ("event = .5", (1, 9), "unexpected '.'"),
        ("event = 1" + "0" * 400, (1, 9), "is out of range"),
        ("properties.total !=3", (1, 18), "write a space on each side of '!='"),
        ("properties.total<3", (1, 17), "write a space on each side of '<'"),
        ("properties.total <=3", (1, 18), "write a space on each side of '<='"),
        ('event =~ "x"', (1, 8), "unexpected character '~'"),
        ('event\r= "x"', (1, 6), "unexpected character '\\r'; separate words with spaces"),
        ('event\u00a0= "x"', (1, 6), "separate words with spaces"),
        ('Type = "track"', (1, 1), "unknown field Type: a trigger tests type, event, name, userId"),
        ('userid = "u"', (1, 1), "did you mean userId?"),
        ('anonymousId = "a"', (1, 1), "unknown field anonymousId"),
        ('type.x = "a"', (1, 1), "type has no fields"),
        ("properties = 1", (1, 1), "expected a path in properties, e.g. properties.total"),
        ("properties.\\. = 1", (1, 1), "names no key in properties"),
        ("properties.and = 1", (1, 12), "escape it: \\and"),
        ("properties.1a = 1", (1, 12), "escape its first character: \\1"),
        ("properties. a = 1", (1, 12), "expected a field name right after '.'"),
        ("properties.$x = 1", (1, 12), "escape it with a backslash (\\$)"),
        ("properties.a@b = 1", (1, 13), "escape it with a backslash (\\@)"),
        ("_x = 1", (1, 1), "a field name starts with a letter"),
        ("properties.a\\", (1, 13), "must be followed by a character"),
        ("type", (1, 5), "expected an operator (=, !=, <, <=, >, >=) after type, found the end"),
        ('type contains "x"', (1, 6), 'contains is a function: contains(type, "text")'),
        ("type =", (1, 7), "expected a value after '=', found the end of the expression"),
        ("type = foo", (1, 8), 'to compare with the text, write "foo"'),
        ("type = TRUE", (1, 8), "write it in lower case: true"),
        ("type = (", (1, 8), "expected a value after '=', found '('"),
        ('properties.a < "5"', (1, 16), "'<' compares numbers: expected a number"),
        ("properties.a > null", (1, 16), "'>' compares numbers"),
        ("contains = 1", (1, 10), "contains is a function: expected '(' after it"),
        ('contains("x", event)', (1, 10), "expected a field as the first argument of contains()"),
        ('contains(type, "x")', (1, 10), "contains() cannot test type"),
        ('match(type, "x*")', (1, 7), "match() cannot test type"),
        ('contains(event "x")', (1, 16), "expected ',' after the first argument of contains()"),
        ("contains(event, 5)", (1, 17), "the second argument of contains() is text in double"),
        ('contains(event, "x"', (1, 20), "expected ')' after the second argument of contains()"),
        ('match(event, "abc")', (1, 14), "match() takes a pattern with one '*'"),
        ('match(event, "a*b")', (1, 14), "match() takes a pattern with one '*'"),
        ('match(event, "*a*")', (1, 14), "match() takes a pattern with one '*'"),
        ('match(event, "**")', (1, 14), "match() takes a pattern with one '*'"),
        ('type = "a" and\n  event = ?', (2, 11), "unexpected character '?'"),
    ],
)
def test_errors(text: str, position: tuple[int, int], message: str) -> None:
    caught = error(text)
    assert message in caught.message, caught.message
    assert (caught.line, caught.column) == position, caught


def test_nothing_is_nested_past_the_toolkit_limit() -> None:
    # One level of parentheses at most, so a deep text fails at its second '('.
    caught = error("(" * 10_000 + 'type = "a"' + ")" * 10_000)
    assert (caught.line, caught.column) == (1, 2)


# ---------------------------------------------------------------------------------------------
# Never raising


JSON = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(min_value=-(10**400), max_value=10**400)
    | st.floats(allow_nan=True, allow_infinity=True)
    | st.text(max_size=6),
    lambda inner: (
        st.lists(inner, max_size=4)
        | st.dictionaries(
            st.sampled_from(["a", "b", "0", "length", "type", "x"]), inner, max_size=4
        )
    ),
    max_leaves=12,
)
FIELDS = ["type", "event", "name", "userId", "properties.a", "traits.a.b", "context.\\0.length"]
FIELDS += ["properties.length", "properties.a.\\0", "traits.x.a"]
TRIGGERS = [
    f"{field} {op} {value}"
    for field in FIELDS
    for op in ("=", "!=", "<", ">=")
    for value in ('"a"', "0", "-1.5", "true", "null")
    if op in ("=", "!=") or value[0] in "-0"
]
TRIGGERS += [
    f'{call}({field}, "{pattern}")'
    for call in ("contains", "!match")
    for field in FIELDS[1:]
    for pattern in ("a*", "*b")
]


@settings(max_examples=300, deadline=None)
@given(
    message=st.dictionaries(
        st.sampled_from(["type", "event", "name", "userId", "properties", "traits", "context"]),
        JSON,
    )
    | JSON,
    picks=st.lists(st.sampled_from(TRIGGERS), min_size=1, max_size=4),
    word=st.sampled_from([" and ", " or "]),
)
def test_matching_never_raises(message: Any, picks: list[str], word: str) -> None:
    assert isinstance(matches(parse(word.join(picks)), message), bool)


@settings(max_examples=500, deadline=None)
@given(
    st.text(
        alphabet=st.sampled_from(list("()!=<>\"'., \\-_aeyptrsnocmh0159*\n\t\r&|$")), max_size=40
    )
    | st.text(max_size=20)
)
def test_parsing_raises_only_trigger_errors(text: str) -> None:
    try:
        tree = parse(text)
    except TriggerError:
        return
    assert parse(to_trigger(tree)) == tree
