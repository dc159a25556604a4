"""Syncing audiences and computed traits: evaluate, diff against what was delivered, send.

The diff (`evaluate`, `diff`, `identify_message`) is pure. The driver (`run_sync`) walks
the user profiles in id-ordered chunks; each chunk's identify messages and its new stored
values are written in one transaction, so a crash or restart at any point neither
resends a delivered change nor misses one: the next sync diffs against exactly what was
committed. `preview` evaluates without sending or storing anything (efd audiences).
"""

from __future__ import annotations

import hashlib
import time
import uuid
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from efd import jsonjs
from efd.languages.audiences import (
    Profile,
    Requirements,
    compile_condition,
    compile_expression,
    parse_condition,
    parse_expression,
)
from efd.personas.keys import PERSONAS_SOURCE, computation_id, snake_case
from efd.records import NewMessage
from efd.segment import routing, webhooks
from efd.segment.messages import Message
from efd.store.computations import Computations, SyncChunk
from efd.store.runner import AsyncStore
from efd.store.statements import loads

AUDIENCE = "audience"
TRAIT = "trait"
CHUNK_PROFILES = 5000
_TRUE = "true"


@dataclass(frozen=True)
class Computation:
    """An audience (condition -> member or not) or a computed trait (expression -> value)."""

    kind: str  # AUDIENCE | TRAIT
    name: str
    text: str
    destinations: tuple[str, ...] = ()
    interval: float = 3600.0
    evaluate: Callable[[Profile, float], Any] = field(init=False, repr=False, compare=False)
    requirements: Requirements = field(init=False, repr=False, compare=False)
    key: str = field(init=False, compare=False)  # the trait it is delivered as
    store_key: str = field(init=False, repr=False, compare=False)  # "audience:<key>" …
    id: str = field(init=False, repr=False, compare=False)  # context.personas.computation_id
    definition_hash: str = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        if self.kind not in (AUDIENCE, TRAIT):
            raise ValueError(f"kind must be {AUDIENCE!r} or {TRAIT!r}")
        if self.kind == AUDIENCE:
            condition = parse_condition(self.text)
            evaluate: Callable[[Profile, float], Any] = compile_condition(condition)
            requirements = condition.requirements()
        else:
            expression = parse_expression(self.text)
            evaluate = compile_expression(expression)
            requirements = expression.requirements()
        key = snake_case(self.name)
        derived = {
            "evaluate": evaluate,
            "requirements": requirements,
            "key": key,
            "store_key": f"{self.kind}:{key}",
            "id": computation_id(self.kind, key),
            "definition_hash": hashlib.sha256(self.text.encode("utf-8")).hexdigest(),
        }
        for name, value in derived.items():
            object.__setattr__(self, name, value)

    def since(self, now: float) -> float | None:
        lookback = self.requirements.lookback_seconds
        return None if lookback is None else now - lookback

    def personas_context(self) -> dict[str, str]:
        return {
            "computation_class": self.kind,
            "computation_id": self.id,
            "computation_key": self.key,
        }


def longest_lookback(found: Sequence[Computation]) -> float | None:
    """How far back events are needed: None when forever."""
    if not found:
        return 0.0
    needs = found[0].requirements
    for computation in found[1:]:
        needs = needs.union(computation.requirements)
    return needs.lookback_seconds


# -- the diff (pure) -----------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Change:
    profile_id: str
    value: Any  # what the identify carries
    stored: str | None  # the value to keep for the next diff (JSON); None: keep none
    send: bool = True


def _encode(value: Any) -> str | None:
    if value is None:
        return None
    try:
        return jsonjs.dumps(value).decode("utf-8")
    except (ValueError, TypeError):
        return None  # not representable in JSON (e.g. an overflowing sum): no value


def evaluate(computation: Computation, chunk: SyncChunk, now: float) -> Iterator[tuple[str, Any]]:
    """(profile id, current value) for each profile of the chunk the computation covers.

    Audiences cover every user profile (value True or False). A computed trait covers the
    profiles with a relevant event, and those that had a value (it may have become empty).
    Suppressed users are skipped.
    """
    fn = computation.evaluate
    audience = computation.kind == AUDIENCE
    need_traits = bool(computation.requirements.trait_names)
    events, stored, blocked = chunk.events, chunk.stored, chunk.suppressed
    empty: dict[str, Any] = {}
    for pid, traits in chunk.profiles:
        if pid in blocked:
            continue
        found = events.get(pid, ())
        if not audience and not found and pid not in stored:
            continue
        profile = Profile(loads(traits) if need_traits and traits else empty, found)
        value = fn(profile, now)
        yield pid, (value is True) if audience else value


