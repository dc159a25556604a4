"""JSON serialisation byte-compatible with JavaScript's ``JSON.stringify``.

Receivers commonly verify X-Signature by re-stringifying the parsed body in Node. Signing
the exact bytes we send only helps them if those bytes are what ``JSON.stringify`` would
produce: compact separators, raw UTF-8, and JavaScript's number formatting.

Python's C encoder already matches for strings and for most numbers, so the fast path
rewrites only the values that differ (integral floats, ints beyond 2**53, tiny floats)
and lets ``json.dumps`` do the rest. A *plain* document (`loads_checked`), where nothing
needs rewriting, is written by orjson, whose output for such documents is the same bytes
at a fraction of the cost (docs/decisions.md#webhook-bodies-deliverymdbody).
"""

from __future__ import annotations

import json
import math
import re
import sys
import threading
from collections.abc import Sequence
from decimal import Decimal
from typing import Any

import orjson

_MAX_SAFE = 2**53
# Deeper JSON is refused before it is parsed: no real message nests this far, and the
# parser must never be the one to discover a body nested thousands of levels deep.
MAX_DEPTH = 64
_encoder = json.JSONEncoder(ensure_ascii=False, separators=(",", ":"), allow_nan=False)
_LONE_SURROGATE = re.compile("[\ud800-\udfff]")


class _Raw:
    """A number already rendered in JavaScript's form (only for tiny floats)."""

    __slots__ = ("text",)

    def __init__(self, text: str) -> None:
        self.text = text


def js_number(value: float) -> str:
    """Render a finite float the way JavaScript's Number#toString does."""
    if value == 0:
        return "0"  # covers -0.0, which JSON.stringify writes as 0
    if value.is_integer() and abs(value) < _MAX_SAFE:
        return str(int(value))
    # repr gives the shortest round-tripping digits; only the layout differs from JS.
    _, digit_tuple, exponent = Decimal(repr(abs(value))).as_tuple()
    assert isinstance(exponent, int)
    digits = "".join(map(str, digit_tuple)).rstrip("0")
    k = len(digits)
    n = len(digit_tuple) + exponent  # the decimal point sits after n digits
    sign = "-" if value < 0 else ""
    if k <= n <= 21:
        return sign + digits + "0" * (n - k)
    if 0 < n <= 21:
        return sign + digits[:n] + "." + digits[n:]
    if -6 < n <= 0:
        return sign + "0." + "0" * (-n) + digits
    mantissa = digits[0] + ("." + digits[1:] if k > 1 else "")
    return f"{sign}{mantissa}e{'+' if n - 1 >= 0 else '-'}{abs(n - 1)}"


def _needs_slow(value: float) -> bool:
    # Python's layout differs from JavaScript's for tiny numbers and for integral doubles
    # past 2**53, whose exact digits are longer than JavaScript's shortest form.
    return (value != 0 and abs(value) < 1e-4) or _MAX_SAFE <= abs(value) < 1e21


_ARRAY_INDEX = re.compile("0|[1-9][0-9]{0,9}")


def is_array_index(key: Any) -> bool:
    """Whether JavaScript lists `key` among an object's array indices, ahead of the rest."""
    # The digit test first: almost no key starts with one, and the regex is the slow part.
    return (
        isinstance(key, str)
        and key[:1].isdigit()
        and _ARRAY_INDEX.fullmatch(key) is not None
        and int(key) < 2**32 - 1
    )


def plain_value(value: Any) -> bool:
    """Whether `dumps(value, plain=True)` writes JSON.stringify's bytes for `value` and for
    any plain document it is put in: no key an array index, no number Python writes
    otherwise (for a constant of a configuration, checked once)."""
    if isinstance(value, dict):
        return all(not is_array_index(key) and plain_value(item) for key, item in value.items())
    if isinstance(value, list | tuple):
        return all(plain_value(item) for item in value)
    if isinstance(value, bool) or value is None or isinstance(value, str):
        return True
    if isinstance(value, int):
        return -_MAX_SAFE < value < _MAX_SAFE
    if isinstance(value, float):
        return math.isfinite(value) and not value.is_integer() and not _needs_slow(value)
    return False


