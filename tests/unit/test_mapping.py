"""The mapping language (efd/languages/mapping): each directive on a message, each problem a
mapping is refused for at load, and a fuzz that applying never raises anything but
MappingError. Agreement with Segment's kit itself is tests/integration/test_mapping_compat.py."""

from __future__ import annotations

import tomllib
from collections.abc import Callable
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from efd.languages.mapping import DIRECTIVES, MappingError, apply, compile
from efd.languages.mapping.template import compiled as compiled_template
from efd.languages.mapping.template import render as render_template

MESSAGE: dict[str, Any] = {
    "type": "track",
    "userId": "u-1",
    "event": "Order Completed",
    "traits": {"email": "Ann@Example.COM", "tags": ["a", "b"], "age": 0},
    "properties": {
        "order_id": "o-17",
        "revenue": 19.5,
        "none": None,
        "empty": "",
        "items": [{"sku": "A-1", "price": 5}, {"sku": "B-2", "price": 7}],
        "obj": {"k": "v", "n": None, "deep": {"x": None, "y": 1}},
        "json": '{"a": [1, 2]}',
        "text": "hello Hello",
    },
}


def mapped(mapping: Any, message: dict[str, Any] = MESSAGE) -> Any:
    return apply(compile(mapping), message)


def refusal(mapping: Any) -> list[str]:
    with pytest.raises(MappingError) as caught:
        compile(mapping)
    return list(caught.value.problems)


# ---------------------------------------------------------------------------------------------
# The directives


def test_path_finds_keys_indices_and_the_whole_message() -> None:
    assert mapped({"id": {"@path": "$.properties.order_id"}}) == {"id": "o-17"}
    assert mapped({"sku": {"@path": "$.properties.items[1].sku"}}) == {"sku": "B-2"}
    assert mapped({"sku": {"@path": "properties.items.0.sku"}}) == {"sku": "A-1"}
    assert mapped({"k": {"@path": "$.properties['obj'].k"}}) == {"k": "v"}
    assert mapped({"n": {"@path": "$.traits.tags.length"}}) == {"n": 2}
    assert mapped({"@path": "$."}) == MESSAGE


def test_a_missing_path_drops_its_key_and_is_null_in_an_array() -> None:
    assert mapped({"a": {"@path": "$.nope"}, "b": [{"@path": "$.nope.deeper"}]}) == {"b": [None]}
    # As in the kit, a falsy value met on the way is the answer.
    assert mapped({"a": {"@path": "$.traits.age.x"}}) == {"a": 0}


def test_a_path_made_from_the_message_may_hold_any_index() -> None:
    mapping = {"x": {"@path": {"@template": "$.properties.items.{{n}}"}}}
    assert mapped(mapping, {**MESSAGE, "n": "9" * 5000}) == {}
    assert mapped(mapping, {**MESSAGE, "n": "1"}) == {"x": {"sku": "B-2", "price": 7}}


def test_path_of_a_directive_must_give_a_string_when_it_runs() -> None:
    compiled = compile({"p": {"@path": {"@path": "$.properties.revenue"}}})
    with pytest.raises(MappingError, match=r"^data\.p\.@path: the path must be a string, and its"):
        apply(compiled, MESSAGE)


def test_template() -> None:
    template = {"@template": "{{userId}} paid {{properties.revenue}}{{{ properties.none }}}!"}
    assert mapped({"s": template}) == {"s": "u-1 paid 19.5!"}
    assert mapped({"s": {"@template": "{{traits.tags}}|{{properties.obj}}"}}) == {
        "s": "a,b|[object Object]"
    }


def test_if_exists_and_blank() -> None:
    exists = {"@if": {"exists": {"@path": "$.traits.email"}, "then": "yes", "else": "no"}}
    missing = {"@if": {"exists": {"@path": "$.nope"}, "then": "yes", "else": "no"}}
    blank = {"@if": {"blank": {"@path": "$.properties.empty"}, "then": "yes", "else": "no"}}
    assert mapped({"a": exists, "b": missing, "c": blank}) == {"a": "yes", "b": "no", "c": "no"}


