"""efd's mappings against Segment's own mapping kit, @segment/actions-core (pinned in
tests/js/package-lock.json): the same mappings on the same messages give the same bodies.

The mappings are made at random (seeded) from every directive, nested in one another, and
each is applied to every message. A result agrees when both give the same body, byte for
byte as efd's JSON writer writes it (key order included), when the kit's result is undefined
and efd says the mapping gives no value, or when both refuse. The generator keeps to what
efd accepts at load; what efd refuses that the kit lets through is docs/actions.md's list,
shown by the last test here.
"""

from __future__ import annotations

import json
import random
import subprocess
from typing import Any

from efd import jsonjs
from efd.languages.mapping import DIRECTIVES, MappingError, apply, compile
from tests.jsclients import JS, node

MESSAGES: list[dict[str, Any]] = [
    {
        "type": "track",
        "event": "Order Completed",
        "userId": "u-1",
        "traits": {"email": "Ann@Example.COM", "name": "Ann", "age": 0, "tags": ["a", "b"]},
        "properties": {
            "order_id": "o-17",
            "revenue": 19.5,
            "big": 1e21,
            "small": 1e-7,
            "zero": 0,
            "empty": "",
            "none": None,
            "flag": False,
            "which": "revenue",
            "json": '{"a": [1, 2], "b": "x"}',
            "bad_json": "{nope",
            "items": [{"sku": "A-1", "price": 5, "meta": None}, {"sku": "b.2", "price": 7.25}],
            "obj": {"k": "v", "10": "ten", "n": None, "deep": {"x": None, "y": [1, None]}},
            "list": [1, "two", None, [3, 4]],
            "text": "Hello hello HELLO $1",
            "unicode": "Ärger ß 😀",
        },
    },
    {"type": "identify", "userId": None, "traits": {"email": "", "tags": []}, "properties": {}},
    {"type": "page", "properties": {"items": {"sku": "solo"}, "revenue": "12", "flag": True}},
]

PATHS = [
    "$.",
    ".",
    "",
    "$.userId",
    "$.traits.email",
    "traits.name",
    "$.traits.age.x",
    "$.traits.tags",
    "$.traits.tags[1]",
    "$.traits.tags.length",
    "$.properties.items[0].sku",
    "$.properties.items.1.price",
    "$.properties['order_id']",
    '$.properties["obj"].k',
    "$.properties.obj",
    "$.properties.obj.deep",
    "$.properties.list",
    "$.properties.none",
    "$.properties.none.x",
    "$.properties.zero",
    "$.properties.empty",
    "$.properties.flag",
    "$.properties.revenue",
    "$.properties.big",
    "$.properties.small",
    "$.properties.text",
    "$.properties.unicode",
    "$.properties.unicode.length",
    "$.properties.json",
    "$.properties.bad_json",
    "$.missing",
    "$.missing.deeper",
    "$.event",
]
ITEM_PATHS = ["$.sku", "$.price", "$.meta", "$.", "sku", "$.nope"]
TEMPLATES = [
    "{{userId}} paid {{properties.revenue}}",
    "{{{traits.email}}}",
    "{{ properties.items }}",
    "{{properties.obj}}",
    "x{{missing}}y",
    "{{properties.none}}-{{properties.flag}}-{{properties.zero}}",
    "{{properties.list}}",
    "{{properties.big}}/{{properties.small}}",
    "{{}}",
    "{{ }}",
    "plain",
    "",
    "{{traits.tags[0]}} {{traits.tags.length}}",
    "{{{properties.text}}} {{properties.unicode}}",
]
SCALARS: list[Any] = ["text", "", 0, 1, -2.5, True, False, None, "Mixed Case", "a.b$c"]
PATTERNS = ["hello", "l", ".", "$", "a", "HELLO", "-", "😀", "ß", "1"]
REPLACEMENTS = ["", "x", "$&", "$$", "$1", "$`", "$'", "[$&]", "-"]


