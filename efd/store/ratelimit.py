"""Token buckets of rate-limited hooks, shared by every daemon on the store.

A claim of a rate-limited destination refills each of its buckets for the time since it was
last touched, up to its burst, claims at most what the fewest-stocked one holds beyond its
reserve, and takes as many tokens as it claimed from each: all in the claim's transaction,
the rows locked in key order on PostgreSQL (so daemons claiming for the same hooks queue
rather than deadlock), under the single writer on SQLite; no token is taken for a round not
claimed. PostgreSQL's clock
times the refills, so daemons on hosts whose clocks differ still share one budget.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

from sqlalchemy import Connection, text

from efd.records import Claimed, ClaimRequest
from efd.store.database import Database
from efd.store.queue import Queue

# (key, tokens a second, burst, reserve) of each bucket a claim takes from.
Buckets = Sequence[tuple[str, float, float, float]]


def _refill(now: str) -> str:
    # A clock that went back refills nothing and keeps the later time.
    elapsed = f"CASE WHEN {now} > updated_at THEN {now} - updated_at ELSE 0 END"
    filled = f"tokens + ({elapsed}) * :rate"
    return (
        f"UPDATE hook_tokens SET tokens = CASE WHEN {filled} > :burst THEN :burst ELSE {filled}"
        f" END, updated_at = CASE WHEN {now} > updated_at THEN {now} ELSE updated_at END"
        " WHERE key = :key RETURNING tokens"
    )


def _start(now: str) -> str:
    # A new bucket starts full.
    return (
        "INSERT INTO hook_tokens (key, tokens, updated_at) VALUES (:key, :burst, "
        f"{now}) ON CONFLICT (key) DO NOTHING"
    )


_TAKE = text("UPDATE hook_tokens SET tokens = tokens - :n WHERE key = :key")


class _ClaimTokens:
    """The buckets of one claim (queue.Tokens): refilled and read before the claim, taken
    from after it, in its transaction."""

    def __init__(self, clock: str | None, buckets: Buckets, now: float) -> None:
        now_sql = clock or ":now"
        self._start = text(_start(now_sql))
        self._refill = text(_refill(now_sql))
        self._buckets = sorted(buckets)
        self._now = now
        self.left = math.inf  # the fewest tokens any bucket keeps beyond its reserve

    def available(self, conn: Connection, want: int) -> int:
        for key, _, burst, _ in self._buckets:
            conn.execute(self._start, {"key": key, "burst": burst, "now": self._now})
        self.left = min(
            (
                float(
                    conn.execute(
                        self._refill,
                        {"key": key, "rate": rate, "burst": burst, "now": self._now},
                    ).scalar_one()
                )
                - reserve
                for key, rate, burst, reserve in self._buckets
            ),
            default=math.inf,
        )
        return max(0, min(want, math.floor(self.left + 1e-9)))

    def take(self, conn: Connection, used: int) -> None:
        if used:
            conn.execute(_TAKE, [{"key": key, "n": used} for key, _, _, _ in self._buckets])
            self.left -= used


class HookTokens:
    """Claims under rate limits: the delivery queue's claim with the buckets' step."""

    def __init__(self, database: Database, queue: Queue) -> None:
        self._clock = database.backend.clock
        self._queue = queue

    def claim(self, request: ClaimRequest, buckets: Buckets) -> tuple[list[Claimed], float]:
        """Queue.claim under the buckets' limits: (the claimed, the fewest tokens any
        bucket keeps beyond its reserve)."""
        tokens = _ClaimTokens(self._clock, buckets, request.now)
        return self._queue.claim(request, tokens=tokens), tokens.left
