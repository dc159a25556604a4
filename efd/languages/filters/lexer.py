"""FQL's lexer (pure): text to efd/languages/toolkit.py's tokens. A name token is a dotted field
path; its value is the path's segments, its `word` the name when it is one segment written
without escapes (so that it may be a keyword or a function)."""

from __future__ import annotations

import re
from typing import Final

from efd.languages.filters.tree import FqlError
from efd.languages.toolkit import (
    Scanner,
    SourceError,
    Token,
    unexpected_character,
    unterminated_string,
)

__all__ = ["KEYWORDS", "NAME_CHARS", "NAME_START", "tokenize"]

KEYWORDS: Final = frozenset({"and", "or", "not", "in", "true", "false", "null"})
# Segment's field names: a-z A-Z 0-9 _ -, anything else escaped with a backslash.
NAME_CHARS: Final = frozenset("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789_-")
NAME_START: Final = frozenset("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ_")

_DIGITS: Final = frozenset("0123456789")
_NUMBER: Final = re.compile(r"-?[0-9]+(\.[0-9]+)?([eE][+-]?[0-9]+)?")
_NAME_RUN: Final = re.compile(r"[A-Za-z0-9_-]*")
_OPERATORS: Final = frozenset({"!=", "<=", ">=", "=", "<", ">", "!", "(", ")", "[", "]", ","})
_WRONG_OPERATORS: Final = {"==": "'='", "&&": "'and'", "||": "'or'", "&": "'and'", "|": "'or'"}
# What may follow a '.' and is no name: the operators, quotes and the dot itself.
_NOT_NAMES: Final = frozenset("=!<>()[],'\"&|.")


def tokenize(text: str) -> tuple[list[Token], SourceError | None]:
    """FQL's tokens, up to the first lexical error (returned, not raised)."""
    return Lexer(text).scan()


def _escapable(c: str) -> bool:
    return c.isprintable() and not c.isspace() and c not in _NOT_NAMES


def _escape_hint(c: str) -> str:
    return f"{unexpected_character(c)}; in a field name, escape it with a backslash (\\{c})"


class Lexer(Scanner):
    error = FqlError
    language = "FQL"

    def token(self) -> Token:
        text, i = self.text, self.i
        c = text[i]
        line, col = self.line, self.column(i)
        if c in "'\"":
            value = self.string()
            return Token("str", value, text[i : self.i], line, col)
        if c in _DIGITS or (c == "-" and text[i + 1 : i + 2] in _DIGITS):
            m = _NUMBER.match(text, i)
            assert m is not None
            whole = m.group(1) is None and m.group(2) is None
            if whole and text[m.end() : m.end() + 1] in NAME_START:
                run = _NAME_RUN.match(text, m.end())
                assert run is not None
                word = m.group() + run.group()
                first = "a digit" if c != "-" else "'-'"
                self.fail(
                    f"'{word}' is not a number; to name a field that starts with {first}, "
                    f"escape its first character: \\{word}",
                    i,
                )
            return self.number(m)
        if c in NAME_START or c == "\\":
            segments, plain = self.path()
            single = segments[0] if plain and len(segments) == 1 else None
            return Token("name", segments, text[i : self.i], line, col, single)
        op = self.operator(_OPERATORS, _WRONG_OPERATORS)
        if op is not None:
            return op
        if c in NAME_CHARS:  # a digit or '-' not starting a number
            self.fail(f"unexpected {c!r}; a field name starts with a letter or '_'", i)
        if c == ".":
            self.fail("unexpected '.'; a field path starts with a name, e.g. context.page.url", i)
        if c.isprintable() and not c.isspace():
            self.fail(_escape_hint(c), i)
        self.fail(unexpected_character(c), i)

    def string(self) -> str:
        """Read a quoted string. A backslash before the quote, the other quote or a backslash
        stands for that character; any other backslash is kept, so that match() patterns
        such as 'ab\\*d' reach the glob as written."""
        text, start = self.text, self.i
        quote = text[start]
        out: list[str] = []
        j = start + 1
        start_line, start_col = self.line, self.column(start)
        while True:
            if j >= len(text):
                raise FqlError(unterminated_string(quote), start_line, start_col)
            ch = text[j]
            if ch == quote:
                self.i = j + 1
                return "".join(out)
            if ch == "\\" and text[j + 1 : j + 2] in ("'", '"', "\\"):
                out.append(text[j + 1])
                j += 2
                continue
            if ch == "\n":
                self.newline(j + 1)
            out.append(ch)
            j += 1

    def path(self) -> tuple[tuple[str, ...], bool]:
        """Read a dotted field path; return its segments and whether it had no escapes."""
        text, n = self.text, len(self.text)
        segments: list[str] = []
        plain = True
        while True:
            chars: list[str] = []
            while self.i < n:
                c = text[self.i]
                if c == "\\":
                    if self.i + 1 >= n:
                        self.fail("a '\\' in a field name must be followed by a character", self.i)
                    chars.append(text[self.i + 1])
                    plain = False
                    self.i += 2
                    if chars[-1] == "\n":
                        self.newline(self.i)
                elif c in NAME_CHARS:
                    chars.append(c)
                    self.i += 1
                else:
                    break
            segments.append("".join(chars))
            if self.i < n and text[self.i] == ".":
                nxt = text[self.i + 1 : self.i + 2]
                if not nxt or (nxt not in NAME_CHARS and nxt != "\\"):
                    if _escapable(nxt):
                        self.fail(_escape_hint(nxt), self.i + 1)
                    self.fail("expected a field name after '.'", self.i + 1)
                self.i += 1
                continue
            return tuple(segments), plain
