"""The delivery queue's in-memory twin: the dispatcher's `Deliveries` with the store's rules,
for unit tests that need no database. tests/contract/ runs the same rules against this twin
and both real databases, so the twin cannot drift from what `claim` really does."""

from __future__ import annotations

import asyncio
import math
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from typing import Any, Protocol

from efd.errors import StoreUnavailable
from efd.records import AttemptRow, Claimed, ClaimRequest, DeliveryStatus, Outcome
from efd.store.ingestion import Handoff


@dataclass
class Row:
    id: int
    destination: str
    next_attempt_at: float
    created_at: float = 0.0
    status: DeliveryStatus = DeliveryStatus.PENDING
    token: int = 0
    attempts: int = 0
    first_attempt_at: float | None = None
    failed_hooks: frozenset[str] = frozenset()
    leased: bool = False
    lane: str | None = None  # an ordered destination's lane (efd/store/lanes.py)
    purged: bool = False  # its payload was purged by a deletion request: claimed without one
    last_error: str | None = None
    # An action's delivery: the body its mapping made and the URL rendered at routing.
    body: str | None = None
    url: str | None = None


class Completed(Protocol):
    """What the twin reads of a fake sender: how many rounds it answered."""

    completed: int


@dataclass
class MemoryDeliveries:
    """The dispatcher's `Deliveries`, in memory, with the store's semantics: claims lease
    due rows oldest first, never one under a live lease; outcomes and releases are fenced by
    the lease token and apply to pending rows only."""

    rows: dict[int, Row] = field(default_factory=dict)
    attempts: list[AttemptRow] = field(default_factory=list)
    released: list[tuple[int, int]] = field(default_factory=list)
    recorded: asyncio.Event = field(default_factory=asyncio.Event)
    asked_due: asyncio.Event = field(default_factory=asyncio.Event)  # the dispatcher went idle
    calls: Counter[str] = field(default_factory=Counter)
    most_leased: Counter[str] = field(default_factory=Counter)  # per destination, at a claim
    # Of those, the most whose round had not finished (a finished round's outcome may wait
    # a moment for the batched recorder; only the rest is what the dispatcher holds).
    most_held: Counter[str] = field(default_factory=Counter)
    recorded_count: int = 0
    rounds: Completed | None = None
    clock: float = 1_000_000.0
    down: bool = False  # every call fails, as with a database that stopped
    # the rate-limited hooks' token buckets, by key: (tokens, when last refilled)
    buckets: dict[str, tuple[float, float]] = field(default_factory=dict)
    slow_outcomes: asyncio.Event | None = None  # outcome writes wait for it; the rest not

    def _reach(self) -> None:
        if self.down:
            raise StoreUnavailable("the database stopped")

    def add(
        self,
        destination: str,
        count: int,
        *,
        due_in: float = 0.0,
        lane: str | None = None,
        body: str | None = None,
        url: str | None = None,
    ) -> list[int]:
        """`count` new pending deliveries, created and due at clock + due_in; in `lane`,
        each waits (queued) unless the lane has no head. `body` and `url`: an action's
        delivery's own, as routing stored them."""
        ids = []
        for _ in range(count):
            pk = len(self.rows) + 1
            at = self.clock + due_in
            waits = lane is not None and self._head(destination, lane) is not None
            status = DeliveryStatus.QUEUED if waits else DeliveryStatus.PENDING
            self.rows[pk] = Row(
                pk, destination, at, created_at=at, status=status, lane=lane, body=body, url=url
            )
            ids.append(pk)
        return ids

    def ingest(
        self, destination: str, count: int, handoff: Handoff, *, lane: str | None = None
    ) -> list[int]:
        """Like `add`, at the clock, as ingestion inserts with a dispatcher's `handoff`
        (efd/store/ingestion.py): the pending ones (not waiting in a lane) it has room for
        are leased to it as a claim leaves them, and listed in `handoff.claimed`."""
        handoff.claimed, handoff.left_pending, handoff.short = [], False, set()
        ids = self.add(destination, count, lane=lane)
        pending = [pk for pk in ids if self.rows[pk].status is DeliveryStatus.PENDING]
        taken = handoff.take(destination, len(pending)) if pending and lane is None else 0
        handoff.lease_until = self.clock + handoff.lease_seconds
        for pk in pending[:taken]:
            row = self.rows[pk]
            row.next_attempt_at, row.token, row.leased = handoff.lease_until, 1, True
            handoff.claimed.append(self._claimed(row))
        handoff.left_pending = len(pending) > taken
        if len(pending) > taken and lane is None:
            handoff.short = {destination}
        return ids

    def _claimed(self, r: Row) -> Claimed:
        return Claimed(
            r.id,
            r.token,
            r.destination,
            r.attempts,
            r.first_attempt_at,
            r.failed_hooks,
            f"m{r.id}",
            None if r.purged else r.body or '{"type":"track"}',
            r.id,
            "web",
            1_700_000_000.0 + r.id,
            url=r.url,
        )

    def _head(self, destination: str, lane: str) -> Row | None:
        """The lane's head: its one pending delivery."""
        for r in self.rows.values():
            if (r.destination, r.lane, r.status) == (destination, lane, DeliveryStatus.PENDING):
                return r
        return None

    def _hand_on(self, row: Row, now: float) -> None:
        """A head got an outcome: the lane's lowest waiting delivery is due now."""
        waiting = [
            r
            for r in self.rows.values()
            if (r.destination, r.lane, r.status)
            == (row.destination, row.lane, DeliveryStatus.QUEUED)
        ]
        if waiting:
            following = min(waiting, key=lambda r: r.id)
            following.status, following.next_attempt_at = DeliveryStatus.PENDING, now

    def status(self, destination: str | None = None) -> Counter[str]:
        return Counter(
            r.status.value
            for r in self.rows.values()
            if destination is None or r.destination == destination
        )

    async def claim(self, request: ClaimRequest) -> list[Claimed]:
        self._reach()
        self.calls["claim"] += 1
        destination = request.destination
        due = sorted(
            (
                r
                for r in self.rows.values()
                if r.destination == destination
                and r.status is DeliveryStatus.PENDING
                and r.next_attempt_at <= request.due
                and (not r.leased or r.next_attempt_at < request.lapsed)
            ),
            key=lambda r: r.next_attempt_at,
        )[: request.limit]
        for r in due:
            r.next_attempt_at, r.token, r.leased = request.lease_until, r.token + 1, True
        leased = sum(1 for r in self.rows.values() if r.destination == destination and r.leased)
        self.most_leased[destination] = max(self.most_leased[destination], leased)
        if self.rounds is not None:
            awaiting_record = self.rounds.completed - self.recorded_count
            held = leased - awaiting_record
            self.most_held[destination] = max(self.most_held[destination], held)
        return [self._claimed(r) for r in sorted(due, key=lambda r: r.id)]

    async def claim_limited(
        self, request: ClaimRequest, buckets: Sequence[tuple[str, float, float, float]]
    ) -> tuple[list[Claimed], float]:
        """`claim` under token buckets, as efd/store/ratelimit.py keeps them: each refilled
        for the time since it was last touched (a new one starts full), at most what the
        fewest-stocked one holds beyond its reserve claimed, that many taken from each."""
        now = request.now
        left = math.inf
        for key, rate, burst, reserve in buckets:
            tokens, then = self.buckets.get(key, (burst, now))
            tokens = min(burst, tokens + max(0.0, now - then) * rate)
            self.buckets[key] = (tokens, max(now, then))
            left = min(left, tokens - reserve)
        limit = max(0, min(request.limit, math.floor(left + 1e-9)))
        claimed = await self.claim(replace(request, limit=limit)) if limit else []
        for key, _, _, _ in buckets:
            tokens, then = self.buckets[key]
            self.buckets[key] = (tokens - len(claimed), then)
        return claimed, left - len(claimed)

    async def renew(self, leases: Sequence[tuple[int, int]], until: float) -> list[int]:
        self._reach()
        taken = []
        for pk, token in leases:
            r = self.rows[pk]
            if r.token == token and r.status is DeliveryStatus.PENDING:
                r.next_attempt_at = until
            else:
                taken.append(pk)
        return taken

    async def record(self, outcomes: Sequence[Outcome], attempts: Sequence[AttemptRow]) -> int:
        self._reach()
        if self.slow_outcomes is not None:
            await self.slow_outcomes.wait()
        self.attempts.extend(attempts)
        self.recorded_count += len(outcomes)
        stale = 0
        for o in outcomes:
            r = self.rows[o.delivery_id]
            if r.token != o.lease_token or r.status is not DeliveryStatus.PENDING:
                stale += 1
                continue
            r.status, r.attempts, r.leased = o.status, o.attempts, False
            r.first_attempt_at, r.failed_hooks = o.first_attempt_at, o.failed_hooks
            r.last_error = o.last_error
            if o.next_attempt_at is not None:
                r.next_attempt_at = o.next_attempt_at
            if r.lane is not None and r.status is not DeliveryStatus.PENDING:
                self._hand_on(r, o.finished_at or self.clock)
        self.recorded.set()
        return stale

    async def release(self, leases: Sequence[tuple[int, int]], now: float) -> None:
        self._reach()
        self.released.extend(leases)
        for pk, token in leases:
            r = self.rows[pk]
            if r.token == token and r.status is DeliveryStatus.PENDING:
                r.next_attempt_at, r.leased = now, False

    async def next_due(self, destination: str) -> float | None:
        self._reach()
        self.calls["next_due"] += 1
        self.asked_due.set()
        due = [
            r.next_attempt_at
            for r in self.rows.values()
            if r.destination == destination and r.status is DeliveryStatus.PENDING
        ]
        return min(due, default=None)

    async def wake(self, destination: str, hook: Sequence[str], now: float) -> int:
        woken = 0
        for r in self.rows.values():
            if (
                r.destination == destination
                and r.status is DeliveryStatus.PENDING
                and not r.leased
                and r.next_attempt_at > now
                and not r.failed_hooks.intersection(hook)
            ):
                r.next_attempt_at = now
                woken += 1
        return woken

    async def expire_waiting(self, destination: str, window: float, now: float) -> int:
        expired = 0
        for r in self.rows.values():  # waiting in lanes first: never a head
            start = r.created_at if r.first_attempt_at is None else r.first_attempt_at
            if (
                r.destination == destination
                and r.status is DeliveryStatus.QUEUED
                and start <= now - window
            ):
                r.status = DeliveryStatus.EXPIRED
                expired += 1
        for r in self.rows.values():
            start = r.created_at if r.first_attempt_at is None else r.first_attempt_at
            if (
                r.destination == destination
                and r.status is DeliveryStatus.PENDING
                and not r.leased
                and start <= now - window
            ):
                r.status = DeliveryStatus.EXPIRED
                expired += 1
                if r.lane is not None:
                    self._hand_on(r, now)
        return expired

    async def wait(self, check: Any) -> None:
        """Until `check()` holds, woken by each recorded outcome (no polling)."""
        while not check():
            self.recorded.clear()
            await asyncio.wait_for(self.recorded.wait(), timeout=30)
