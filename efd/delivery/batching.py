"""Batched delivery's rules for an action (pure: no I/O, no clock): its batch keys checked at
load (`BatchPolicy`), which waiting events form which requests now and which wait (`form`),
a batch's exact body and the bytes its X-Signature covers, its webhook-id, and the halves a
413 answer splits it into. docs/actions.md#batches.

A batch's body is the JSON array of its events' stored bodies, joined as they are: nothing
is parsed or written again, so the bytes signed at formation are the bytes every retry sends.
"""

from __future__ import annotations

import base64
import hashlib
import math
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass
from typing import Final, TypeVar

SIZE_MAX: Final = 4000  # events a request, as Segment's Webhooks (Actions) allows
MAX_BYTES_DEFAULT: Final = 512 * 1024
MAX_BYTES_CAP: Final = 8 * 1024 * 1024
# No event's size is known at load; a smaller limit sends every event alone, which is a unit
# mistaken (KiB for bytes) rather than a choice.
MAX_BYTES_FLOOR: Final = 1024
WAIT_DEFAULT: Final = 1.0
WAIT_MAX: Final = 60.0
KEYS: Final = ("url", "method", "headers")
BODY: Final = "body"
FIRST_EVENT: Final = "first_event"
SIGNATURES: Final = (BODY, FIRST_EVENT)
CONFIG_KEYS: Final = (
    "batch_size",
    "batch_max_bytes",
    "batch_wait_seconds",
    "batch_keys",
    "batch_signature",
)
JSON: Final = "application/json"
TOO_LARGE: Final = 413
WEBHOOK_ID_PREFIX: Final = "batch_"
# An array's brackets, and the comma before every event but the first.
_BRACKETS: Final = 2
# The smallest JSON value is one byte (`0`): a batch this close to its limit takes no more.
_SMALLEST_EVENT: Final = 1

M = TypeVar("M")


class BatchPolicyError(ValueError):
    """An action's batch keys refused at load; `problems` holds one "key: reason" line per
    problem, the key as written in the action (the configuration prefixes its path)."""

    def __init__(self, problems: Sequence[str]) -> None:
        self.problems = tuple(problems)
        super().__init__("\n".join(self.problems))


@dataclass(frozen=True, slots=True)
class BatchPolicy:
    """How an action batches. `size` 1 sends one event a request, as an action without
    batch keys does, with the event's body alone (no array)."""

    size: int = 1
    max_bytes: int = MAX_BYTES_DEFAULT
    wait_seconds: float = WAIT_DEFAULT
    keys: tuple[str, ...] = KEYS
    signature: str = BODY

    @property
    def batched(self) -> bool:
        """Whether requests carry JSON arrays of events."""
        return self.size > 1


def _whole(value: object, low: int, high: int) -> int | None:
    """`value` when it is a whole number (not a boolean) from `low` to `high`."""
    if isinstance(value, int) and not isinstance(value, bool) and low <= value <= high:
        return value
    return None


def _seconds(value: object, low: float, high: float) -> float | None:
    """`value` as a float when it is a finite number (not a boolean) from `low` to `high`."""
    if isinstance(value, int | float) and not isinstance(value, bool):
        number = float(value)
        if math.isfinite(number) and low <= number <= high:
            return number
    return None


def _keys(value: object) -> tuple[tuple[str, ...], list[str]]:
    """The batch keys listed, in KEYS' order, and the problems of the list."""
    if not isinstance(value, list | tuple):
        return (), ['batch_keys: must be a list of "url", "method" and "headers"']
    problems = []
    seen: set[str] = set()
    for i, key in enumerate(value):
        if not isinstance(key, str):
            problems.append(f"batch_keys[{i}]: must be a string")
        elif key not in KEYS:
            problems.append(
                f'batch_keys[{i}]: "{key}" is not a batch key; the keys are "url", "method"'
                ' and "headers"'
            )
        elif key in seen:
            problems.append(f'batch_keys[{i}]: "{key}" is listed twice')
        else:
            seen.add(key)
    return tuple(k for k in KEYS if k in seen), problems


