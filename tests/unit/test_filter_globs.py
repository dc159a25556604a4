"""match()'s globs: linear matching, the work bound, and the class rules (pure).

The hostile inputs are the ones that stalled the daemon when globs were backtracking regular
expressions; each must give its documented answer within a step count fixed by the input.
"""

from __future__ import annotations

import random
from functools import cache
from typing import Any

import pytest

from efd.languages.filters import FqlError, compile_condition, parse
from efd.languages.filters.glob import MAX_PATTERN, MAX_STEPS, compile_glob


def holds(text: str, message: dict[str, Any]) -> bool:
    return compile_condition(parse(text))(message)


def test_the_stars_of_a_configured_pattern_do_not_backtrack() -> None:
    pattern = "*a*a*a*a*a*a*a*a*a*b"
    message = {"event": "a" * 40}
    assert not holds(f"match(event, '{pattern}')", message)
    assert compile_glob(pattern).run("a" * 40) == (False, 1)  # the tail alone decides
    # Found left to right in one pass, the segments cost the characters passed over.
    assert compile_glob("*a*a*a*a*a*a*a*a*a*ab").run("a" * 39 + "b") == (True, 11)
    assert compile_glob("*a*b*a*b*c").run("ab" * 20_000 + "c") == (True, 5)


def test_a_pattern_from_the_message_does_not_backtrack() -> None:
    message = {"properties": {"s": "a" * 70, "p": "*a*a*a*a*a*a*a*a*b"}}
    assert not holds("match(properties.s, properties.p)", message)
    message["properties"]["s"] = "a" * 70 + "b"
    assert holds("match(properties.s, properties.p)", message)


def test_a_match_needing_more_than_the_budget_is_false() -> None:
    # A middle segment with wildcards tried at each of 32,000 positions: 997 steps each.
    glob = compile_glob("*" + "?a" * 498 + "b*")
    text = "a" * 32_000
    assert glob.run(text) == (False, MAX_STEPS // 997 * 997)
    assert holds("match(s, p)", {"s": text, "p": "*" + "?a" * 498 + "b*"}) is False
    assert holds("!match(s, p)", {"s": text, "p": "*" + "?a" * 498 + "b*"}) is True
    # Within the budget the same pattern matches.
    near = "a" * 500 + "ba" * 498 + "b"
    matched, steps = glob.run(near)
    assert matched
    assert steps <= MAX_STEPS
    # A class costs one step, and four more per member beyond U+FFFF.
    wide = compile_glob("*[" + "".join(chr(0x10000 + 2 * i) for i in range(900)) + "]b*")
    assert wide.run("a" * 32_000) == (False, MAX_STEPS // 3602 * 3602)
    assert compile_glob("*[a-z0-9_]b*").run("a" * 32_000) == (False, 2 * (32_000 - 1))


def test_literal_segments_cost_the_characters_passed_over() -> None:
    text = "x" * 30_000 + "needle" + "y" * 2_000 + "end"
    assert compile_glob("*needle*end").run(text) == (True, 3 + 30_000 + 6)
    assert compile_glob("*needle*nope").run(text) == (False, 4)
    assert compile_glob("*nope*").run(text) == (False, len(text))
    # Without a star, the lengths must agree before anything is compared.
    assert compile_glob("a?c").run("abcd") == (False, 0)
    assert compile_glob("a?c").run("abc") == (True, 3)


def test_a_pattern_is_at_most_max_pattern_characters() -> None:
    longest = "*" * (MAX_PATTERN - 1) + "a"
    assert compile_glob(longest).match("ba")
    with pytest.raises(ValueError, match=f"longer than {MAX_PATTERN} characters"):
        compile_glob(longest + "a")
    # Refused at load when written, nothing matched when read from the message.
    with pytest.raises(FqlError, match="longer than"):
        parse(f"match(event, '{longest}a')")
    assert not holds("match(s, p)", {"s": "baa", "p": longest + "a"})


@pytest.mark.parametrize(
    ("pattern", "offset"),
    [("[x-]", 2), ("[-x]", 1), ("[a-c-e]", 4), ("[^-]", 2), ("x[a-b-]", 5)],
)
def test_a_dash_stands_only_within_a_range(pattern: str, offset: int) -> None:
    # As Segment's matcher reads them: such a class matches nothing there.
    with pytest.raises(ValueError, match=f"the '-' at offset {offset} .* write '\\\\-'"):
        compile_glob(pattern)
    with pytest.raises(FqlError, match="is not between the two ends of a range"):
        parse(f"match(event, '{pattern}')")
    for text in ("x", "-", "a", "e", "b"):
        assert not holds("match(s, p)", {"s": text, "p": pattern})


def test_an_escaped_dash_is_a_member() -> None:
    glob = compile_glob("[x\\-]")
    assert [glob.match(c) for c in "x-y"] == [True, True, False]
    assert compile_glob("[\\--\\/]").match(".")  # a range from '-' to '/'


# An independent reference: the textbook recursive matcher, on short inputs only.


def reference(pattern: str, text: str) -> bool:
    @cache
    def at(p: int, t: int) -> bool:
        if p == len(pattern):
            return t == len(text)
        c = pattern[p]
        if c == "*":
            return at(p + 1, t) or (t < len(text) and at(p, t + 1))
        if t == len(text):
            return False
        if c == "?":
            return at(p + 1, t + 1)
        if c == "[":
            end = pattern.index("]", p + 2)
            body = pattern[p + 1 : end]
            negate = body[0] in "^!"
            members = body[1:] if negate else body
            ranges, j = [], 0
            while j < len(members):
                if j + 2 < len(members) and members[j + 1] == "-":
                    ranges.append((members[j], members[j + 2]))
                    j += 3
                else:
                    ranges.append((members[j], members[j]))
                    j += 1
            inside = any(low <= text[t] <= high for low, high in ranges)
            return inside != negate and at(end + 1, t + 1)
        if c == "\\":
            return text[t] == pattern[p + 1] and at(p + 2, t + 1)
        return text[t] == c and at(p + 1, t + 1)

    return at(0, 0)


def test_globs_agree_with_the_reference() -> None:
    pieces = ["a", "b", "*", "*", "?", "[ab]", "[^a]", "[!b]", "[a-b]", "\\*", "-"]
    rnd = random.Random(49)
    for _ in range(1_500):
        pattern = "".join(rnd.choice(pieces) for _ in range(rnd.randint(0, 7)))
        text = "".join(rnd.choice("ab*-") for _ in range(rnd.randint(0, 9)))
        assert compile_glob(pattern).match(text) is reference(pattern, text), (pattern, text)