class Generator:
    def __init__(self, seed: int) -> None:
        self.rnd = random.Random(seed)

    def pick(self, options: list[Any]) -> Any:
        return self.rnd.choice(options)

    def path(self) -> dict[str, Any]:
        roll = self.rnd.random()
        if roll < 0.1:
            return {"@path": {"@template": "$.properties.{{properties.which}}"}}
        if roll < 0.12:
            # A path made by a directive that gives a number: both refuse it when it runs.
            return {"@path": {"@path": "$.properties.revenue"}}
        return {"@path": self.pick(PATHS)}

    def value(self, depth: int) -> Any:
        roll = self.rnd.random()
        if depth >= 3 or roll < 0.25:
            return self.pick(SCALARS) if roll < 0.1 else self.path()
        if roll < 0.35:
            return {f"k{i}": self.value(depth + 1) for i in range(self.rnd.randint(0, 3))}
        if roll < 0.42:
            return [self.value(depth + 1) for _ in range(self.rnd.randint(0, 2))]
        return self.directive(depth + 1)

    def string_arg(self, depth: int) -> Any:
        return self.pick(["Some Text", "", "ÄB"]) if self.rnd.random() < 0.2 else self.path()

    def directive(self, depth: int) -> dict[str, Any]:
        name = self.pick(list(DIRECTIVES))
        rnd = self.rnd
        if name == "@path":
            return self.path()
        if name == "@template":
            return {"@template": self.pick(TEMPLATES)}
        if name == "@literal":
            return {"@literal": self.value(depth)}
        if name == "@if":
            opts: dict[str, Any] = {}
            opts["exists" if rnd.random() < 0.5 else "blank"] = self.path()
            if rnd.random() < 0.8:
                opts["then"] = self.value(depth)
            if rnd.random() < 0.7:
                opts["else"] = (
                    self.pick([False, 0, "", None, "fallback"])
                    if rnd.random() < 0.3
                    else self.value(depth)
                )
            return {"@if": opts}
        if name == "@arrayPath":
            root: Any = self.pick(
                ["$.properties.items", "$.traits.tags", "$.properties.obj", "$.missing", "$.userId"]
            )
            if rnd.random() < 0.2:
                root = {"@path": root}
            shape = self.pick(
                [
                    {
                        "sku": {"@path": self.pick(ITEM_PATHS)},
                        "p": {"@path": self.pick(ITEM_PATHS)},
                    },
                    {"@path": self.pick(ITEM_PATHS)},
                    {"c": {"@case": {"operator": "upper", "value": {"@path": "$.sku"}}}},
                    {
                        "@transform": {
                            "apply": {"s": {"@path": "$.sku"}},
                            "mapping": {"@path": "$.s"},
                        }
                    },
                    {},
                    None,
                ]
            )
            return {"@arrayPath": [root] if shape is None else [root, shape]}
        if name == "@case":
            case: dict[str, Any] = {"operator": self.pick(["lower", "upper"])}
            if rnd.random() < 0.9:
                case["value"] = self.string_arg(depth)
            return {"@case": case}
        if name == "@replace":
            rep: dict[str, Any] = {"pattern": self.pick(PATTERNS), "value": self.string_arg(depth)}
            for key, options in (
                ("replacement", REPLACEMENTS),
                ("ignorecase", [True, False]),
                ("global", [True, False]),
            ):
                if rnd.random() < 0.6:
                    rep[key] = self.pick(options)
            if rnd.random() < 0.3:
                rep["pattern2"] = self.pick(PATTERNS)
                if rnd.random() < 0.5:
                    rep["replacement2"] = self.pick(REPLACEMENTS)
            return {"@replace": rep}
        if name == "@merge":
            objects = [
                self.pick([{"a": 1, "b": None}, {"a": self.path()}, {"c": "x"}, {}])
                if rnd.random() < 0.6
                else {
                    "@path": self.pick(
                        [
                            "$.properties.obj",
                            "$.traits",
                            "$.traits.tags",
                            "$.traits.name",
                            "$.missing",
                            "$.properties.none",
                        ]
                    )
                }
                for _ in range(rnd.randint(0, 3))
            ]
            return {"@merge": {"direction": self.pick(["left", "right"]), "objects": objects}}
        if name == "@transform":
            apply_: dict[str, Any] = {"x": self.value(depth), "y": self.path()}
            if rnd.random() < 0.2:
                apply_ = {"@path": "$.properties"}
            mapping = self.pick(
                [
                    {"out": {"@path": "$.x"}, "y": {"@path": "$.y"}},
                    {"@path": "$."},
                    {"t": {"@template": "{{x}}|{{y}}"}},
                ]
            )
            return {"@transform": {"apply": apply_, "mapping": mapping}}
        if name == "@flatten":
            flat: dict[str, Any] = {
                "separator": self.pick([".", "_", "::"]),
                "value": self.pick(
                    [
                        self.path(),
                        {"@path": "$.properties.obj"},
                        {"@path": "$.properties"},
                        {"a": {"b": [1, {"c": None}]}},
                    ]
                ),
            }
            if rnd.random() < 0.5:
                flat["omitArrays"] = self.pick([True, False])
            return {"@flatten": flat}
        if name == "@json":
            value: Any = (
                self.path()
                if rnd.random() < 0.8
                else self.pick(["[1,2]", "not json", {"a": [1, None]}, 7])
            )
            return {"@json": {"mode": self.pick(["encode", "decode"]), "value": value}}
        return {
            "@excludeWhenNull": self.pick(
                [
                    self.path(),
                    {"@path": "$.properties.obj"},
                    {"a": None, "b": {"c": None, "d": 1}, "e": [None]},
                ]
            )
        }

    def mapping(self) -> dict[str, Any]:
        if self.rnd.random() < 0.15:
            return self.directive(1)
        return {f"f{i}": self.value(1) for i in range(self.rnd.randint(1, 4))}