def _read(action: Mapping[str, object], content_type: str) -> tuple[BatchPolicy, list[str]]:
    """The policy of an action's batch keys and their problems (the policy holds defaults
    where a key has a problem)."""
    problems = []
    size = _whole(action.get("batch_size", 1), 1, SIZE_MAX)
    if size is None:
        problems.append(f"batch_size: must be a whole number from 1 to {SIZE_MAX}")
    elif size > 1 and content_type != JSON:
        problems.append(
            f'batch_size: a batch is a JSON array, so content_type must be "{JSON}"'
            f' to batch (it is "{content_type}")'
        )
    max_bytes = _whole(
        action.get("batch_max_bytes", MAX_BYTES_DEFAULT), MAX_BYTES_FLOOR, MAX_BYTES_CAP
    )
    if max_bytes is None:
        problems.append(
            f"batch_max_bytes: must be a whole number of bytes from {MAX_BYTES_FLOOR}"
            f" to {MAX_BYTES_CAP} (8 MiB)"
        )
    wait = _seconds(action.get("batch_wait_seconds", WAIT_DEFAULT), 0.0, WAIT_MAX)
    if wait is None:
        problems.append(f"batch_wait_seconds: must be a number of seconds from 0 to {WAIT_MAX:g}")
    keys, keys_problems = _keys(action.get("batch_keys", list(KEYS)))
    problems += keys_problems
    signature = action.get("batch_signature", BODY)
    if signature not in SIGNATURES:
        problems.append(f'batch_signature: must be "{BODY}" or "{FIRST_EVENT}"')
    read = BatchPolicy(
        size=size or 1,
        max_bytes=max_bytes or MAX_BYTES_DEFAULT,
        wait_seconds=WAIT_DEFAULT if wait is None else wait,
        keys=keys,
        signature=signature if isinstance(signature, str) and signature in SIGNATURES else BODY,
    )
    return read, problems


def policy_problems(action: Mapping[str, object], *, content_type: str = JSON) -> list[str]:
    """Every problem of an action's batch keys (those absent take their defaults), one
    "key: reason" line each, in the order of CONFIG_KEYS; empty when they are usable.
    `content_type`: the action's, since a batch is a JSON array."""
    return _read(action, content_type)[1]


def policy(action: Mapping[str, object], *, content_type: str = JSON) -> BatchPolicy:
    """An action's BatchPolicy, or BatchPolicyError with every problem (policy_problems)."""
    read, problems = _read(action, content_type)
    if problems:
        raise BatchPolicyError(problems)
    return read


# -- forming batches ------------------------------------------------------------------------


Headers = tuple[tuple[str, str], ...]


@dataclass(frozen=True, slots=True)
class BatchKey:
    """What events must share to share a request: the rendered values the batch keys
    select; a value they leave out is None (the request takes its first event's)."""

    url: str | None
    method: str | None
    headers: Headers | None


def batch_key(keys: Collection[str], url: str, method: str, headers: Headers) -> BatchKey:
    """An event's batch key from its rendered request, as `keys` select."""
    return BatchKey(
        url if "url" in keys else None,
        method if "method" in keys else None,
        headers if "headers" in keys else None,
    )


@dataclass(frozen=True, slots=True)
class Candidate:
    """An event waiting for a batch: its delivery, its stored body, its batch key, its lane
    (None: none, or an unordered destination) and since when it waits (when it was accepted,
    or redriven)."""

    delivery_id: int
    body: bytes
    key: BatchKey
    lane: str | None
    since: float


def array_size(sizes: Sequence[int]) -> int:
    """The bytes of the JSON array of bodies of these sizes: `[`, the bodies with a comma
    between each two, `]`."""
    return sum(sizes) + max(len(sizes) - 1, 0) + _BRACKETS


