"""The name a message is published to: an AMQP routing key, a NATS subject, a Redis stream or
an MQTT topic, with `{{field}}` templates taking a field of the message (pure: no I/O).

The literal text is checked once, at load, against what the broker allows there; a field's
value is made safe when it is rendered: each character the broker reserves, and every space
and control character, becomes `_`, so that a value stays one token (one word of a routing
key, one token of a subject, one level of a topic) whatever it holds, and an empty value is
`_`, so that no token goes missing. docs/brokers.md#templates.
"""

from __future__ import annotations

import re
import unicodedata
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Final

from efd.languages.mapping import template
from efd.languages.mapping.values import UNDEFINED, get, js_string

_TEMPLATE: Final = re.compile(r"\{\{([^{}]*)\}\}")
_LONE_SURROGATE: Final = re.compile("[\ud800-\udfff]")
REPLACEMENT: Final = "_"  # what a reserved character of a value, and an empty value, become
_MARK: Final = "x"  # stands for a field in the skeleton whose tokens are checked


class TemplateError(ValueError):
    """A name refused at load, or one that cannot be made for a message; `problems` holds
    one line per problem, each "key: reason"."""

    def __init__(self, problems: list[str] | tuple[str, ...]) -> None:
        self.problems = tuple(problems)
        super().__init__("\n".join(self.problems))


def _control(ch: str) -> bool:
    return unicodedata.category(ch) == "Cc"


def _space(ch: str) -> bool:
    return ch.isspace() or unicodedata.category(ch) in ("Zs", "Zl", "Zp")


@dataclass(frozen=True, slots=True)
class Rule:
    """What one broker allows in the name a message is published to."""

    key: str  # the hook's key that holds the name
    what: str  # how the broker calls it, for messages
    separator: str  # "" when the broker has none
    wildcards: str  # refused in the literal text (publishing takes no pattern)
    spaces: bool  # whether the literal text may hold spaces
    max_bytes: int | None  # UTF-8 bytes of the rendered name
    empty_tokens: bool  # whether the separator may stand at an end or twice in a row
    dollar: bool  # whether the name may start with "$" (the broker's own names do)
    patterns: str = ""  # allowed in the literal text, replaced in a value

    def replaced(self, ch: str) -> bool:
        """Whether `ch` of a field's value is written as `_`."""
        return (
            ch in self.separator
            or ch in self.wildcards
            or ch in self.patterns
            or _space(ch)
            or _control(ch)
        )


RULES: Final = {
    # A topic exchange splits routing keys at dots; `*` and `#` are its binding patterns.
    "amqp": Rule("routing_key", "routing key", ".", "", True, 255, True, True, "*#"),
    # NATS: tokens split at dots, no whitespace, `*` and `>` wildcards.
    "nats": Rule("subject", "subject", ".", "*>", False, None, False, False),
    # A stream's key may be any bytes; efd keeps it printable and free of spaces.
    "redis_streams": Rule("stream", "stream key", "", "", False, None, True, True),
    # MQTT: levels split at slashes, `+` and `#` wildcards, at most 65,535 bytes.
    "mqtt": Rule("topic", "topic", "/", "+#", True, 65535, True, False),
}


@dataclass(frozen=True, slots=True)
class _Field:
    source: str  # the template as written, "{{ properties.x }}"
    keys: tuple[str, ...]


@dataclass(frozen=True, slots=True)
class Template:
    """A compiled name: its literal text and its fields, in order."""

    source: str
    rule: Rule
    parts: tuple[str | _Field, ...]

    @property
    def fields(self) -> tuple[str, ...]:
        return tuple(part.source for part in self.parts if isinstance(part, _Field))

    def render(self, message: Any) -> str:
        return render(self, message)