def js_key_order(value: dict[Any, Any]) -> list[Any]:
    """JavaScript objects list array-index keys first, ascending, then the rest in order."""
    keys = list(value)
    indices = [key for key in keys if is_array_index(key)]
    if not indices:
        return keys
    return sorted(indices, key=int) + [key for key in keys if not is_array_index(key)]


def _normalise(value: Any) -> tuple[Any, bool]:
    """Return (value with JS-incompatible numbers rewritten, whether a _Raw was needed)."""
    if isinstance(value, dict):
        slow = False
        out: dict[str, Any] = {}
        for key in js_key_order(value):
            out[key], item_slow = _normalise(value[key])
            slow = slow or item_slow
        return out, slow
    if isinstance(value, list | tuple):
        slow = False
        items = []
        for item in value:
            norm, item_slow = _normalise(item)
            items.append(norm)
            slow = slow or item_slow
        return items, slow
    if isinstance(value, bool) or value is None or isinstance(value, str):
        return value, False
    if isinstance(value, int):
        if -_MAX_SAFE < value < _MAX_SAFE:
            return value, False
        try:
            return _normalise(float(value))
        except OverflowError:
            return None, False  # JSON.parse makes it Infinity, written as null
    if isinstance(value, float):
        if not math.isfinite(value):
            return None, False  # JSON.stringify writes NaN and Infinity as null
        if value.is_integer() and abs(value) < _MAX_SAFE:
            return int(value), False
        if _needs_slow(value):
            return _Raw(js_number(value)), True
        return value, False
    raise TypeError(f"cannot serialise {type(value).__name__}")


def _encode_slow(value: Any) -> str:
    if isinstance(value, _Raw):
        return value.text
    if isinstance(value, dict):
        return (
            "{"
            + ",".join(
                _encoder.encode(key) + ":" + _encode_slow(item) for key, item in value.items()
            )
            + "}"
        )
    if isinstance(value, list):
        return "[" + ",".join(_encode_slow(item) for item in value) + "]"
    return _encoder.encode(value)


def _escape_surrogate(match: re.Match[str]) -> str:
    return f"\\u{ord(match.group()):04x}"


def has_lone_surrogate(text: str) -> bool:
    """Whether `text` holds a surrogate code point (only a lone one survives parsing)."""
    return not text.isascii() and _LONE_SURROGATE.search(text) is not None


# An array-index-like key ('"2":'), which JavaScript lists first whatever its position.
_INDEX_KEY = re.compile(rb'"[0-9]+"\s*:')


def dumps(value: Any, *, plain: bool = False, replace_surrogates: bool = False) -> bytes:
    """Serialise `value` to the UTF-8 bytes ``JSON.stringify`` would produce.

    `plain=True` promises that `value` holds nothing Python writes differently from
    JavaScript (see `loads_checked`), so Python's C encoder output is used as it is.
    Lone surrogates are written as ``\\udXXX`` escapes, as JSON.stringify does, or with
    `replace_surrogates` as U+FFFD, which every receiver's JSON parser accepts.
    """
    if plain:
        try:
            return orjson.dumps(value)
        except orjson.JSONEncodeError:
            pass  # a lone surrogate, refused by orjson: written below as JavaScript does
        text = _encoder.encode(value)
    else:
        normalised, slow = _normalise(value)
        text = _encode_slow(normalised) if slow else _encoder.encode(normalised)
    try:
        return text.encode("utf-8")
    except UnicodeEncodeError:
        # Lone surrogates (from "\ud800" escapes in the input): JS writes them escaped.
        if replace_surrogates:
            return _LONE_SURROGATE.sub("\ufffd", text).encode("utf-8")
        return _LONE_SURROGATE.sub(_escape_surrogate, text).encode("utf-8")


def _reject_constant(name: str) -> Any:
    raise ValueError(f"{name} is not valid JSON")