@dataclass(frozen=True, slots=True)
class Batch:
    """Events that share one request, in the order they were accepted. `full`: it took as
    many events as its count allows, or the next one in line did not fit in its bytes
    (or it is one event larger than the limit, alone); a batch that is not full is partial."""

    key: BatchKey
    members: tuple[Candidate, ...]
    full: bool

    @property
    def size(self) -> int:
        """The bytes of its body."""
        return array_size([len(c.body) for c in self.members])

    @property
    def oldest(self) -> float:
        """Since when its longest-waiting event waits."""
        return min(c.since for c in self.members)

    @property
    def delivery_ids(self) -> tuple[int, ...]:
        return tuple(c.delivery_id for c in self.members)

    @property
    def body(self) -> bytes:
        return array([c.body for c in self.members])


@dataclass(frozen=True, slots=True)
class Plan:
    """What `form` decided. `ready`: the batches to record and send now, in the order of
    their first events. `waiting`: partial batches that wait for more events; they are not
    recorded, and are formed again from whatever waits at `wake_at` (None: none waits).
    `held`: the events whose lane first needs an earlier batch's outcome. `more`: batches
    beyond `limit` were ready too: form again once these are recorded."""

    ready: tuple[Batch, ...]
    waiting: tuple[Batch, ...]
    wake_at: float | None
    held: tuple[int, ...]
    more: bool = False


class _Open:
    """The batch a key is filling."""

    __slots__ = ("members", "size")

    def __init__(self) -> None:
        self.members: list[Candidate] = []
        self.size = _BRACKETS

    def fits(self, candidate: Candidate, policy: BatchPolicy) -> bool:
        """Whether it takes `candidate`: an empty batch takes any event, however large."""
        if not self.members:
            return True
        return self.size + 1 + len(candidate.body) <= policy.max_bytes

    def add(self, candidate: Candidate) -> None:
        self.size += len(candidate.body) + (1 if self.members else 0)
        self.members.append(candidate)

    def full(self, policy: BatchPolicy) -> bool:
        """Whether no further event could join it."""
        return (
            len(self.members) >= policy.size or self.size + 1 + _SMALLEST_EVENT > policy.max_bytes
        )


def form(
    candidates: Sequence[Candidate],
    policy: BatchPolicy,
    now: float,
    *,
    busy: Collection[str] = (),
    limit: int | None = None,
) -> Plan:
    """The batches `candidates` (the route's events not in any batch, in the order they were
    accepted) form now.

    Events of one batch key fill a batch in their order, up to `policy.size` events and
    `policy.max_bytes` of body; the next event that does not fit closes it (full) and starts
    the next one: no later, smaller event overtakes it. An event alone larger than the limit
    is a batch of its own. A batch that is full is ready; a partial one is ready once its
    oldest event has waited `policy.wait_seconds` at `now`, and otherwise waits until then.

    Lanes (ordered delivery): a lane in `busy` (an event of it is in a batch that has no
    outcome yet) contributes nothing: its events wait for that batch. Otherwise its events
    may go in one batch of this plan, in their order; from its first event that cannot join
    that batch (no room, or another batch key) on, the rest wait for that batch's outcome.
    So a user never has two requests under way at once, and a later one never overtakes an
    earlier one. `limit`: the most ready batches returned (the dispatcher's free slots).
    """
    opened: dict[BatchKey, _Open] = {}
    done: list[tuple[int, Batch]] = []  # (position of its first event, batch)
    starts: dict[int, int] = {}  # id(open batch) -> position of its first event
    bound: dict[str, _Open] = {}  # lane -> the batch its events go in, this plan
    stopped: set[str] = set(busy)  # lanes whose remaining events wait
    held: list[int] = []

    def close(key: BatchKey, batch: _Open, full: bool) -> None:
        done.append((starts[id(batch)], Batch(key, tuple(batch.members), full)))

    for position, candidate in enumerate(candidates):
        lane = candidate.lane
        if lane is not None and lane in stopped:
            held.append(candidate.delivery_id)
            continue
        key = candidate.key
        batch = opened.get(key)
        if lane is not None and lane in bound and bound[lane] is not batch:
            # Its lane's events are in another batch (closed, or of another key).
            stopped.add(lane)
            held.append(candidate.delivery_id)
            continue
        if batch is not None and not batch.fits(candidate, policy):
            close(key, batch, True)
            del opened[key]
            batch = None
            if lane is not None and lane in bound:  # in the batch just closed
                stopped.add(lane)
                held.append(candidate.delivery_id)
                continue
        if batch is None:
            batch = opened[key] = _Open()
            starts[id(batch)] = position
        batch.add(candidate)
        if lane is not None:
            bound[lane] = batch
        if batch.full(policy):
            close(key, batch, True)
            del opened[key]
    waiting: list[tuple[int, Batch]] = []
    for key, batch in opened.items():
        formed = Batch(key, tuple(batch.members), False)
        entry = (starts[id(batch)], formed)
        (done if formed.oldest + policy.wait_seconds <= now else waiting).append(entry)
    done.sort(key=lambda entry: entry[0])
    waiting.sort(key=lambda entry: entry[0])
    ready = [batch for _, batch in done]
    more = limit is not None and len(ready) > limit
    if limit is not None:
        ready = ready[:limit]
    wake_at = min((b.oldest + policy.wait_seconds for _, b in waiting), default=None)
    return Plan(tuple(ready), tuple(b for _, b in waiting), wake_at, tuple(held), more)


