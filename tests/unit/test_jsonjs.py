"""efd.jsonjs: bytes identical to JavaScript's JSON.stringify (pure, fast).

The expectations below are JavaScript's own answers (ECMA-262 Number::toString and
JSON.stringify), written out by hand; the Node cross-check at the end asks Node itself.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import math
import random
import shutil
import struct
import subprocess
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from efd import jsonjs

VECTORS = json.loads((Path(__file__).parent / "data" / "signing_vectors.json").read_text())

# -- the signing vectors (made with Node's JSON.stringify and crypto) ---------------------


def test_there_are_signing_vectors() -> None:
    assert len(VECTORS) >= 6
    assert {v["name"] for v in VECTORS} >= {"track", "alias", "delete", "control-chars"}


@pytest.mark.parametrize("vector", VECTORS, ids=[v["name"] for v in VECTORS])
def test_signing_vector_body(vector: dict[str, str]) -> None:
    assert jsonjs.dumps(jsonjs.loads(vector["input"])) == vector["body"].encode("utf-8")


@pytest.mark.parametrize("vector", VECTORS, ids=[v["name"] for v in VECTORS])
def test_signing_vector_body_from_bytes_input(vector: dict[str, str]) -> None:
    assert jsonjs.dumps(jsonjs.loads(vector["input"].encode("utf-8"))) == vector["body"].encode(
        "utf-8"
    )


@pytest.mark.parametrize("vector", VECTORS, ids=[v["name"] for v in VECTORS])
def test_signing_vector_signature(vector: dict[str, str]) -> None:
    body = jsonjs.dumps(jsonjs.loads(vector["input"]))
    digest = hmac.new(vector["secret"].encode("utf-8"), body, hashlib.sha1).hexdigest()
    assert digest == vector["x_signature"]


@pytest.mark.parametrize("vector", VECTORS, ids=[v["name"] for v in VECTORS])
def test_signing_vector_body_is_a_fixed_point(vector: dict[str, str]) -> None:
    """A receiver that parses and re-stringifies our body gets our bytes back."""
    body = vector["body"].encode("utf-8")
    assert jsonjs.dumps(jsonjs.loads(body)) == body


# -- JavaScript number formatting ------------------------------------------------------------

JS_NUMBERS = [
    (0.0, "0"),
    (-0.0, "0"),
    (1.0, "1"),
    (-1.0, "-1"),
    (10.0, "10"),
    (2e3, "2000"),
    (0.1, "0.1"),
    (0.10, "0.1"),
    (-0.5, "-0.5"),
    (1.5, "1.5"),
    (39.95, "39.95"),
    (0.1 + 0.2, "0.30000000000000004"),
    (123.456, "123.456"),
    (1e20, "100000000000000000000"),
    (-1e20, "-100000000000000000000"),
    pytest.param(
        999999999999999900000.0,
        "999999999999999900000",
    ),
    (1e21, "1e+21"),
    (-1e21, "-1e+21"),
    (1.5e21, "1.5e+21"),
    (1e22, "1e+22"),
    (1.2345e25, "1.2345e+25"),
    (1e300, "1e+300"),
    (1.7976931348623157e308, "1.7976931348623157e+308"),
    (-1.7976931348623157e308, "-1.7976931348623157e+308"),
    (1e-4, "0.0001"),
    (1.5e-5, "0.000015"),
    (1e-5, "0.00001"),
    (1e-6, "0.000001"),
    (1.234e-6, "0.000001234"),
    (-1e-6, "-0.000001"),
    (9.99e-7, "9.99e-7"),
    (1e-7, "1e-7"),
    (-1e-7, "-1e-7"),
    (1.5e-7, "1.5e-7"),
    (1.23e-18, "1.23e-18"),
    (5e-324, "5e-324"),
    (-5e-324, "-5e-324"),
    (2.2250738585072014e-308, "2.2250738585072014e-308"),
    (2.0**53, "9007199254740992"),
    (2.0**53 - 1, "9007199254740991"),
    (-(2.0**53), "-9007199254740992"),
    (float(2**53 + 2), "9007199254740994"),
    (1e16, "10000000000000000"),
    (12345678901234567.0, "12345678901234568"),
    pytest.param(
        2.0**60,
        "1152921504606847000",
    ),
    pytest.param(
        123456789012345680000.0,
        "123456789012345680000",
    ),
    pytest.param(
        1e20 + 2**17,
        "100000000000000130000",
    ),
]


@pytest.mark.parametrize(("value", "expected"), JS_NUMBERS)
def test_js_number(value: float, expected: str) -> None:
    assert jsonjs.js_number(value) == expected


@pytest.mark.parametrize(("value", "expected"), JS_NUMBERS)
def test_dumps_number_alone_and_nested(value: float, expected: str) -> None:
    assert jsonjs.dumps(value) == expected.encode()
    assert jsonjs.dumps({"n": [value]}) == b'{"n":[' + expected.encode() + b"]}"


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        (0, b"0"),
        (-7, b"-7"),
        (2**53 - 1, b"9007199254740991"),
        (-(2**53 - 1), b"-9007199254740991"),
        (2**53, b"9007199254740992"),
        (2**53 + 1, b"9007199254740992"),  # JSON.parse rounds it to the nearest double
        (-(2**53 + 1), b"-9007199254740992"),
        (9007199254740993, b"9007199254740992"),
        (10**21, b"1e+21"),
        (123456789012345678901234567890, b"1.2345678901234568e+29"),
        (True, b"true"),
        (False, b"false"),
        (None, b"null"),
        (math.inf, b"null"),
        (-math.inf, b"null"),
        (math.nan, b"null"),
        pytest.param(
            2**60,
            b"1152921504606847000",
        ),
        pytest.param(
            1234567890123456789,
            b"1234567890123456800",
        ),
        pytest.param(10**400, b"null"),
        pytest.param(-(10**400), b"null"),
    ],
)
def test_dumps_scalars(value: Any, expected: bytes) -> None:
    assert jsonjs.dumps(value) == expected


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("10.0", b"10"),
        ("-0.0", b"0"),
        ("-0", b"0"),
        ("2E3", b"2000"),
        ("1e21", b"1e+21"),
        ("1E+21", b"1e+21"),
        ("1.5e-7", b"1.5e-7"),
        ("0.0000001", b"1e-7"),
        ("0.000001", b"0.000001"),
        ("1e-400", b"0"),  # underflows to 0
        ("5e-324", b"5e-324"),
        ("9007199254740993", b"9007199254740992"),
        ("[1.0,2.50,-3e-8]", b"[1,2.5,-3e-8]"),
        ("1" + "0" * 308, b"1e+308"),
        pytest.param(
            "1152921504606846976",
            b"1152921504606847000",
        ),
    ],
)
def test_numbers_round_trip_as_node_does(text: str, expected: bytes) -> None:
    assert jsonjs.dumps(jsonjs.loads(text)) == expected


_MAX_WHOLE = str(int(1.7976931348623157e308))  # the largest double, all 309 digits


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ('{"n":1e999}', "n holds the number 1e999"),
        ('{"n":-1e400}', "n holds the number -1e400"),
        (
            '{"a":[1,{"b":' + "1" * 10_000 + "}]}",
            "a[1].b holds the number 111111111111… (10000 digits)",
        ),
        ('{"n":-' + "9" * 5000 + "}", "n holds the number -99999999999… (5000 digits)"),
        ('{"n":' + "1" * 400 + ".5}", "n holds the number 111111111111… (401 digits)"),
        ('{"n":' + str(2 * int(_MAX_WHOLE)) + "}", "n holds the number 359538626972… (309 digits)"),
        ("1e999", "the body holds the number 1e999"),
    ],
)
def test_numbers_past_a_double_are_refused_naming_where(text: str, message: str) -> None:
    """JSON.parse reads them as Infinity, which a receiver gets as null; Python will not
    convert integers of thousands of digits at all. Both parsers refuse them alike."""
    for parse in (jsonjs.loads, lambda data: jsonjs.loads_checked(data)[0]):
        with pytest.raises(jsonjs.OutOfRange) as caught:
            parse(text.encode())
        assert str(caught.value) == (
            f"{message}, out of range: numbers are limited to a double's range, about ±1.8e308"
        )


def test_numbers_up_to_a_double_are_kept() -> None:
    text = '{"max":' + _MAX_WHOLE + ',"min":-' + _MAX_WHOLE + ',"f":1.7976931348623157e308}'
    value, _ = jsonjs.loads_checked(text.encode())
    assert value == {"max": int(_MAX_WHOLE), "min": -int(_MAX_WHOLE), "f": 1.7976931348623157e308}
    assert jsonjs.loads(text) == value
    # A duplicate key replaces the number, as in JSON.parse: nothing out of range is left.
    assert jsonjs.loads_checked(b'{"n":1e999,"n":1}')[0] == {"n": 1}


def test_tiny_and_plain_numbers_mixed_in_one_document() -> None:
    # A tiny float forces the slow path; everything around it must still be compact JSON.
    doc = {"a": 1e-7, "b": "x\ny", "c": [10.0, None, True, {"d": 0.5}], "é": "ü"}
    assert (
        jsonjs.dumps(doc) == '{"a":1e-7,"b":"x\\ny","c":[10,null,true,{"d":0.5}],"é":"ü"}'.encode()
    )


# -- loads is strict -------------------------------------------------------------------------


@pytest.mark.parametrize(
    "text",
    ["NaN", "Infinity", "-Infinity", '{"a":NaN}', "[1,Infinity]", '{"a":{"b":-Infinity}}'],
)
def test_loads_rejects_nan_and_infinity(text: str) -> None:
    with pytest.raises(ValueError, match="not valid JSON"):
        jsonjs.loads(text)


@pytest.mark.parametrize("text", ["", "{", "[1,]", "{'a':1}", '{"a":1,}', "undefined", "[1] 2"])
def test_loads_rejects_invalid_json(text: str) -> None:
    with pytest.raises(json.JSONDecodeError):
        jsonjs.loads(text)


def test_loads_rejects_invalid_utf8() -> None:
    with pytest.raises(UnicodeDecodeError):
        jsonjs.loads(b'"\xff"')


def test_loads_accepts_str_and_bytes() -> None:
    assert jsonjs.loads('{"a":[1,2.5,"é"]}') == {"a": [1, 2.5, "é"]}
    assert jsonjs.loads('{"a":[1,2.5,"é"]}'.encode()) == {"a": [1, 2.5, "é"]}


# -- strings -------------------------------------------------------------------------------


def _js_escape(code: int) -> str:
    short = {8: "\\b", 9: "\\t", 10: "\\n", 12: "\\f", 13: "\\r"}
    return short.get(code, f"\\u{code:04x}")


@pytest.mark.parametrize("code", range(0x20))
def test_control_characters_escaped_as_javascript(code: int) -> None:
    assert jsonjs.dumps("a" + chr(code) + "b") == ('"a' + _js_escape(code) + 'b"').encode()


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        ("\x7f", '"\x7f"'),  # DEL is not escaped
        ("\u2028\u2029", '"\u2028\u2029"'),  # line/paragraph separators travel raw
        ('"', '"\\""'),
        ("\\", '"\\\\"'),
        ("/", '"/"'),  # JSON.stringify does not escape the solidus
        ("</script>", '"</script>"'),
        ("é ü ß 中文", '"é ü ß 中文"'),  # raw UTF-8, not \u escapes
        ("\U0001f680", '"\U0001f680"'),
        ("\ufeff", '"\ufeff"'),
        ("\x00", '"\\u0000"'),
        ("\x1f", '"\\u001f"'),
    ],
)
def test_string_escapes(value: str, expected: str) -> None:
    assert jsonjs.dumps(value) == expected.encode("utf-8")


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ('"\\ud800"', b'"\\ud800"'),
        ('"\\udfff x"', b'"\\udfff x"'),
        ('"a\\ud83d"', b'"a\\ud83d"'),  # high surrogate at the end
        ('"\\ude80\\ud83d"', b'"\\ude80\\ud83d"'),  # a pair in the wrong order is two lone ones
        ('"\\ud83d\\ude80"', '"\U0001f680"'.encode()),  # a real pair is one character, raw
        ('["\\ud800","\\ud83d\\ude80"]', '["\\ud800","\U0001f680"]'.encode()),
        ('{"\\udc00k":"\\uDBFF"}', b'{"\\udc00k":"\\udbff"}'),  # keys too; hex in lower case
        ('"\\u00e9\\ud800\\n"', '"é\\ud800\\n"'.encode()),
    ],
)
def test_lone_surrogates_escaped_like_well_formed_stringify(text: str, expected: bytes) -> None:
    assert jsonjs.dumps(jsonjs.loads(text)) == expected


def test_lone_surrogate_beside_a_tiny_float() -> None:
    """The slow number path and the surrogate fallback compose."""
    assert jsonjs.dumps({"s": "\ud800", "f": 1e-7}) == b'{"s":"\\ud800","f":1e-7}'


# -- structure -------------------------------------------------------------------------------


def test_key_order_is_insertion_order() -> None:
    doc = {"z": 1, "a": 2, "m": {"y": 1, "b": 2}, "B": 3, "_": 4}
    assert jsonjs.dumps(doc) == b'{"z":1,"a":2,"m":{"y":1,"b":2},"B":3,"_":4}'


def test_duplicate_keys_keep_first_position_and_last_value() -> None:
    # JSON.parse('{"a":1,"b":2,"a":3}') is {a: 3, b: 2}: the key stays where it first appeared.
    assert jsonjs.dumps(jsonjs.loads('{"a":1,"b":2,"a":3}')) == b'{"a":3,"b":2}'


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        # Not array indices, so insertion order holds in JavaScript too.
        ('{"b":1,"01":2,"-1":3,"1.5":4}', b'{"b":1,"01":2,"-1":3,"1.5":4}'),
        ('{"b":1,"4294967295":2}', b'{"b":1,"4294967295":2}'),
        pytest.param(
            '{"b":1,"10":2,"2":3,"a":4}',
            b'{"2":3,"10":2,"b":1,"a":4}',
        ),
        pytest.param(
            '{"properties":{"name":"x","2024":1,"0":true}}',
            b'{"properties":{"0":true,"2024":1,"name":"x"}}',
        ),
    ],
)
def test_key_order_as_javascript_objects(text: str, expected: bytes) -> None:
    assert jsonjs.dumps(jsonjs.loads(text)) == expected


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        ({}, b"{}"),
        ([], b"[]"),
        ({"a": {}, "b": []}, b'{"a":{},"b":[]}'),
        ((1, "x", (2.0,)), b'[1,"x",[2]]'),
        ([[[[]]]], b"[[[[]]]]"),
        ({"a b": " c ", "": ""}, b'{"a b":" c ","":""}'),
    ],
)
def test_compact_structures(value: Any, expected: bytes) -> None:
    assert jsonjs.dumps(value) == expected


@pytest.mark.parametrize("value", [{1, 2}, b"bytes", object(), {"a": [Path("/")]}])
def test_unsupported_types_raise(value: Any) -> None:
    with pytest.raises(TypeError):
        jsonjs.dumps(value)


def test_dumps_does_not_modify_its_argument() -> None:
    doc = {"a": 10.0, "b": [1e-7, 2**60], "c": {"d": -0.0}}
    before = repr(doc)
    jsonjs.dumps(doc)
    assert repr(doc) == before


# -- cross-check against Node itself -------------------------------------------------------

NODE = shutil.which("node")
NODE_SCRIPT = r"""
let input = '';
process.stdin.on('data', (chunk) => { input += chunk; });
process.stdin.on('end', () => {
  const request = JSON.parse(input);
  const numbers = request.hex.map((h) => Buffer.from(h, 'hex').readDoubleBE(0));
  process.stdout.write(JSON.stringify({
    string: numbers.map((x) => String(x)),
    stringify: numbers.map((x) => JSON.stringify(x)),
    docs: request.docs.map((t) => JSON.stringify(JSON.parse(t))),
  }));
});
"""


def _edge_doubles() -> list[float]:
    values: list[float] = []
    anchors = [
        0.0, 5e-324, 2.2250738585072014e-308, 1e-7, 1e-6, 1e-5, 1e-4, 0.1, 0.5, 1.0,
        2.0**53, 2.0**64, 1e16, 1e17, 1e20, 1e21, 1e22, 1.7976931348623157e308,
    ]  # fmt: skip
    for anchor in anchors:
        for value in (anchor, -anchor):
            values.append(value)
            up = down = value
            for _ in range(3):
                up = math.nextafter(up, math.inf)
                down = math.nextafter(down, -math.inf)
                values.extend([up, down])
    return [v for v in values if math.isfinite(v)]


def _random_doubles(rng: random.Random) -> list[float]:
    values: list[float] = []
    while len(values) < 1200:  # arbitrary bit patterns, finite ones
        (value,) = struct.unpack(">d", rng.getrandbits(64).to_bytes(8, "big"))
        if math.isfinite(value):
            values.append(value)
    for _ in range(1200):  # decimal-looking values across the whole exponent range
        digits = rng.randint(1, 10 ** rng.randint(1, 17))
        values.append(float(f"{digits}e{rng.randint(-340, 300)}"))
    for _ in range(600):  # the ranges where the layout changes
        values.append(rng.uniform(-1e-6, 1e-6))
        values.append(rng.uniform(1e-8, 1e-6) * rng.choice((1, -1)))
        values.append(round(rng.uniform(-1e6, 1e6), rng.randint(0, 8)))
        values.append(float(rng.randint(-(2**53), 2**53)))
        values.append(float(rng.randint(2**53, 10**21)) * rng.choice((1, -1)))
    return [v for v in values if math.isfinite(v)]


def _in_big_integral_range(value: float) -> bool:
    return value.is_integer() and 2.0**53 <= abs(value) < 1e21


NODE_DOCS_OK = [vector["input"] for vector in VECTORS] + [
    '{"a":[1.0,-0.0,1e21,1e-7,5e-324,9007199254740993],"b":"\\u0001\\u2028\\ud800"}',
    '{"z":1,"a":{"y":2,"b":[{"x":null,"c":true}]},"-1":3,"01":4}',
    '"tab\\tquote\\"back\\\\slash\\/"',
    "[0.000001,0.0000001,123e-20,1E300,-0.5,2E3]",
]
NODE_DOCS_TRICKY = [
    '{"b":1,"10":2,"2":3,"a":4}',
    '{"id":1152921504606846976}',
    "1" + "0" * 308,  # the most digits a double holds (more: refused, OutOfRange)
]


@pytest.fixture(scope="module")
def node_answers() -> dict[str, Any]:
    """One Node process answers every question of this module."""
    if NODE is None:
        pytest.skip("node is not on PATH: the cross-check against Node's String(x) is skipped")
    numbers = _edge_doubles() + _random_doubles(random.Random(20260301))
    request = {
        "hex": [struct.pack(">d", value).hex() for value in numbers],
        "docs": NODE_DOCS_OK + NODE_DOCS_TRICKY,
    }
    done = subprocess.run(
        [NODE, "-e", NODE_SCRIPT],
        input=json.dumps(request),
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    answers: dict[str, Any] = json.loads(done.stdout)
    answers["numbers"] = numbers
    return answers


def test_node_cross_check_covers_thousands_of_doubles(node_answers: dict[str, Any]) -> None:
    assert len(node_answers["numbers"]) > 4000
    assert len(node_answers["string"]) == len(node_answers["numbers"])


def test_js_number_matches_node(node_answers: dict[str, Any]) -> None:
    mismatches = [
        (value, jsonjs.js_number(value), expected)
        for value, expected in zip(node_answers["numbers"], node_answers["string"], strict=True)
        if jsonjs.js_number(value) != expected
    ]
    assert mismatches == []


def test_dumps_of_a_number_matches_node_json_stringify(node_answers: dict[str, Any]) -> None:
    mismatches = [
        (value, jsonjs.dumps(value), expected)
        for value, expected in zip(node_answers["numbers"], node_answers["stringify"], strict=True)
        if jsonjs.dumps(value) != expected.encode()
    ]
    assert mismatches == []


def test_integral_doubles_past_2_53_match_node(node_answers: dict[str, Any]) -> None:
    pairs = [
        (value, expected)
        for value, expected in zip(node_answers["numbers"], node_answers["string"], strict=True)
        if _in_big_integral_range(value)
    ]
    assert len(pairs) > 100
    assert [(v, jsonjs.js_number(v)) for v, _ in pairs] == pairs


@pytest.mark.parametrize("index", range(len(NODE_DOCS_OK)))
def test_documents_match_node(node_answers: dict[str, Any], index: int) -> None:
    text = NODE_DOCS_OK[index]
    assert jsonjs.dumps(jsonjs.loads(text)) == node_answers["docs"][index].encode("utf-8")


@pytest.mark.parametrize(
    "index",
    [
        pytest.param(0),
        pytest.param(1),
        pytest.param(2),
    ],
)
def test_tricky_documents_match_node(node_answers: dict[str, Any], index: int) -> None:
    text = NODE_DOCS_TRICKY[index]
    expected = node_answers["docs"][len(NODE_DOCS_OK) + index].encode("utf-8")
    assert jsonjs.dumps(jsonjs.loads(text)) == expected


# -- loads_checked: the ingestion fast path ---------------------------------------------


@pytest.mark.parametrize("vector", VECTORS, ids=[v["name"] for v in VECTORS])
def test_checked_parse_then_dumps_reproduces_the_vectors(vector: dict[str, Any]) -> None:
    value, plain = jsonjs.loads_checked(vector["input"].encode())
    assert jsonjs.dumps(value, plain=plain) == vector["body"].encode()


@pytest.mark.parametrize(
    "text",
    [
        '{"a":10.0}',
        '{"a":-0.0}',
        "[1e-05]",
        "[0.00001]",
        "[1e16]",
        "[2.5e+17]",
        "[12345678901234567]",
        "[-1234567890123456]",
        '{"b":1,"2":3}',
        '{"b":1, "10" : 3}',
    ],
)
def test_checked_parse_flags_what_python_may_write_differently(text: str) -> None:
    _, plain = jsonjs.loads_checked(text.encode())
    assert plain is False


@pytest.mark.parametrize(
    "text",
    [
        '{"a":39.95,"b":"1.0","c":[1,2,3],"d":"2026-11-21T10:00:00.000Z"}',
        '{"library":{"name":"x","version":"2.1.0"},"n":-42,"f":0.5}',
        '{"key2":1,"k":"\\"1\\":"}',
        "[123456789012345]",
    ],
)
def test_checked_parse_keeps_plain_documents_plain(text: str) -> None:
    value, plain = jsonjs.loads_checked(text.encode())
    assert plain is True
    assert jsonjs.dumps(value, plain=True) == jsonjs.dumps(value)


def test_checked_parse_agrees_with_the_exact_path_on_random_documents() -> None:
    rng = random.Random(7)

    def number() -> Any:
        return rng.choice(
            [
                rng.randint(-(10**6), 10**6),
                rng.randint(-(2**60), 2**60),
                rng.uniform(-1e3, 1e3),
                float(rng.randint(-100, 100)),
                rng.uniform(-1, 1) * 10 ** rng.randint(-12, 22),
            ]
        )

    def document(depth: int = 0) -> Any:
        roll = rng.random()
        if depth > 3 or roll < 0.4:
            return rng.choice([number(), "s", "1.0", True, None])
        if roll < 0.7:
            return [document(depth + 1) for _ in range(rng.randint(0, 4))]
        keys = ["a", "b", "0", "17", "x1", "-1"]
        return {rng.choice(keys): document(depth + 1) for _ in range(rng.randint(0, 4))}

    for _ in range(3000):
        text = json.dumps(document(), separators=(",", ":"))
        value, plain = jsonjs.loads_checked(text.encode())
        assert jsonjs.dumps(value, plain=plain) == jsonjs.dumps(value), text


def test_plain_documents_are_written_alike_by_orjson_and_pythons_encoder() -> None:
    """dumps(plain=True) is orjson's output; the exact path is Python's encoder. Strings of
    every kind of code point (controls, DEL, U+2028, astral) and every plain number."""
    rng = random.Random(11)
    points = [
        lambda: rng.randint(0, 0x1F),
        lambda: rng.randint(0x20, 0x7F),
        lambda: rng.randint(0x80, 0x7FF),
        lambda: rng.randint(0x800, 0xD7FF),
        lambda: rng.randint(0xE000, 0xFFFF),
        lambda: rng.randint(0x10000, 0x10FFFF),
        lambda: rng.choice([0x2028, 0x2029, 0x22, 0x5C, 0x2F]),
    ]

    def string() -> str:
        return "".join(chr(rng.choice(points)()) for _ in range(rng.randint(0, 10)))

    def number() -> Any:
        if rng.random() < 0.3:
            return rng.randint(-(10**15) + 1, 10**15 - 1)  # longer ones are not plain
        value = rng.uniform(-1, 1) * 10 ** rng.uniform(-4, 16)
        return value if not value.is_integer() and 1e-4 <= abs(value) < 1e16 else 0.5

    def document(depth: int = 0) -> Any:
        roll = rng.random()
        if depth > 3 or roll < 0.5:
            return rng.choice([number(), string(), True, False, None])
        if roll < 0.75:
            return [document(depth + 1) for _ in range(rng.randint(0, 4))]
        return {"k" + string(): document(depth + 1) for _ in range(rng.randint(0, 4))}

    written = 0
    for _ in range(5000):
        text = json.dumps(document(), ensure_ascii=False, separators=(",", ":"))
        value, plain = jsonjs.loads_checked(text.encode())
        if not plain:
            continue  # the check is conservative: digits quoted before a colon, say
        assert jsonjs.dumps(value, plain=True) == jsonjs.dumps(value), text
        written += 1
    assert written > 4000


def test_a_plain_document_with_a_lone_surrogate_is_written_as_before() -> None:
    # orjson refuses a lone surrogate; the plain path then writes it as JSON.stringify does.
    value, plain = jsonjs.loads_checked(b'{"a":"x\\ud800y"}')
    assert plain is True
    assert jsonjs.dumps(value, plain=True) == b'{"a":"x\\ud800y"}'
    assert jsonjs.dumps(value, plain=True, replace_surrogates=True) == '{"a":"x\ufffdy"}'.encode()


def test_checked_parse_starts_each_document_afresh() -> None:
    # The decoder is reused across calls: a flag left by one document must not leak.
    assert jsonjs.loads_checked(b"[10.0]")[1] is False
    assert jsonjs.loads_checked(b"[1.5]") == ([1.5], True)
    assert jsonjs.loads_checked(b'{"2":1}')[1] is False
    assert jsonjs.loads_checked(b'{"a":1}') == ({"a": 1}, True)


@pytest.mark.parametrize(
    "data",
    [
        '{"a":"é"}'.encode(),
        '\ufeff{"a":"é"}'.encode(),  # a UTF-8 byte order mark
        '{"a":"é"}'.encode("utf-16"),
        '{"a":"é"}'.encode("utf-16-le"),
        '{"a":"é"}'.encode("utf-32"),
        b'{"a":"\\ud800"}',
    ],
)
def test_checked_parse_reads_bytes_as_json_loads_does(data: bytes) -> None:
    assert jsonjs.loads_checked(data)[0] == json.loads(data)


@pytest.mark.parametrize("data", [b'{"a":"\xff"}', b"[NaN]", b"{", b'{"a":1} x'])
def test_checked_parse_refuses_what_json_loads_refuses(data: bytes) -> None:
    def error(parse: Callable[[], object]) -> tuple[type, str]:
        try:
            parse()
        except ValueError as e:
            return type(e), str(e)
        raise AssertionError(f"{data!r} was accepted")

    expected = error(lambda: jsonjs.loads(data))
    assert error(lambda: jsonjs.loads_checked(data)) == expected