class TooDeep(ValueError):
    """The document nests arrays and objects deeper than MAX_DEPTH."""

    def __init__(self) -> None:
        super().__init__(f"arrays and objects may nest at most {MAX_DEPTH} levels deep")


_ONLY_STRUCTURE = bytes(range(256)).translate(None, b'[]{}"')
_AS_PARENS = bytes.maketrans(b"[]{}", b"()()")
_STRING = re.compile(rb'"[^"]*"')


def check_depth(data: bytes) -> None:
    """Raise TooDeep if the UTF-8 JSON text `data` nests deeper than MAX_DEPTH.

    Runs at C speed on bytes, without parsing: strings are cut out (escaped backslashes
    and quotes first, so every quote left delimits one), leaving only the brackets,
    whose nesting is then counted. For text that is not valid JSON the count is an
    upper bound up to the point where a parser would stop, which is all that matters.
    """
    if data.count(b"[") + data.count(b"{") <= MAX_DEPTH:
        return  # too few brackets to nest that deep: most single messages
    if b"\\" in data:
        data = data.replace(b"\\\\", b"").replace(b'\\"', b"")
    # Quotes and brackets only; two adjacent quotes enclose nothing that counts.
    shape = data.translate(None, _ONLY_STRUCTURE).replace(b'""', b"")
    if b'"' in shape:
        shape = _STRING.sub(b"", shape)
    shape = shape.translate(_AS_PARENS)
    if b"(" * (MAX_DEPTH + 1) in shape:
        raise TooDeep
    # Each pass removes the innermost level; real documents need only a few passes.
    depth = 0
    while depth < 8 and b"()" in shape:
        shape = shape.replace(b"()", b"")
        depth += 1
    # What is left: deeper nesting (rare), or brackets never matched (invalid JSON, but a
    # parser still descends into them). Count from the lowest point reached so far, so an
    # unmatched closer cannot hide what follows it.
    running = lowest = deepest = 0
    for byte in shape:
        running += 1 if byte == 40 else -1  # "(" or ")"
        lowest = min(lowest, running)
        deepest = max(deepest, running - lowest)
    if depth + deepest > MAX_DEPTH:
        raise TooDeep


_ASCII_OPENERS = (b"{", b"[")


def _text(data: bytes) -> str:
    """The JSON text of `data`, read as json.loads reads bytes (UTF-8, -16 or -32 by the
    first bytes) but strictly: invalid sequences are refused, not smuggled through as lone
    surrogates."""
    if data[:1] in _ASCII_OPENERS and data[1:2] != b"\x00":  # UTF-8, as nearly all are
        check_depth(data)
        return data.decode("utf-8")
    encoding = json.detect_encoding(data)
    if encoding.startswith("utf-8"):
        check_depth(data)
        return data.decode(encoding)
    text = data.decode(encoding)
    check_depth(text.encode("utf-8", "surrogatepass"))
    return text


# ---------------------------------------------------------------------------------------------
# Numbers past a double's range: JavaScript reads them as Infinity, which JSON.stringify
# writes as null, and Python will not even convert an integer of thousands of digits. efd
# refuses them wherever a number is written: in a message and in a condition.

OUT_OF_RANGE = "numbers are limited to a double's range, about ±1.8e308"
_DOUBLE_DIGITS = len(str(int(sys.float_info.max)))  # the most digits a finite double has


def whole_number(text: str) -> int | None:
    """The integer `text` (digits, perhaps a leading '-') spells, or None past a double's
    range."""
    digits = len(text) - text.startswith("-")
    if digits > _DOUBLE_DIGITS:
        return None
    value = int(text)
    if digits == _DOUBLE_DIGITS:
        try:
            float(value)
        except OverflowError:
            return None
    return value


def number_spelling(text: str) -> str:
    """A number's source text for a message: whole when short, else its start and length."""
    if len(text) <= 24:
        return text
    return f"{text[:12]}… ({sum(c.isdigit() for c in text)} digits)"