def test_if_drops_the_key_without_a_branch_or_with_a_falsy_else() -> None:
    no_then = {"@if": {"exists": {"@path": "$.userId"}, "else": 1}}
    falsy_else = {"@if": {"exists": {"@path": "$.nope"}, "then": 1, "else": False}}
    false_then = {"@if": {"exists": {"@path": "$.userId"}, "then": False}}
    assert mapped({"a": no_then, "b": falsy_else, "c": false_then}) == {"c": False}


def test_literal_resolves_what_it_holds() -> None:
    assert mapped({"l": {"@literal": {"a": 1, "b": {"@path": "$.userId"}}}}) == {
        "l": {"a": 1, "b": "u-1"}
    }


def test_array_path_maps_each_item() -> None:
    shape = {"id": {"@path": "$.sku"}, "p": {"@path": "$.price"}}
    assert mapped({"x": {"@arrayPath": ["$.properties.items", shape]}}) == {
        "x": [{"id": "A-1", "p": 5}, {"id": "B-2", "p": 7}]
    }
    assert mapped({"x": {"@arrayPath": ["$.properties.obj", {"k": {"@path": "$.k"}}]}}) == {
        "x": [{"k": "v"}]
    }
    assert mapped({"x": {"@arrayPath": ["$.userId", shape]}}) == {"x": "u-1"}


def test_case() -> None:
    lower = {"@case": {"operator": "lower", "value": {"@path": "$.traits.email"}}}
    upper = {"@case": {"operator": "upper", "value": "abc"}}
    number = {"@case": {"operator": "upper", "value": {"@path": "$.properties.revenue"}}}
    assert mapped({"a": lower, "b": upper, "c": number}) == {
        "a": "ann@example.com",
        "b": "ABC",
        "c": 19.5,
    }


def test_replace() -> None:
    every = {
        "@replace": {
            "pattern": "hello",
            "replacement": "bye",
            "ignorecase": True,
            "value": {"@path": "$.properties.text"},
        }
    }
    first = {"@replace": {"pattern": "l", "global": False, "value": "hello"}}
    twice = {
        "@replace": {
            "pattern": "h",
            "replacement": "[$&]",
            "pattern2": "o",
            "replacement2": "0",
            "value": "hello",
        }
    }
    number = {
        "@replace": {"pattern": ".", "replacement": ",", "value": {"@path": "$.properties.revenue"}}
    }
    assert mapped({"a": every, "b": first, "c": twice, "d": number}) == {
        "a": "bye bye",
        "b": "helo",
        "c": "[h]ell0",
        "d": "19,5",
    }


def test_merge() -> None:
    objects = [{"a": 1, "b": 1}, {"@path": "$.properties.obj"}, {"a": 2}]
    assert mapped({"m": {"@merge": {"direction": "right", "objects": objects}}}) == {
        "m": {"a": 2, "b": 1, "k": "v", "n": None, "deep": {"x": None, "y": 1}}
    }
    assert mapped({"m": {"@merge": {"direction": "left", "objects": objects}}})["m"]["a"] == 1


def test_merge_of_a_string_gives_its_utf16_units_as_javascript_does() -> None:
    merge = {"@merge": {"direction": "right", "objects": [{"@path": "$.s"}]}}
    assert mapped({"m": merge}, {"s": "a😀"}) == {"m": {"0": "a", "1": "\ud83d", "2": "\ude00"}}


def test_transform_maps_a_mapped_value() -> None:
    transform = {
        "@transform": {
            "apply": {"e": {"@path": "$.traits.email"}},
            "mapping": {"@template": "<{{e}}>"},
        }
    }
    assert mapped({"t": transform}) == {"t": "<Ann@Example.COM>"}


def test_transform_of_a_value_that_is_not_an_object_is_refused_when_it_runs() -> None:
    shape = {"@transform": {"apply": {"a": 1}, "mapping": {"@path": "$.a"}}}
    compiled = compile({"x": {"@arrayPath": ["$.traits.tags", shape]}})
    with pytest.raises(
        MappingError, match="@transform applies to an object, and this value is a string"
    ):
        apply(compiled, MESSAGE)


def test_flatten() -> None:
    flat = {"@flatten": {"separator": "_", "value": {"@path": "$.properties.obj"}}}
    assert mapped({"f": flat}) == {"f": {"k": "v", "n": None, "deep_x": None, "deep_y": 1}}
    arrays = {"@flatten": {"separator": ".", "value": {"a": [1, {"b": 2}]}}}
    kept = {"@flatten": {"separator": ".", "omitArrays": True, "value": {"a": [1, {"b": 2}]}}}
    assert mapped({"f": arrays, "g": kept}) == {
        "f": {"a.0": 1, "a.1.b": 2},
        "g": {"a": [1, {"b": 2}]},
    }


