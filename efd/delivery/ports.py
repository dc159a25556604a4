"""What the dispatcher needs of the store and of the senders, as Protocols: it knows them
by nothing else (an import contract holds it to that)."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from typing import Protocol

from efd.delivery.retry import AttemptResult
from efd.observe.tracing import RoundTrace
from efd.records import AttemptRow, Claimed, ClaimRequest, Outcome
from efd.segment.webhooks import MessageKey, Route


class Rounds(Protocol):
    """Sends one round of a delivery: the in-process Sender, or the sender processes."""

    def start_round(
        self,
        route: Route,
        urls: Sequence[str],
        body: str,
        message: MessageKey,
        url: str | None = None,
        trace: RoundTrace | None = None,
    ) -> asyncio.Future[list[AttemptResult]]:
        """Start sending `body` to `urls` (hook URLs of `route`) under the webhook-id of
        `message`, with the route's method and Content-Type; `url`: an action's delivery's
        own URL, sent to instead of the hook's (whose URL still names it in the results,
        circuits and limits); `trace`: what its attempts' spans need, when telemetry is on.
        The future holds the round's results (it never fails for what a receiver or the
        network does).
        A future, not a coroutine: the dispatcher adds a callback instead of running a task
        per round."""
        ...


class Deliveries(Protocol):
    """The deliveries the dispatcher works on: the store (efd/store/runner.py), or the
    tests' in-memory twin. Errors of the store are efd.errors.StoreError."""

    async def claim(self, request: ClaimRequest) -> list[Claimed]:
        """Lease the deliveries `request` asks for (efd/records.py's ClaimRequest)."""
        ...

    async def claim_limited(
        self, request: ClaimRequest, buckets: Sequence[tuple[str, float, float, float]]
    ) -> tuple[list[Claimed], float]:
        """`claim` under the (key, rate, burst, reserve) token buckets of rate-limited
        hooks, in the same transaction: at most as many as every bucket has tokens for beyond
        its reserve, taking one from each per delivery claimed. Returns the claimed and the
        fewest tokens any bucket kept beyond its reserve."""
        ...

    async def renew(self, leases: Sequence[tuple[int, int]], until: float) -> list[int]:
        """Extend to `until` the leases (delivery id, token) still held, lapsed or not, as
        long as no other claim took the delivery; return the ids that were taken (or are
        no longer pending)."""
        ...

    async def record(self, outcomes: Sequence[Outcome], attempts: Sequence[AttemptRow]) -> int:
        """Write attempts and outcomes (fenced by token); return how many were stale."""
        ...

    async def release(self, leases: Sequence[tuple[int, int]], now: float) -> None:
        """Give back claimed deliveries never sent: due again at `now`."""
        ...

    async def next_due(self, destination: str) -> float | None:
        """The earliest next_attempt_at of the destination's pending deliveries."""
        ...

    async def wake(self, destination: str, hook: Sequence[str], now: float) -> int:
        """Make due at `now` the destination's pending deliveries, not leased, whose
        failed_hooks names none of `hook`'s forms (its label, and its URL as rows written
        before labels hold it); return how many moved."""
        ...

    async def expire_waiting(self, destination: str, window: float, now: float) -> int:
        """Expire the destination's pending deliveries, not leased, whose retry window
        (from their first attempt, or their creation if never attempted) has closed."""
        ...