def efd_result(mapping: Any, message: Any) -> dict[str, Any]:
    try:
        compiled = compile(mapping)
    except MappingError as error:
        return {"refused": str(error)}
    try:
        return {"value": jsonjs.dumps(apply(compiled, message)).decode()}
    except MappingError as error:
        if "gives no value" in str(error):
            return {"undefined": True}
        return {"error": str(error)}


def agree(ours: dict[str, Any], theirs: dict[str, Any]) -> bool:
    if "value" in theirs:
        return ours == {"value": jsonjs.dumps(theirs["value"]).decode()}
    if "undefined" in theirs:
        return ours == theirs
    return "error" in ours or "refused" in ours


def test_mappings_give_the_kits_bodies() -> None:
    generator = Generator(52)
    mappings = [generator.mapping() for _ in range(200)]
    cases = [(mapping, message) for mapping in mappings for message in MESSAGES]
    done = subprocess.run(
        [node(), "mapping-transform.mjs"],
        cwd=JS,
        input=jsonjs.dumps(cases),
        capture_output=True,
        timeout=60,
        check=True,
    )
    theirs = json.loads(done.stdout)
    assert len(theirs) == len(cases)
    refused = [efd_result(mapping, MESSAGES[0]) for mapping in mappings]
    assert not [r for r in refused if "refused" in r], "the generator keeps to valid mappings"
    disagreements = []
    kinds: set[str] = set()
    for (mapping, message), their in zip(cases, theirs, strict=True):
        ours = efd_result(mapping, message)
        kinds.add(next(iter(their)))
        if not agree(ours, their):
            disagreements.append((mapping, message.get("type"), ours, their))
    assert not disagreements, json.dumps(disagreements[:5], indent=1)
    assert kinds == {"value", "undefined", "error"}, "each kind of result is tested"


# What efd refuses at load that the kit lets through (docs/actions.md, "Differences"): each
# entry is refused by efd, and the kit gives a value for it, so each difference is real.
STRICTER: list[tuple[str, dict[str, Any]]] = [
    (
        "an unknown @case operator",
        {"x": {"@case": {"operator": "title", "value": {"@path": "$.properties.zero"}}}},
    ),
    (
        "@json's mode in capitals",
        {"x": {"@json": {"mode": "ENCODE", "value": {"@path": "$.userId"}}}},
    ),
    (
        "@merge's direction in capitals",
        {"x": {"@merge": {"direction": "Left", "objects": [{"a": 1}]}}},
    ),
    ("an unknown option", {"x": {"@if": {"exists": {"@path": "$.userId"}, "then": 1, "ellse": 2}}}),
    (
        "a directive inside an array",
        {"x": [{"@replace": {"pattern": "a", "replacement": 5, "value": "abc"}}]},
    ),
    ("a third @arrayPath item", {"x": {"@arrayPath": ["$.traits.tags", {"@path": "$."}, "extra"]}}),
    (
        "an @arrayPath item mapping that is not an object",
        {"x": {"@arrayPath": ["$.traits.tags", "x"]}},
    ),
    (
        "a pattern2 that is not a string",
        {"x": {"@replace": {"pattern": "a", "pattern2": 5, "value": "abc"}}},
    ),
    ("@liquid", {"x": {"@liquid": "{{ userId | upcase }}"}}),
]


def test_what_efd_refuses_at_load_the_kit_lets_through() -> None:
    done = subprocess.run(
        [node(), "mapping-transform.mjs"],
        cwd=JS,
        input=jsonjs.dumps([(mapping, MESSAGES[0]) for _, mapping in STRICTER]),
        capture_output=True,
        timeout=60,
        check=True,
    )
    for (name, mapping), theirs in zip(STRICTER, json.loads(done.stdout), strict=True):
        assert "refused" in efd_result(mapping, MESSAGES[0]), name
        assert "value" in theirs, (name, theirs)


def test_a_plain_mappings_value_for_a_plain_message_is_written_as_it_is() -> None:
    # The fast path routing takes (efd.jsonjs.dumps(plain=True)) for a mapping that keeps
    # plain messages plain: the same bytes as the exact writer, for every generated mapping.
    generator = Generator(53)
    plain = [m for m in MESSAGES if jsonjs.loads_checked(jsonjs.dumps(m))[1]]
    assert plain
    kept = 0
    for _ in range(400):
        try:
            compiled = compile(generator.mapping())
        except MappingError:
            continue
        if not compiled.plain:
            continue
        for message in plain:
            try:
                value = apply(compiled, message)
            except MappingError:
                continue
            kept += 1
            assert jsonjs.dumps(value, plain=True) == jsonjs.dumps(value), compiled.source
    assert kept > 100