def test_json() -> None:
    encode = {"@json": {"mode": "encode", "value": {"@path": "$.traits.tags"}}}
    decode = {"@json": {"mode": "decode", "value": {"@path": "$.properties.json"}}}
    not_json = {"@json": {"mode": "decode", "value": "{nope"}}
    assert mapped({"e": encode, "d": decode, "n": not_json}) == {
        "e": '["a","b"]',
        "d": {"a": [1, 2]},
        "n": "{nope",
    }


def test_exclude_when_null() -> None:
    gone = {"@excludeWhenNull": {"@path": "$.properties.none"}}
    cleaned = {"@excludeWhenNull": {"@path": "$.properties.obj"}}
    assert mapped({"a": gone, "b": cleaned}) == {"b": {"k": "v", "deep": {"y": 1}}}


def test_a_mapping_may_be_json_text() -> None:
    assert mapped('{"id": {"@path": "$.userId"}}') == {"id": "u-1"}


def test_a_mapping_that_gives_nothing_is_refused_when_it_runs() -> None:
    with pytest.raises(MappingError, match=r"^data: the mapping gives no value for this message$"):
        mapped({"@path": "$.nope"})


def test_the_message_must_be_an_object() -> None:
    with pytest.raises(MappingError, match="the message must be an object, and it is an array"):
        apply(compile({"@path": "$."}), [])


# ---------------------------------------------------------------------------------------------
# Refused at load: every problem, each with its key path


@pytest.mark.parametrize(
    ("mapping", "problem"),
    [
        (
            {"email": {"@case": {"operator": "lowr", "value": "x"}}},
            'data.email.@case.operator: the operator must be "lower" or "upper"',
        ),
        ({"e": {"@case": {"value": "x"}}}, 'data.e.@case: @case needs "operator"'),
        ({"x": {"@nope": 1}}, "data.x: unknown directive @nope; the directives are @path, "),
        ({"x": {"@liquid": "{{ a }}"}}, "data.x.@liquid: @liquid is not supported; "),
        (
            {"x": {"@path": "$.a", "@template": "b"}},
            "data.x: an object holds one directive, and this one has @path, @template",
        ),
        ({"x": {"@path": "$.a", "b": 1}}, "data.x: @path cannot stand beside other keys (b)"),
        (
            {"x": {"@path": 5}},
            "data.x.@path: the path must be a string or a directive, not a number",
        ),
        (
            {"x": {"@template": ["a"]}},
            "data.x.@template: the template must be a string or a directive, not an array",
        ),
        ({"x": {"@if": {"then": 1}}}, 'data.x.@if: @if needs "exists" or "blank"'),
        (
            {"x": {"@if": {"exists": "a", "ellse": 1}}},
            'data.x.@if.ellse: @if has no such key; its keys are "exists", "blank", "then", "else"',
        ),
        (
            {"x": {"@if": "a"}},
            'data.x.@if: @if takes an object with the keys "exists", "blank", "then", "else", '
            "not a string",
        ),
        (
            {"x": {"@arrayPath": "$.a"}},
            "data.x.@arrayPath: @arrayPath takes an array [path, item mapping], not a string",
        ),
        (
            {"x": {"@arrayPath": [1, {}]}},
            "data.x.@arrayPath[0]: the path must be a string or a directive, not a number",
        ),
        (
            {"x": {"@arrayPath": ["$.a", "b"]}},
            "data.x.@arrayPath[1]: the item mapping must be an object or a directive, not a string",
        ),
        (
            {"x": {"@replace": {"pattern": "", "value": "a"}}},
            "data.x.@replace.pattern: the pattern must be 1 to 10 characters long",
        ),
        (
            {"x": {"@replace": {"pattern": "a", "replacement": "x" * 11, "value": "a"}}},
            "data.x.@replace.replacement: the replacement must be 0 to 10 characters long",
        ),
        (
            {"x": {"@replace": {"pattern": "a", "global": "yes", "value": "a"}}},
            "data.x.@replace.global: the global must be true or false, not a string",
        ),
        ({"x": {"@replace": {"value": "a"}}}, 'data.x.@replace: @replace needs "pattern"'),
        (
            {"x": {"@merge": {"direction": "Left", "objects": []}}},
            'data.x.@merge.direction: the direction must be "left" or "right"',
        ),
        (
            {"x": {"@merge": {"direction": "left", "objects": [1]}}},
            "data.x.@merge.objects[0]: each of the objects must be an object or a directive, "
            "not a number",
        ),
        ({"x": {"@merge": {"objects": []}}}, 'data.x.@merge: @merge needs "direction"'),
        (
            {"x": {"@transform": {"apply": {}, "mapping": 1}}},
            "data.x.@transform.mapping: the mapping must be an object or a directive, not a number",
        ),
        (
            {"x": {"@flatten": {"separator": "", "value": 1}}},
            "data.x.@flatten.separator: the separator must not be empty",
        ),
        ({"x": {"@flatten": {"value": 1}}}, 'data.x.@flatten: @flatten needs "separator"'),
        (
            {"x": {"@json": {"mode": "ENCODE", "value": 1}}},
            'data.x.@json.mode: the mode must be "encode" or "decode"',
        ),
        (
            {"x": {"@json": {"mode": "encode", "value": None}}},
            'data.x.@json.value: the value must not be false, 0, "" or null',
        ),
        ([{"@path": "$."}], "data: the mapping must be an object, and it is an array"),
        ({"x": {"@literal": float("inf")}}, "data.x.@literal: a number must be finite"),
        ("{nope", "data: the mapping is not valid JSON"),
        (
            {"x": [{"y": {"@case": {"operator": "up", "value": "a"}}}]},
            'data.x[0].y.@case.operator: the operator must be "lower" or "upper"',
        ),
    ],
)
def test_refused_at_load(mapping: Any, problem: str) -> None:
    problems = refusal(mapping)
    assert any(p.startswith(problem) for p in problems), problems