# -- the body, its signature and its id -----------------------------------------------------


def array(bodies: Sequence[bytes]) -> bytes:
    """A batch's body: the JSON array of its events' stored bodies, as they are."""
    return b"[" + b",".join(bodies) + b"]"


def signed_bytes(signature: str, bodies: Sequence[bytes]) -> bytes:
    """What X-Signature's HMAC covers for a batch of these bodies: the whole body
    (`"body"`, the default), or only the first event's bytes (`"first_event"`, as Segment's
    Webhooks (Actions) signs a batch)."""
    if signature == FIRST_EVENT:
        return bodies[0]
    if signature == BODY:
        return array(bodies)
    raise ValueError(f"unknown batch signature {signature!r}")


def webhook_id(route: str, members: Sequence[str]) -> str:
    """A batch's webhook-id: `batch_` and 26 base32 letters and digits, a 128-bit hash of
    its route and its members' own webhook-ids in order. It names what the batch carries:
    the same on every retry and after a restart, and different for any other set or order
    of events (a half after a 413 is another batch)."""
    digest = hashlib.blake2b(digest_size=16)
    digest.update(route.encode("utf-8", "surrogatepass"))
    for member in members:
        digest.update(b"\x00" + member.encode("utf-8", "surrogatepass"))
    text = base64.b32encode(digest.digest()).decode().rstrip("=").lower()
    return WEBHOOK_ID_PREFIX + text


# -- a 413 ----------------------------------------------------------------------------------


def split(
    status: int | None, members: Sequence[M], sizes: Sequence[int]
) -> tuple[tuple[M, ...], tuple[M, ...]] | None:
    """The two batches to send instead of one that was answered `status`: for a 413 (the
    receiver found the body too large), its members cut in two where the two bodies come
    closest in bytes (the earlier cut on a tie), order kept; None for any other answer,
    and for a single event, whose 413 fails it as any 4xx does. `sizes`: each member's
    body bytes."""
    if status != TOO_LARGE or len(members) < 2:
        return None
    if len(sizes) != len(members):
        raise ValueError("one size for each member")
    whole = sum(sizes)
    best, cut = array_size(sizes), 1
    prefix = 0
    for k in range(1, len(members)):
        prefix += sizes[k - 1]
        first = prefix + (k - 1) + _BRACKETS
        second = (whole - prefix) + (len(members) - k - 1) + _BRACKETS
        if abs(first - second) < best:
            best, cut = abs(first - second), k
    return tuple(members[:cut]), tuple(members[cut:])