def diff(computation: Computation, chunk: SyncChunk, now: float) -> list[Change]:
    """What to send and store so the destinations match the chunk's current state.

    Audience: entry -> True, exit -> False. Computed trait: a changed value is sent; a value
    that became empty (null) is sent as null once and then forgotten. Stored values of
    profiles that no longer exist are dropped silently.
    """
    changes: list[Change] = []
    stored = chunk.stored
    seen: set[str] = set()
    audience = computation.kind == AUDIENCE
    for pid, value in evaluate(computation, chunk, now):
        seen.add(pid)
        before = stored.get(pid)
        if audience:
            if value and before is None:
                changes.append(Change(pid, True, _TRUE))
            elif not value and before is not None:
                changes.append(Change(pid, False, None))
            continue
        after = _encode(value)
        if after != before:
            changes.append(Change(pid, value if after is not None else None, after))
    missing = [pid for pid in stored if pid not in seen]
    if missing:
        present = {pid for pid, _ in chunk.profiles}
        changes += [
            Change(pid, None, None, send=False)
            for pid in missing
            if pid not in present and pid not in chunk.suppressed
        ]
    return changes


def identify_message(
    computation: Computation, profile_id: str, value: Any, now: float
) -> NewMessage:
    """The identify a change is delivered as (docs/audiences.md): traits {key: value},
    context.personas, routed only to the computation's destinations."""
    integrations: dict[str, Any] = {"All": False, **dict.fromkeys(computation.destinations, True)}
    message = Message(
        type="identify",
        message_id=str(uuid.uuid4()),
        user_id=profile_id,
        anonymous_id=None,
        timestamp=datetime.fromtimestamp(now, UTC),
        context={"personas": computation.personas_context()},
        integrations=integrations,
        fields={"traits": {computation.key: value}},
    )
    return NewMessage(
        source=PERSONAS_SOURCE,
        message_id=message.message_id,
        type="identify",
        user_id=profile_id,
        anonymous_id=None,
        event=None,
        timestamp=now,
        received_at=now,
        body=webhooks.encode(webhooks.body_for(message)).decode("utf-8"),
        destinations=tuple(routing.route(computation.destinations, integrations)),
    )


# -- drivers ---------------------------------------------------------------------------------


@dataclass
class SyncResult:
    key: str
    sent: int = 0
    evaluated: int = 0
    rows_read: int = 0
    seconds: float = 0.0


def _load_args(computation: Computation, now: float) -> dict[str, Any]:
    needs = computation.requirements
    return {
        "event_names": needs.event_names,
        "since": computation.since(now),
        "with_traits": bool(needs.trait_names),
    }


def _plan(
    computation: Computation, chunk: SyncChunk, now: float
) -> tuple[list[NewMessage], list[tuple[str, str | None]]]:
    changes = diff(computation, chunk, now)
    outgoing = [
        identify_message(computation, c.profile_id, c.value, now) for c in changes if c.send
    ]
    return outgoing, [(c.profile_id, c.stored) for c in changes]


async def run_sync(
    db: AsyncStore,
    personas: Computations,
    computation: Computation,
    now: float | None = None,
    on_sent: Callable[[], None] | None = None,
) -> SyncResult:
    """One sync in the daemon: reads and evaluation on reader threads, each chunk's
    writes through the single writer thread (so they queue with ingestion's commits)."""
    started = time.perf_counter()
    now = time.time() if now is None else now
    result = SyncResult(computation.store_key)
    key = computation.store_key
    await db.write(
        personas.start_sync, key, computation.kind, computation.name,
        computation.definition_hash, now,
    )  # fmt: skip
    args = _load_args(computation, now)

    def load_and_plan(
        after: str | None,
    ) -> tuple[SyncChunk, list[NewMessage], list[tuple[str, str | None]]]:
        chunk = personas.load_sync_chunk(key, after=after, limit=CHUNK_PROFILES, **args)
        outgoing, values = _plan(computation, chunk, now)
        return chunk, outgoing, values

    after: str | None = None
    while True:
        chunk, outgoing, values = await db.read(load_and_plan, after)
        result.rows_read += chunk.rows_read
        result.evaluated += len(chunk.profiles)
        if values:
            await db.write(personas.apply_sync_chunk, key, outgoing, values, now)
            if outgoing and on_sent is not None:
                on_sent()
        result.sent += len(outgoing)
        if chunk.next_after is None:
            break
        after = chunk.next_after
    await db.write(personas.finish_sync, key, now, result.sent)
    result.seconds = time.perf_counter() - started
    return result


@dataclass
class Preview:
    selected: int
    sample: list[tuple[str, Any]]
    entering: int
    leaving: int
    profiles: int
    rows_read: int


def preview(
    personas: Computations,
    computation: Computation,
    now: float | None = None,
    sample: int = 10,
) -> Preview:
    """What a computation selects now (count and a sample), and how that differs from the
    last sync, without sending or storing anything."""
    now = time.time() if now is None else now
    args = _load_args(computation, now)
    result = Preview(0, [], 0, 0, 0, 0)
    after: str | None = None
    while True:
        chunk = personas.load_sync_chunk(
            computation.store_key, after=after, limit=CHUNK_PROFILES, **args
        )
        result.profiles += len(chunk.profiles)
        result.rows_read += chunk.rows_read
        for pid, value in evaluate(computation, chunk, now):
            if value is None or value is False:
                continue
            result.selected += 1
            if len(result.sample) < sample:
                result.sample.append((pid, value))
        for change in diff(computation, chunk, now):
            if not change.send:
                continue
            if change.stored is None:
                result.leaving += 1
            else:
                result.entering += 1
        if chunk.next_after is None:
            return result
        after = chunk.next_after