def test_a_toml_mapping_is_checked_like_a_json_one() -> None:
    data = tomllib.loads('x = { "@path" = "$.userId" }\nwhen = 2026-01-01\n')
    assert refusal(data) == ["data.when: date is not a JSON value"]
    del data["when"]
    assert mapped(data) == {"x": "u-1"}


def test_every_problem_is_listed() -> None:
    problems = refusal(
        {"a": {"@path": 1}, "b": {"@case": {"operator": "x", "value": 1}}, "c": {"@x": 1}}
    )
    assert [p.split(":")[0] for p in problems] == [
        "data.a.@path",
        "data.b.@case.operator",
        "data.b.@case.value",
        "data.c",
    ]


def test_the_path_starts_with_the_name_given() -> None:
    problems = refusal({"email": {"@case": {"operator": "x", "value": "a"}}})
    assert problems[0].startswith("data.email.@case.operator: ")
    with pytest.raises(MappingError) as caught:
        compile({"e": {"@path": 1}}, name="destinations[0].actions[1].data")
    assert caught.value.problems[0].startswith("destinations[0].actions[1].data.e.@path: ")


def test_nesting_is_limited() -> None:
    deep: Any = "x"
    for _ in range(100):
        deep = {"a": deep}
    assert refusal(deep) == [
        "data" + ".a" * 64 + ": the mapping is nested more than 64 levels deep"
    ]


# ---------------------------------------------------------------------------------------------
# Fuzz: any mapping efd accepts, on any message, gives a value or a MappingError

json_scalars = (
    st.none()
    | st.booleans()
    | st.integers()
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(max_size=8)
)
json_values = st.recursive(
    json_scalars,
    lambda inner: (
        st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=4), inner, max_size=3)
    ),
    max_leaves=12,
)
keys = st.sampled_from(["a", "b", "0", "length", "$.", "", "$.a", "a.b", "a[0]", "b.0.a"])