class OutOfRange(ValueError):
    """A JSON document holds a number past a double's range. `path` leads to it from the
    top: keys and list indices; `number` is its spelling (number_spelling)."""

    def __init__(self, path: tuple[str | int, ...], text: str) -> None:
        self.path = path
        self.number = number_spelling(text)
        super().__init__(
            f"{field_name(path) or 'the body'} holds the number {self.number}, out of range: "
            f"{OUT_OF_RANGE}"
        )


def field_name(path: Sequence[str | int]) -> str:
    """A path as the errors name a field: properties.items[2].price."""
    out = ""
    for step in path:
        out += f"[{step}]" if isinstance(step, int) else (f".{step}" if out else step)
    return out


class _Huge:
    """Stands, in a parsed document, for a number past a double's range, until the
    document's walk finds where it is."""

    __slots__ = ("text",)

    def __init__(self, text: str) -> None:
        self.text = text


def _find_huge(value: Any, path: tuple[str | int, ...]) -> OutOfRange | None:
    if isinstance(value, _Huge):
        return OutOfRange(path, value.text)
    if isinstance(value, dict):
        items: Any = value.items()
    elif isinstance(value, list):
        items = enumerate(value)
    else:
        return None
    for key, item in items:
        found = _find_huge(item, (*path, key))
        if found is not None:
            return found
    return None


def _refuse_huge(value: Any) -> Any:
    found = _find_huge(value, ())
    if found is not None:
        raise found
    return value  # a duplicate key replaced it: JSON.parse keeps the last value too


def _int_or_huge(text: str) -> int | _Huge:
    value = whole_number(text)
    return _Huge(text) if value is None else value


def _float_or_huge(text: str) -> float | _Huge:
    value = float(text)
    return _Huge(text) if value in _INFINITIES else value


_INFINITIES = (math.inf, -math.inf)
_decoder = json.JSONDecoder(
    parse_constant=_reject_constant, parse_float=_float_or_huge, parse_int=_int_or_huge
)


def loads(data: bytes | str) -> Any:
    """Parse strict JSON: NaN and Infinity are rejected, as JavaScript's JSON.parse does;
    so is nesting deeper than MAX_DEPTH (TooDeep), a number past a double's range
    (OutOfRange) and, in bytes, invalid Unicode."""
    if isinstance(data, str):
        check_depth(data.encode("utf-8", "surrogatepass"))
        return _refuse_huge(_decoder.decode(data))
    return _refuse_huge(_decoder.decode(_text(data)))


class _PlainCheck(threading.local):
    """One decoder per thread, built once: json.loads with hooks builds a new one per call,
    a measurable share of a one-message request. `plain` and `huge` are reset before each
    parse."""

    def __init__(self) -> None:
        self.plain = True
        self.huge = False
        self.decoder = json.JSONDecoder(
            parse_constant=_reject_constant, parse_float=self._float, parse_int=self._int
        )

    def _float(self, text: str) -> float | _Huge:
        value = float(text)
        if value.is_integer() or not 1e-4 <= abs(value) < 1e16:
            self.plain = False
            if value in _INFINITIES:
                self.huge = True
                return _Huge(text)
        return value

    def _int(self, text: str) -> int | _Huge:
        if len(text) <= 15:
            return int(text)
        self.plain = False
        value = whole_number(text)
        if value is None:
            self.huge = True
            return _Huge(text)
        return value


_plain_check = _PlainCheck()


def loads_checked(data: bytes) -> tuple[Any, bool]:
    """Parse like `loads`, and tell whether the result is *plain*: re-serialising it with
    Python's encoder gives JSON.stringify's bytes, so `dumps(..., plain=True)` is exact.

    Checking while parsing costs a Python call per number literal, far less than walking
    every parsed value again: Python and JavaScript only disagree on integral floats
    ("10.0"), floats Python writes with an exponent (below 1e-4, from 1e16), integers
    past 2**53, and array-index keys. Only a document holding a number past a double's
    range is walked, to name where it is (OutOfRange).
    """
    text = _text(data)
    check = _plain_check
    check.plain = _INDEX_KEY.search(data) is None
    check.huge = False
    value = check.decoder.decode(text)
    if check.huge:
        value = _refuse_huge(value)
    return value, check.plain
