"""The glob patterns of match() (pure): *, ?, [abc], [a-z], [^abc] and \\x, matched without
backtracking and within a fixed amount of work (docs/filters.md, "The work of a message").

A pattern is cut at its stars into segments of single-character items. Each segment has a
fixed width, so the leftmost place where a segment fits is always the best one for what
follows: the middle segments are found one after another, left to right, and the whole match
is one pass over the string. A literal segment is found with str.find (linear); a segment
holding `?` or a class is a regular expression without repetition, which tries each start
position once and tests each of its items at most once there.

The work is counted in steps, the same on every machine: a literal segment costs the
characters it passes over; any other segment, for each start position it tries, one step per
item, and a class four more per member (character or range) reaching beyond U+FFFF, which the
regular-expression engine tests one by one (the others it looks up at once). A match that
would need more than MAX_STEPS is false.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Final

__all__ = ["MAX_PATTERN", "MAX_STEPS", "Glob", "compile_glob"]

MAX_PATTERN: Final = 1000  # characters of a pattern
MAX_STEPS: Final = 1_000_000  # steps of one match


@dataclass(frozen=True, slots=True)
class _Segment:
    """Items between two stars: a literal text, or a regular expression of fixed width."""

    width: int
    cost: int  # steps of testing it at one position
    literal: str | None
    regex: re.Pattern[str] | None

    def at(self, text: str, pos: int) -> bool:
        """Whether the segment matches text[pos:pos + width] (the caller checked the room)."""
        if self.literal is not None:
            return text.startswith(self.literal, pos)
        assert self.regex is not None
        return self.regex.match(text, pos) is not None


@dataclass(frozen=True, slots=True)
class Glob:
    """A compiled pattern: `head` before the first star, `tail` after the last, `middle`
    between them; without a star, `head` is the whole pattern."""

    head: _Segment
    middle: tuple[_Segment, ...]
    tail: _Segment | None  # None: the pattern has no star

    def match(self, text: str) -> bool:
        """Whether the pattern matches the whole of `text`."""
        return self.run(text)[0]

    def run(self, text: str) -> tuple[bool, int]:
        """(whether it matches, the steps taken); a match needing more than MAX_STEPS
        stops there, false."""
        head, tail, n = self.head, self.tail, len(text)
        if tail is None:
            if n != head.width:
                return False, 0
            return head.at(text, 0), head.cost
        start, end = head.width, n - tail.width
        if end < start:
            return False, 0
        steps = head.cost + tail.cost
        if not (head.at(text, 0) and tail.at(text, end)):
            return False, steps
        pos = start
        for segment in self.middle:
            width, cost = segment.width, segment.cost
            budget = MAX_STEPS - steps
            if segment.literal is not None:
                # The search passes over at most the window: cut it to what the budget allows.
                limit = min(end, pos + budget)
                found = text.find(segment.literal, pos, limit)
                if found < 0:
                    return False, steps + max(0, limit - pos)
                steps += found - pos + width
            else:
                assert segment.regex is not None
                tries = min(end - pos - width + 1, budget // cost)
                if tries <= 0:
                    return False, steps if end - pos < width else MAX_STEPS
                hit = segment.regex.search(text, pos, pos + tries + width - 1)
                if hit is None:
                    return False, steps + tries * cost
                found = hit.start()
                steps += (found - pos + 1) * cost
            pos = found + width
        return True, steps


def compile_glob(pattern: str) -> Glob:
    """The compiled pattern; ValueError naming the problem when it is malformed or longer
    than MAX_PATTERN characters."""
    if len(pattern) > MAX_PATTERN:
        raise ValueError(f"the pattern is longer than {MAX_PATTERN} characters")
    segments: list[_Segment] = []
    items: list[str] = []  # regular-expression items of the current segment
    cost = 0  # the steps of testing them at one position
    literal: list[str] | None = []  # its text while every item is a plain character
    i, n = 0, len(pattern)
    while i < n:
        c = pattern[i]
        if c == "*":
            segments.append(_segment(items, literal, cost))
            items, literal, cost = [], [], 0
            while i < n and pattern[i] == "*":
                i += 1
            continue
        if c == "?":
            items.append(".")
            literal = None
        elif c == "[":
            i, class_cost = _class(pattern, i, items)
            cost += class_cost
            literal = None
            continue
        else:
            if c == "\\":
                if i + 1 >= n:
                    raise ValueError(
                        "the pattern ends with a lone '\\'; write '\\\\' for a backslash"
                    )
                i += 1
                c = pattern[i]
            items.append(re.escape(c))
            if literal is not None:
                literal.append(c)
        cost += 1
        i += 1
    segments.append(_segment(items, literal, cost))
    if len(segments) == 1:
        return Glob(segments[0], (), None)
    return Glob(segments[0], tuple(s for s in segments[1:-1] if s.width), segments[-1])


def _segment(items: list[str], literal: list[str] | None, cost: int) -> _Segment:
    if literal is not None:
        return _Segment(len(items), cost, "".join(literal), None)
    return _Segment(len(items), cost, None, re.compile("".join(items), re.DOTALL))


def _class(pattern: str, start: int, items: list[str]) -> tuple[int, int]:
    """Append the class opening at pattern[start] as one item; return the index after its
    ']' and the steps of testing it. A '-' stands only between the two ends of a range
    (`\\-` for the character), as in Segment's matcher, where `[x-]` matches nothing."""
    i, n = start + 1, len(pattern)
    negate = i < n and pattern[i] in "^!"
    if negate:
        i += 1
    chars: list[str] = []
    wide = 0  # members reaching beyond U+FFFF

    def end_at(j: int) -> tuple[str, int]:
        """The possibly escaped character at pattern[j], and the index after it."""
        if j >= n:
            return "", j
        c = pattern[j]
        if c == "-":
            raise ValueError(
                f"the '-' at offset {j} of the pattern is not between the two ends of a "
                "range; write '\\-' for the character '-'"
            )
        if c == "\\":
            if j + 1 >= n:
                return "", n
            return pattern[j + 1], j + 2
        return c, j + 1

    while i < n and pattern[i] != "]":
        low, i = end_at(i)
        if i < n and pattern[i] == "-":
            if i + 1 < n and pattern[i + 1] == "]":
                raise ValueError(
                    f"the '-' at offset {i} of the pattern is not between the two ends of a "
                    "range; write '\\-' for the character '-'"
                )
            high, i = end_at(i + 1)
            if not high:
                break
            if ord(high) < ord(low):
                raise ValueError(f"the range '{low}-{high}' in the pattern runs backwards")
            chars.append(f"{re.escape(low)}-{re.escape(high)}")
            wide += ord(high) > 0xFFFF
        elif low:
            chars.append(re.escape(low))
            wide += ord(low) > 0xFFFF
    if i >= n:
        raise ValueError(f"the '[' at offset {start} of the pattern is never closed by ']'")
    if not chars:
        raise ValueError(f"the class at offset {start} of the pattern is empty")
    items.append(("[^" if negate else "[") + "".join(chars) + "]")
    return i + 1, 1 + 4 * wide
