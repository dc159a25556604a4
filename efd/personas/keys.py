"""Names of computations: the trait key each delivers, and its stable id (pure)."""

from __future__ import annotations

import hashlib

# The source name of the identify messages audience and computed trait syncs store and send.
PERSONAS_SOURCE = "personas"


def snake_case(name: str) -> str:
    """The snake_case form of a name, as Segment derives audience keys.

    Words are split at spaces and punctuation, at lower-to-upper case changes
    ("HighValue" -> high_value), before the last capital of a run of capitals
    ("HTMLPage" -> html_page) and between letters and digits ("top10" -> top_10), then
    lower-cased and joined with "_". Letters outside ASCII count as letters.
    """
    words: list[str] = []
    current = ""

    def kind(ch: str) -> str:
        if ch.isdigit():
            return "digit"
        if ch.isupper():
            return "upper"
        if ch.isalpha():
            return "lower"
        return "other"

    for i, ch in enumerate(name):
        k = kind(ch)
        if k == "other":
            if current:
                words.append(current)
            current = ""
            continue
        if current:
            prev = kind(current[-1])
            nxt = kind(name[i + 1]) if i + 1 < len(name) else "other"
            boundary = (
                (prev == "digit") != (k == "digit")
                or (prev == "lower" and k == "upper")
                or (prev == "upper" and k == "upper" and nxt == "lower")
            )
            if boundary:
                words.append(current)
                current = ""
        current += ch
    if current:
        words.append(current)
    return "_".join(word.lower() for word in words)


def computation_id(kind: str, key: str) -> str:
    """A stable id for context.personas.computation_id: aud_… for audiences, tra_… for
    computed traits, derived from the key (renaming makes a new computation)."""
    digest = hashlib.sha256(f"{kind}:{key}".encode()).hexdigest()[:20]
    return f"{'aud' if kind == 'audience' else 'tra'}_{digest}"