def _literal_problems(rule: Rule, skeleton: str, text: str) -> list[str]:
    """What the broker refuses in the literal `text`; `skeleton` is it with each field one
    _MARK, for the tokens."""
    key, problems = rule.key, []
    if not skeleton:
        problems.append(f"{key}: must not be empty")
        return problems
    if any(_control(ch) for ch in text):
        problems.append(f"{key}: may not hold control characters")
    if not rule.spaces and any(_space(ch) for ch in text):
        problems.append(f"{key}: a {rule.what} may not hold spaces")
    wild = sorted({ch for ch in text if ch in rule.wildcards})
    if wild:
        shown = " or ".join(wild)
        problems.append(
            f"{key}: {shown} is a wildcard, which a {rule.what} published to may not hold"
        )
    if not rule.dollar and text.startswith("$"):
        problems.append(f"{key}: a {rule.what} starting with $ is the broker's own")
    if not rule.empty_tokens and rule.separator:
        tokens = skeleton.split(rule.separator)
        if any(token == "" for token in tokens):
            problems.append(
                f"{key}: every token between {rule.separator!r}s must hold something "
                f"(no {rule.separator!r} at either end or twice in a row)"
            )
    if rule.max_bytes is not None and len(_utf8(text)) > rule.max_bytes:
        problems.append(f"{key}: a {rule.what} holds at most {rule.max_bytes} bytes")
    return problems


def compile_template(kind: str, source: Any) -> Template:
    """The name of `kind`'s hooks (its key in RULES) as written; TemplateError lists every
    problem, each naming the key."""
    rule = RULES[kind]
    key = rule.key
    if not isinstance(source, str):
        raise TemplateError([f"{key}: must be a string"])
    problems: list[str] = []
    parts: list[str | _Field] = []
    skeleton = ""
    position = 0
    for match in _TEMPLATE.finditer(source):
        literal = source[position : match.start()]
        parts.append(literal)
        skeleton += literal + _MARK
        position = match.end()
        written = match.group(0)
        keys = template.field(written, match.group(1), "type")
        if isinstance(keys, str):
            problems.append(f"{key}: {keys}")
        else:
            parts.append(_Field(written, keys))
    parts.append(source[position:])
    skeleton += source[position:]
    if "{" in skeleton or "}" in skeleton:  # (the literal text's braces: fields are marks)
        problems.append(
            f"{key}: {{ and }} stand only in {{{{field}}}} templates (a {{{{ without its }}}})"
        )
    text = "".join(part for part in parts if isinstance(part, str))
    problems += _literal_problems(rule, skeleton, text)
    if problems:
        raise TemplateError(problems)
    return Template(source, rule, tuple(part for part in parts if part != ""))


def _utf8(text: str) -> bytes:
    """UTF-8, a lone surrogate as U+FFFD."""
    try:
        return text.encode("utf-8")
    except UnicodeEncodeError:
        return _LONE_SURROGATE.sub("\ufffd", text).encode("utf-8")


def value_text(rule: Rule, value: Any) -> str:
    """A field's value as it stands in the name: its text as the mapping's @template writes
    it (numbers as JavaScript does, arrays joined with commas), each character `rule`
    reserves as `_`, a lone surrogate as U+FFFD, and nothing (a missing field, null, "")
    as `_`."""
    text = "" if value is None or value is UNDEFINED else js_string(value)
    if not text:
        return REPLACEMENT
    if _LONE_SURROGATE.search(text):
        text = _LONE_SURROGATE.sub("\ufffd", text)
    replaced: Callable[[str], bool] = rule.replaced
    if text.isalnum():  # the common case: nothing to look at
        return text
    return "".join([REPLACEMENT if replaced(ch) else ch for ch in text])


def render(template: Template, message: Any) -> str:
    """The name for `message` (a document whose fields the templates read); TemplateError
    when it is longer than the broker takes."""
    out: list[str] = []
    for part in template.parts:
        if isinstance(part, _Field):
            out.append(value_text(template.rule, get(message, part.keys)))
        else:
            out.append(part)
    name = "".join(out)
    limit = template.rule.max_bytes
    if limit is not None and len(name) * 4 > limit and len(_utf8(name)) > limit:
        raise TemplateError(
            [
                f"{template.rule.key}: the {template.rule.what} made for this message has "
                f"{len(_utf8(name))} bytes, more than the {limit} the broker takes"
            ]
        )
    return name
