"""efd's trigger language against Segment's, @segment/destination-subscriptions (pinned in
tests/js/package-lock.json), run by tests/js/triggers-validate.mjs.

Triggers are made at random (seeded) from every construct the language has, mutated
character by character and spaced anew into texts that may or may not parse. Where efd
parses a text, Segment's parseFql must too, into the same tree, and both must answer alike on
every message; where parseFql refuses a text, efd must refuse it as well.
"""

from __future__ import annotations

import json
import random
import subprocess
from collections.abc import Iterator
from typing import Any, get_args

from efd.jsonjs import js_number
from efd.languages.toolkit import And
from efd.languages.triggers import Condition, Trigger, TriggerError, matches, parse
from efd.languages.triggers.tree import FieldKind, Operator
from tests.jsclients import JS, node

SEED = 52
STRINGS = ["track", "identify", "Order Completed", "a", "", "5", "true", "null", "x y", "ÄÖ"]
STRINGS += ["😀", "a\\b", "Order", "Completed", "-1", "a\nb"]
NUMBERS = ["0", "5", "-1", "1.5", "3", "100", "12345678901234567890", "0.1", "-0", "007"]
PATHS = ["a", "total", "s", "flag", "obj.a", "list.\\0", "list.\\1", "list.length", "s.length"]
PATHS += ["s.\\0", "obj.b.c", "a\\ b", "a-b", "a_b", "\\and", "zero.x", "empty.x", "f.x", "n.x"]
PATHS += ["a\\.b", "a\\[0\\]", "list.\\01", "obj.b", "emoji.\\0", "emoji.\\1", "emoji.length"]
FIELDS = ["type", "event", "name", "userId"]
FIELDS += [f"{kind}.{path}" for kind in ("properties", "traits", "context") for path in PATHS]
OPERATORS = ["=", "!=", "<", "<=", ">", ">="]
PATTERNS = ["Order*", "*Completed", "*", "a*", "*a", "😀*", "*b"]

# Texts Segment's parser is known to refuse, each a construct efd must refuse too.
REFUSED = [
    "",
    'type = "track" && event = "x"',
    'type = "track" || event = "x"',
    '((type = "track"))',
    "()",
    '! contains(event, "x")',
    '!!contains(event, "x")',
    "properties.$x = 1",
    "properties.ä = 1",
    "_x = 1",
    "event = 1.",
    "event = 1.5.3",
    'event =~ "x"',
    'event = "a',
    'contains(type, "x")',
    'event\u00a0= "a"',
    "type",
    "properties.a[0] = 1",
    "properties.a@b = 1",
]


def values(rnd: random.Random) -> str:
    kind = rnd.random()
    if kind < 0.5:
        return '"' + rnd.choice(STRINGS) + '"'
    if kind < 0.8:
        return rnd.choice(NUMBERS)
    return rnd.choice(["true", "false", "null"])


def condition_text(rnd: random.Random) -> str:
    field = rnd.choice(FIELDS)
    kind = rnd.random()
    if field == "type":
        kind = 1.0  # contains() and match() do not take type
    if kind < 0.2:
        bang = rnd.choice(["", "!"])
        return f'{bang}contains({field}, "{rnd.choice(STRINGS)}")'
    if kind < 0.35:
        bang = rnd.choice(["", "!"])
        return f'{bang}match({field}, "{rnd.choice(PATTERNS)}")'
    op = rnd.choice(OPERATORS)
    value = rnd.choice(NUMBERS) if op not in ("=", "!=") else values(rnd)
    return f"{field} {op} {value}"


def chain(rnd: random.Random, size: int, *, nested: bool) -> str:
    word = rnd.choice([" and ", " or "])
    items = []
    for _ in range(size):
        if nested and rnd.random() < 0.3:
            items.append("(" + chain(rnd, rnd.randint(1, 3), nested=False) + ")")
        else:
            items.append(condition_text(rnd))
    if not nested and rnd.random() < 0.8:
        # Inside parentheses a call may come last only (Segment ends the group at its ')').
        items.sort(key=lambda item: "(" in item)
    return word.join(items)


def mutate(rnd: random.Random, text: str) -> str:
    """One character deleted, inserted or replaced, or two swapped."""
    chars = list(text)
    i = rnd.randrange(len(chars) + 1)
    pick = rnd.choice("()!=<>\"'., \\-_aZ0&|\t\n\r*$")
    how = rnd.randrange(4)
    if how == 0 and i < len(chars):
        del chars[i]
    elif how == 1:
        chars.insert(i, pick)
    elif how == 2 and i < len(chars):
        chars[i] = pick
    elif i + 1 < len(chars):
        chars[i], chars[i + 1] = chars[i + 1], chars[i]
    return "".join(chars)


def respace(rnd: random.Random, text: str) -> str:
    """Each space dropped, doubled or made a tab or a line break; spaces around punctuation."""
    out = []
    for ch in text:
        if ch == " ":
            out.append(rnd.choice(["", " ", "\n", "\t", "  "]))
        elif ch in "()," and rnd.random() < 0.3:
            out.append(rnd.choice([" ", "\n"]) + ch + rnd.choice(["", " "]))
        else:
            out.append(ch)
    return "".join(out)


def triggers() -> list[str]:
    rnd = random.Random(SEED)
    made = [chain(rnd, rnd.randint(1, 4), nested=True) for _ in range(500)]
    mutated = [mutate(rnd, rnd.choice(made)) for _ in range(400)]
    twice = [mutate(rnd, mutate(rnd, rnd.choice(made))) for _ in range(400)]
    spaced = [respace(rnd, rnd.choice(made)) for _ in range(600)]
    return made + mutated + twice + spaced + REFUSED


