"""The audience language's tokenizer (pure)."""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from typing import Final
from typing import Literal as Lit

from efd import jsonjs
from efd.languages.audiences.tree import ParseError

# ---------------------------------------------------------------------------------------------
# Tokenizer


@dataclass(frozen=True, slots=True)
class Token:
    kind: Lit["str", "num", "name", "op", "end"]
    value: str | int | float  # names are lower-cased: keywords and functions ignore case
    text: str  # the source spelling, for messages
    line: int
    column: int


_NUMBER: Final = re.compile(r"[0-9]+(\.[0-9]+)?([eE][+-]?[0-9]+)?")
_NAME: Final = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
_ESCAPES: Final = {"\\": "\\", "'": "'", '"': '"', "n": "\n", "r": "\r", "t": "\t"}
_TWO_CHAR_OPS: Final = ("==", "!=", "<=", ">=")
_ONE_CHAR_OPS: Final = "()<>=.,-:"  # ':' only to reject within(parent: ...) clearly


def tokenize(text: str) -> tuple[list[Token], ParseError | None]:
    """Tokens up to the end or to the first lexical error, which is returned, not raised,
    so that the parser reports whichever error comes first in the text."""
    tokens: list[Token] = []
    try:
        _scan(text, tokens)
    except ParseError as err:
        tokens.append(Token("end", "", "", err.line, err.column))
        return tokens, err
    return tokens, None


def _scan(text: str, tokens: list[Token]) -> None:
    i, n = 0, len(text)
    line, line_start = 1, 0
    while i < n:
        c = text[i]
        if c == "\n":
            line += 1
            i += 1
            line_start = i
            continue
        if c.isspace():
            i += 1
            continue
        col = i - line_start + 1
        if c in "'\"":
            start = i
            value, i = _read_string(text, i, line, line_start)
            tokens.append(Token("str", value, text[start:i], line, col))
            continue
        m = _NUMBER.match(text, i)
        if m:
            raw = m.group()
            num: int | float | None
            if m.group(1) is None and m.group(2) is None:
                num = jsonjs.whole_number(raw)
            else:
                num = float(raw)
                num = num if math.isfinite(num) else None
            if num is None:
                raise ParseError(
                    f"the number {jsonjs.number_spelling(raw)} is out of range: "
                    f"{jsonjs.OUT_OF_RANGE}",
                    line,
                    col,
                )
            tokens.append(Token("num", num, raw, line, col))
            i = m.end()
            continue
        m = _NAME.match(text, i)
        if m:
            tokens.append(Token("name", m.group().lower(), m.group(), line, col))
            i = m.end()
            continue
        two = text[i : i + 2]
        if two in _TWO_CHAR_OPS:
            tokens.append(Token("op", two, two, line, col))
            i += 2
            continue
        if c in _ONE_CHAR_OPS:
            tokens.append(Token("op", c, c, line, col))
            i += 1
            continue
        if c in "&|":
            word = "and" if c == "&" else "or"
            raise ParseError(f"unexpected character '{c}'; write '{word}'", line, col)
        if c == "!":
            raise ParseError("unexpected character '!'; write 'not' or '!='", line, col)
        raise ParseError(f"unexpected character {c!r}", line, col)
    tokens.append(Token("end", "", "", line, n - line_start + 1))


def _read_string(text: str, start: int, line: int, line_start: int) -> tuple[str, int]:
    """Read a quoted string starting at text[start]; return (value, index after the quote)."""
    quote = text[start]
    out: list[str] = []
    j = start + 1
    while True:
        # A raw newline means the closing quote is missing: report the opening quote.
        if j >= len(text) or text[j] == "\n":
            raise ParseError("unterminated string", line, start - line_start + 1)
        ch = text[j]
        if ch == quote:
            return "".join(out), j + 1
        if ch != "\\":
            out.append(ch)
            j += 1
            continue
        esc = text[j + 1] if j + 1 < len(text) else ""
        col = j - line_start + 1
        if esc in _ESCAPES and esc:
            out.append(_ESCAPES[esc])
            j += 2
        elif esc == "u":
            digits = text[j + 2 : j + 6]
            if len(digits) != 4 or not all(d in "0123456789abcdefABCDEF" for d in digits):
                raise ParseError("\\u must be followed by 4 hex digits", line, col)
            code = int(digits, 16)
            if 0xD800 <= code <= 0xDFFF:
                raise ParseError("\\u escapes of surrogates are not allowed", line, col)
            out.append(chr(code))
            j += 6
        elif esc in ("", "\n"):
            raise ParseError("unterminated string", line, start - line_start + 1)
        else:
            raise ParseError(f"unknown escape '\\{esc}' in string", line, col)
