"""The trigger language's lexer (pure): text to efd/languages/toolkit.py's tokens.

A name token is a dotted field path; its value is the path's segments with escapes resolved,
its `word` the name when it is one segment written without escapes (so that it may be a
keyword or a function). Segment's tokenizer is narrower than FQL's: strings are in double
quotes and hold no escapes, numbers have no exponent, only space, tab and newline separate
tokens, the operators but '=' need spaces around them, and so do `and` and `or` after
them, and a word written right after a string runs into it; so each of those is an error
here, with what to write instead.
"""

from __future__ import annotations

import re
from typing import Final

from efd.languages.toolkit import (
    Scanner,
    SourceError,
    Token,
    unexpected_character,
    unterminated_string,
)
from efd.languages.triggers.tree import TriggerError

__all__ = ["CONNECTIVES", "NAME_CHARS", "NAME_START", "Lexer", "tokenize"]

CONNECTIVES: Final = frozenset({"and", "or"})
NAME_CHARS: Final = frozenset("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789_-")
NAME_START: Final = frozenset("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ")
SPACES: Final = frozenset(" \t\n")

_DIGITS: Final = frozenset("0123456789")
_NUMBER: Final = re.compile(r"-?[0-9]+(\.[0-9]+)?([eE][+-]?[0-9]+)?")
_OPERATORS: Final = frozenset({"!=", "<=", ">=", "=", "<", ">", "!", "(", ")", ","})
_WRONG_OPERATORS: Final = {
    "==": "'='",
    "<>": "'!='",
    "&&": "'and'",
    "||": "'or'",
    "&": "'and'",
    "|": "'or'",
}
# Segment's tokenizer reads `a<3` and `a !=3` as something else: these need their spaces.
_SPACED: Final = frozenset({"!=", "<", "<=", ">", ">="})
# After a value, what would run into it: Segment's tokenizer reads `"a"or` as one token.
_RUNS_ON: Final = NAME_CHARS | {"\\", '"', "."}


def tokenize(text: str) -> tuple[list[Token], SourceError | None]:
    """The tokens of a trigger, up to the first lexical error (returned, not raised)."""
    return Lexer(text).scan()


def _escape_hint(c: str) -> str:
    return f"{unexpected_character(c)}; in a field name, escape it with a backslash (\\{c})"


class Lexer(Scanner):
    error = TriggerError
    language = "trigger syntax"

    def is_space(self, c: str) -> bool:
        return c in SPACES

    def token(self) -> Token:
        text, i = self.text, self.i
        c = text[i]
        line, col = self.line, self.column(i)
        if c == '"':
            value = self.string()
            self.separated("string")
            return Token("str", value, text[i : self.i], line, col)
        if c == "'":
            self.fail('a string is written in double quotes, e.g. "Order Completed"', i)
        if c in _DIGITS or (c == "-" and text[i + 1 : i + 2] in _DIGITS):
            m = _NUMBER.match(text, i)
            assert m is not None
            if m.group(2) is not None:
                self.fail(
                    f"the number {m.group()} has an exponent, which triggers do not take; "
                    "write it in full",
                    i,
                )
            token = self.number(m)
            if text[self.i : self.i + 1] == "." and text[self.i + 1 : self.i + 2] in _DIGITS:
                self.fail("unexpected '.': a number has one decimal point", self.i)
            if text[self.i : self.i + 1] == ".":
                self.fail("expected a digit after the decimal point", self.i + 1)
            self.separated("number")
            return token
        if c in NAME_START or c == "\\":
            segments, plain = self.path()
            single = segments[0] if plain and len(segments) == 1 else None
            after = text[self.i : self.i + 1]
            if single in CONNECTIVES and after and after not in SPACES:
                # Segment's tokenizer reads `or(` and `or!` as no connective at all.
                self.fail(f"write a space after '{single}'", self.i)
            return Token("name", segments, text[i : self.i], line, col, single)
        op = self.operator(_OPERATORS, _WRONG_OPERATORS)
        if op is not None:
            if op.value in _SPACED and not (
                text[i - 1 : i] in SPACES and text[self.i : self.i + 1] in SPACES
            ):
                self.fail(f"write a space on each side of '{op.value}'", i)
            return op
        if c in NAME_CHARS:  # a digit-less '-', or '_'
            self.fail(f"unexpected {c!r}; a field name starts with a letter", i)
        if c == ".":
            self.fail("unexpected '.'; a field path starts with a name, e.g. context.page.url", i)
        if c.isspace():
            self.fail(f"{unexpected_character(c)}; separate words with spaces", i)
        self.fail(unexpected_character(c), i)

    def separated(self, what: str) -> None:
        """A value must not run into what follows it."""
        nxt = self.text[self.i : self.i + 1]
        if nxt and nxt in _RUNS_ON:
            self.fail(f"expected a space after the {what}, found {nxt!r}", self.i)

    def string(self) -> str:
        """A double-quoted string, as written: Segment's triggers have no escapes, so a
        backslash is an ordinary character and a string cannot hold a double quote."""
        text, start = self.text, self.i
        end = text.find('"', start + 1)
        if end < 0:
            self.fail(unterminated_string('"'), start)
        for j in range(start + 1, end):
            if text[j] == "\n":
                self.newline(j + 1)
        self.i = end + 1
        return text[start + 1 : end]

    def path(self) -> tuple[tuple[str, ...], bool]:
        """Read a dotted field path; return its segments and whether it had no escapes."""
        text, n = self.text, len(self.text)
        segments: list[str] = []
        plain = True
        while True:
            chars: list[str] = []
            segment_plain = True
            start = self.i
            while self.i < n:
                c = text[self.i]
                if c == "\\":
                    escaped = text[self.i + 1 : self.i + 2]
                    if escaped in ("", "\n"):
                        self.fail("a '\\' in a field name must be followed by a character", self.i)
                    chars.append(escaped)
                    segment_plain = False
                    self.i += 2
                elif c in NAME_CHARS:
                    chars.append(c)
                    self.i += 1
                else:
                    break
            segment = "".join(chars)
            if segments and segment_plain and segment in CONNECTIVES:
                self.fail(
                    f"'{segment}' cannot name a field as written; escape it: \\{segment}", start
                )
            segments.append(segment)
            plain = plain and segment_plain
            if self.i < n and text[self.i] == ".":
                nxt = text[self.i + 1 : self.i + 2]
                if nxt in NAME_START or nxt == "\\":
                    self.i += 1
                    continue
                if nxt and nxt in NAME_CHARS:
                    self.fail(
                        f"a field name starts with a letter; escape its first character: \\{nxt}",
                        self.i + 1,
                    )
                if nxt and nxt.isprintable() and not nxt.isspace() and nxt not in "=!<>(),\"'.":
                    self.fail(_escape_hint(nxt), self.i + 1)
                self.fail("expected a field name right after '.'", self.i + 1)
            if self.i < n and text[self.i] not in SPACES and text[self.i] not in "=!<>(),":
                c = text[self.i]
                if c.isprintable() and not c.isspace() and c not in "\"'":
                    self.fail(_escape_hint(c), self.i)
            return tuple(segments), plain
