"""W3C Trace Context (pure: text in, text out): the `traceparent` and `tracestate` headers
read and written, and the one-line form a message's context is stored in.

A header that does not follow the format is ignored, as the specification asks: the
request then starts a trace of its own. An invalid `tracestate` is dropped on its own; it
means nothing without a valid `traceparent`.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

VERSION = "00"
SAMPLED = 0x01
MAX_STATE_MEMBERS = 32
MAX_STATE_CHARS = 512  # what a sender must keep at least: longer lists are dropped here

# version-format (version 00): 2-32-16-2 lowercase hex digits. Later versions may add
# fields after a dash, which a version 00 reader ignores.
_TRACEPARENT = re.compile(r"([0-9a-f]{2})-([0-9a-f]{32})-([0-9a-f]{16})-([0-9a-f]{2})")
# A list member's key: simple-key, or tenant@system (multi-tenant-key).
_KEY = re.compile(
    r"(?:[a-z][a-z0-9_\-*/]{0,255}|[a-z0-9][a-z0-9_\-*/]{0,240}@[a-z][a-z0-9_\-*/]{0,13})"
)
# A value: printable ASCII but ',' and '=', the last one not a space, at most 256.
_VALUE = re.compile(r"[\x20-\x2b\x2d-\x3c\x3e-\x7e]{0,255}[\x21-\x2b\x2d-\x3c\x3e-\x7e]")
_OWS = " \t"


@dataclass(frozen=True, slots=True)
class TraceParent:
    """A span's identity as `traceparent` carries it: 128-bit trace id, 64-bit span id
    (the caller's: the parent of the span that reads it), and the flags (bit 0: sampled)."""

    trace_id: int
    span_id: int
    flags: int

    @property
    def sampled(self) -> bool:
        return bool(self.flags & SAMPLED)


@dataclass(frozen=True, slots=True)
class RoundTrace:
    """What a delivery's round needs to be traced: the trace context its message was
    accepted under (stored form: `stored`; None when none was stored), how many rounds were
    sent before this one, and the delivery."""

    context: str | None
    retries: int
    delivery_id: int


def parse_traceparent(value: str | None) -> TraceParent | None:
    """The `traceparent` header's value; None when absent or invalid: a version other
    than hex or ff, ids that are not lowercase hex or are all zeros, version 00 with
    anything after the flags, a later version with anything after them but a dash."""
    if value is None:
        return None
    value = value.strip(_OWS)
    found = _TRACEPARENT.match(value)
    if found is None:
        return None
    version, trace, span, flags = found.groups()
    if version == "ff":
        return None
    rest = value[found.end() :]
    if rest and (version == VERSION or not rest.startswith("-")):
        return None
    trace_id, span_id = int(trace, 16), int(span, 16)
    if trace_id == 0 or span_id == 0:
        return None
    return TraceParent(trace_id, span_id, int(flags, 16))


def format_traceparent(parent: TraceParent) -> str:
    """The version 00 header value."""
    return f"{VERSION}-{parent.trace_id:032x}-{parent.span_id:016x}-{parent.flags & 0xFF:02x}"


def parse_tracestate(
    values: list[str] | tuple[str, ...] | str | None,
) -> tuple[tuple[str, str], ...] | None:
    """The `tracestate` header's list members (key, value), in order, from one value or
    several header lines (one list, joined by commas); None when absent or invalid: a member
    that is not key=value, a key twice, more than 32 members, or more than 512 characters.
    Empty members (`a=1,,b=2`) are allowed, and skipped."""
    if values is None:
        return None
    text = values if isinstance(values, str) else ",".join(values)
    if len(text) > MAX_STATE_CHARS:
        return None
    members: list[tuple[str, str]] = []
    seen: set[str] = set()
    for raw in text.split(","):
        member = raw.strip(_OWS)
        if not member:
            continue
        key, eq, value = member.partition("=")
        if not eq or not _KEY.fullmatch(key) or not _VALUE.fullmatch(value) or key in seen:
            return None
        seen.add(key)
        members.append((key, value))
    if len(members) > MAX_STATE_MEMBERS:
        return None
    return tuple(members) if members else None


def format_tracestate(members: tuple[tuple[str, str], ...]) -> str:
    return ",".join(f"{key}={value}" for key, value in members)


def stored(parent: TraceParent, state: str | None = None) -> str:
    """The context kept with a message: the traceparent, then a space and the tracestate
    when there is one (a traceparent holds no space, so the first one divides them)."""
    line = format_traceparent(parent)
    return f"{line} {state}" if state else line


def from_stored(value: str | None) -> tuple[TraceParent, str | None] | None:
    """A stored context read back; None for NULL, or for anything that is not one."""
    if not value:
        return None
    line, _, state = value.partition(" ")
    parent = parse_traceparent(line)
    if parent is None:
        return None
    return parent, (state or None)