def _directives(inner: st.SearchStrategy[Any]) -> st.SearchStrategy[Any]:
    """Each directive with the keys it takes, its values drawn from `inner`."""
    objects = st.dictionaries(st.sampled_from(["a", "b"]), inner, min_size=1, max_size=2)
    shapes = objects | st.builds(lambda k: {"@path": k}, keys)
    text = keys | st.builds(lambda k: {"@path": k}, keys)
    one = st.fixed_dictionaries
    args: dict[str, st.SearchStrategy[Any]] = {
        "@path": text,
        "@template": st.builds(lambda k, t: "{{" + k + "}}" + t, keys, st.text(max_size=4)),
        "@if": one(
            {"exists": text},
            optional={"then": inner, "else": inner, "blank": text},
        ),
        "@literal": inner,
        "@arrayPath": st.tuples(text, shapes).map(list),
        "@case": one({"operator": st.sampled_from(["lower", "upper"])}, optional={"value": text}),
        "@replace": one(
            {"pattern": st.sampled_from(["a", "$", ".", "A"]), "value": text},
            optional={
                "replacement": st.sampled_from(["", "$&", "$'", "$`", "$$"]),
                "pattern2": st.sampled_from(["", "b"]),
                "global": st.booleans(),
                "ignorecase": st.booleans(),
            },
        ),
        "@merge": one(
            {
                "direction": st.sampled_from(["left", "right"]),
                "objects": st.lists(shapes, max_size=3),
            }
        ),
        "@transform": one({"apply": shapes, "mapping": shapes}),
        "@flatten": one(
            {"separator": st.sampled_from([".", "_"]), "value": inner},
            optional={"omitArrays": st.booleans()},
        ),
        "@json": one({"mode": st.sampled_from(["encode", "decode"]), "value": inner}),
        "@excludeWhenNull": inner,
    }
    assert set(args) == set(DIRECTIVES)
    return st.one_of([arg.map(_under(name)) for name, arg in args.items()])


def _under(name: str) -> Callable[[Any], dict[str, Any]]:
    return lambda arg: {name: arg}


mappings = st.recursive(
    json_scalars | st.builds(lambda k: {"@path": k}, keys),
    lambda inner: (
        _directives(inner)
        | st.dictionaries(st.text(max_size=3), inner, max_size=3)
        | st.lists(inner, max_size=3)
    ),
    max_leaves=16,
)
messages = st.dictionaries(keys, json_values, max_size=4)


@settings(max_examples=1500, deadline=None)
@given(mapping=mappings, message=messages)
def test_applying_raises_only_mapping_errors(mapping: Any, message: dict[str, Any]) -> None:
    try:
        compiled = compile({"x": mapping})
    except MappingError:
        return
    try:
        apply(compiled, message)
    except MappingError as error:
        reason = str(error)
        assert reason.startswith("data"), reason


@pytest.mark.parametrize(
    ("source", "plain"),
    [
        ({"a": {"@path": "$.properties.x"}, "b": {"@template": "{{userId}}"}}, True),
        ({"a": {"@case": {"operator": "upper", "value": {"@path": "$.a"}}}}, True),
        ({"a": {"@literal": 1.5}, "b": "text", "c": [1, None, True]}, True),
        ({"a": {"@literal": 2.0}}, False),  # JSON.stringify writes 2
        ({"a": 1e-7}, False),  # and 1e-7
        ({"a": 2**60}, False),  # past 2**53
        ({"0": {"@path": "$.a"}}, False),  # an array index: listed first by JavaScript
        ({"a": {"@flatten": {"separator": ".", "value": {"@path": "$.properties"}}}}, False),
        ({"a": {"@json": {"mode": "decode", "value": {"@path": "$.a"}}}}, False),
    ],
)
def test_a_mapping_knows_whether_it_keeps_a_plain_message_plain(source: Any, plain: bool) -> None:
    assert compile(source).plain is plain


PAYLOAD = {"a": {"b": 1.5, "c": [1, None, "x"]}, "s": "{{a.b}}", "n": None, "e": ""}


@pytest.mark.parametrize(
    "text",
    [
        "plain",
        "{{a.b}} and {{ a.c }}",
        "{{s}}",  # a value holding braces is not read again
        "{{missing}}|{{n}}|{{e}}|{{a}}",
        "{{.}}",
        "{{a.b}",
        "}}{{a.b}}{{",
        "{{{a.b}}} {{a.b}}",  # triple braces: the two passes
        "{{{s}}}",
        "",
    ],
)
def test_a_template_compiled_at_load_renders_as_the_template_does(text: str) -> None:
    assert compiled_template(text)(PAYLOAD) == render_template(text, PAYLOAD)