def member_values(rnd: random.Random) -> Any:
    pool: list[Any] = [0, 5, -1, 1.5, 3, 100, 12345678901234567890, 0.1, -0.0, 2.5, 7]
    pool += [*STRINGS, True, False, None, [], ["a", "b"], {"a": 1}, "Order Completed"]
    return rnd.choice(pool)


def an_object(rnd: random.Random) -> dict[str, Any]:
    obj: dict[str, Any] = {}
    for key in ["a", "total", "s", "flag", "a b", "a-b", "a_b", "and", "b"]:
        if rnd.random() < 0.7:
            obj[key] = member_values(rnd)
    obj["obj"] = rnd.choice([{"a": member_values(rnd), "b": {"c": member_values(rnd)}}, {}, 0])
    obj["list"] = rnd.choice([["a", 5], [], [True], "ab", {"0": "x", "length": 9}])
    obj["zero"], obj["empty"], obj["f"], obj["n"] = 0, "", False, None
    obj["emoji"] = rnd.choice(["😀x", "x", ""])
    if rnd.random() < 0.2:
        obj["zero"] = {"x": member_values(rnd)}
    return obj


def messages() -> list[Any]:
    rnd = random.Random(SEED + 1)
    out: list[Any] = []
    for _ in range(30):
        message: dict[str, Any] = {}
        for key in FIELDS[:4]:
            if rnd.random() < 0.8:
                message[key] = member_values(rnd)
        if rnd.random() < 0.5:
            message["type"] = rnd.choice(["track", "identify"])
            message["event"] = rnd.choice(["Order Completed", "Order", "a", "5"])
        for key in ("properties", "traits", "context"):
            if rnd.random() < 0.9:
                message[key] = an_object(rnd)
            elif rnd.random() < 0.5:
                message[key] = rnd.choice([None, 0, "text", [1]])
        out.append(message)
    out += [{}, {"properties": None}, {"type": "track"}]
    return out


def reference(texts: list[str], msgs: list[Any], pairs: list[tuple[int, int]]) -> Any:
    done = subprocess.run(
        [node(), "triggers-validate.mjs"],
        cwd=JS,
        input=json.dumps({"triggers": texts, "messages": msgs, "pairs": pairs}),
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)


_KINDS = {
    "type": "event-type",
    "event": "event",
    "name": "name",
    "userId": "userId",
    "properties": "event-property",
    "traits": "event-trait",
    "context": "event-context",
}


def segment_form(node: Trigger) -> dict[str, Any]:
    """efd's tree in the form of Segment's parser, values as text (as validate reads them)."""
    if isinstance(node, Condition):
        out: dict[str, Any] = {"type": _KINDS[node.field.kind], "operator": node.op}
        if node.field.path:
            out["name"] = ".".join(node.field.path)
        if node.value is not None:
            out["value"] = node.value if isinstance(node.value, str) else js_number(node.value)
        return out
    operator = "and" if isinstance(node, And) else "or"
    return {
        "type": "group",
        "operator": operator,
        "children": [segment_form(n) for n in node.items],
    }


def normal(tree: dict[str, Any]) -> dict[str, Any]:
    """Segment's tree with a group of one unwrapped, names split as validate splits them and
    values as text."""
    if tree["type"] == "group":
        children = [normal(child) for child in tree["children"]]
        if len(children) == 1:
            return children[0]
        return {"type": "group", "operator": tree["operator"], "children": children}
    out = dict(tree)
    if "name" in out:
        out["name"] = ".".join(p for p in _split(out["name"]) if p)
    value = out.get("value")
    if isinstance(value, int | float) and not isinstance(value, bool):
        out["value"] = js_number(float(value))
    elif value is not None:
        out["value"] = str(value).lower() if isinstance(value, bool) else str(value)
    return out


def _split(name: str) -> list[str]:
    for sep in "[]":
        name = name.replace(sep, ".")
    return name.split(".")


def conditions(trees: list[Trigger]) -> Iterator[Condition]:
    for tree in trees:
        if isinstance(tree, Condition):
            yield tree
        else:
            yield from conditions(list(tree.items))


def test_triggers_match_segment() -> None:
    texts, msgs = triggers(), messages()
    trees: list[Trigger | None] = []
    for text in texts:
        try:
            trees.append(parse(text))
        except TriggerError:
            trees.append(None)
    pairs = [(t, m) for t, tree in enumerate(trees) if tree is not None for m in range(len(msgs))]
    ref = reference(texts, msgs, pairs)

    verdicts = dict(zip(texts, ref["trees"], strict=True))
    assert [text for text in REFUSED if "error" not in verdicts[text]] == []
    # The generated set must exercise both sides, and every operator and field of the tree.
    accepted = [tree for tree in trees if tree is not None]
    assert len(accepted) >= 700
    assert sum("error" in tree for tree in ref["trees"]) >= 200
    assert {c.op for c in conditions(accepted)} == set(get_args(Operator))
    assert {c.field.kind for c in conditions(accepted)} == set(get_args(FieldKind))

    for text, tree, theirs in zip(texts, trees, ref["trees"], strict=True):
        if "error" in theirs:
            assert tree is None, f"efd accepts what Segment refuses: {text!r}"
        elif tree is not None:
            assert segment_form(tree) == normal(theirs), text

    wrong = [
        (texts[t], msgs[m], answer)
        for (t, m), answer in zip(pairs, ref["results"], strict=True)
        if matches(trees[t], msgs[m]) is not answer  # type: ignore[arg-type]
    ]
    assert not wrong, f"{len(wrong)} of {len(pairs)} answers differ, e.g. {wrong[:3]}"
