"""The audience language's lexer (pure): text to efd/languages/toolkit.py's tokens. Names are
lower-cased in a token's value and word: keywords, functions and methods ignore case."""

from __future__ import annotations

import re
from typing import Final

from efd.languages.audiences.tree import ParseError
from efd.languages.toolkit import (
    NUMBER,
    Scanner,
    SourceError,
    Token,
    unexpected_character,
    unterminated_string,
)

__all__ = ["tokenize"]

_NAME: Final = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
_ESCAPES: Final = {"\\": "\\", "'": "'", '"': '"', "n": "\n", "r": "\r", "t": "\t"}
# ':' only to refuse within(parent: ...) clearly.
_OPERATORS: Final = frozenset({"==", "!=", "<=", ">=", *"()<>=.,-:"})
_WRONG_OPERATORS: Final = {
    "&&": "'and'",
    "||": "'or'",
    "&": "'and'",
    "|": "'or'",
    "!": "'not' or '!='",
}


def tokenize(text: str) -> tuple[list[Token], SourceError | None]:
    """The audience language's tokens, up to the first lexical error (returned, not raised)."""
    return Lexer(text).scan()


class Lexer(Scanner):
    error = ParseError
    language = "in the audience language"

    def token(self) -> Token:
        text, i = self.text, self.i
        c = text[i]
        if c in "'\"":
            line, col = self.line, self.column(i)
            value = self.string()
            return Token("str", value, text[i : self.i], line, col)
        m = NUMBER.match(text, i)
        if m:
            return self.number(m)
        m = _NAME.match(text, i)
        if m:
            name = m.group().lower()
            self.i = m.end()
            return Token("name", name, m.group(), self.line, self.column(i), name)
        op = self.operator(_OPERATORS, _WRONG_OPERATORS)
        if op is not None:
            return op
        self.fail(unexpected_character(c), i)

    def string(self) -> str:
        """Read a quoted string; a string ends on its line."""
        text, start = self.text, self.i
        quote = text[start]
        out: list[str] = []
        j = start + 1
        while True:
            if j >= len(text):
                self.fail(unterminated_string(quote), start)
            ch = text[j]
            if ch == quote:
                self.i = j + 1
                return "".join(out)
            if ch == "\n":
                self.fail(unterminated_string(quote, at_line_end=True), start)
            if ch != "\\":
                out.append(ch)
                j += 1
                continue
            esc = text[j + 1 : j + 2]
            if esc in _ESCAPES:
                out.append(_ESCAPES[esc])
                j += 2
            elif esc == "u":
                digits = text[j + 2 : j + 6]
                if len(digits) != 4 or not all(d in "0123456789abcdefABCDEF" for d in digits):
                    self.fail("\\u must be followed by 4 hex digits", j)
                code = int(digits, 16)
                if 0xD800 <= code <= 0xDFFF:
                    self.fail("\\u escapes of surrogates are not allowed", j)
                out.append(chr(code))
                j += 6
            elif esc == "":
                self.fail(unterminated_string(quote), start)
            elif esc == "\n":
                self.fail(unterminated_string(quote, at_line_end=True), start)
            else:
                self.fail(f"unknown escape '\\{esc}' in string", j)
