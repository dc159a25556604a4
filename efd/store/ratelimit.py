"""Token buckets of rate-limited hooks, shared by every daemon on the store.

Taking tokens refills each bucket for the time since it was last touched, up to its burst,
then takes the same whole number from each, at most what the fewest-stocked one holds beyond
its reserve: one
short write transaction, the rows locked in key order on PostgreSQL (so daemons taking from
the same buckets queue rather than deadlock), the single writer on SQLite. PostgreSQL's clock
times the refills, so daemons on hosts whose clocks differ still share one budget.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

from sqlalchemy import Connection, text

from efd.store.queue import Store

# (key, tokens a second, burst, reserve) of each bucket a claim takes from.
Buckets = Sequence[tuple[str, float, float, float]]

_NOW = {True: ":now", False: "EXTRACT(EPOCH FROM clock_timestamp())"}


def _refill(sqlite: bool) -> str:
    now = _NOW[sqlite]
    # A clock that went back refills nothing and keeps the later time.
    elapsed = f"CASE WHEN {now} > updated_at THEN {now} - updated_at ELSE 0 END"
    filled = f"tokens + ({elapsed}) * :rate"
    return (
        f"UPDATE hook_tokens SET tokens = CASE WHEN {filled} > :burst THEN :burst ELSE {filled}"
        f" END, updated_at = CASE WHEN {now} > updated_at THEN {now} ELSE updated_at END"
        " WHERE key = :key RETURNING tokens"
    )


_REFILL = {sqlite: text(_refill(sqlite)) for sqlite in (True, False)}
# A new bucket starts full.
_START = {
    sqlite: text(
        "INSERT INTO hook_tokens (key, tokens, updated_at) VALUES (:key, :burst, "
        f"{_NOW[sqlite]}) ON CONFLICT (key) DO NOTHING"
    )
    for sqlite in (True, False)
}
_TAKE = text("UPDATE hook_tokens SET tokens = tokens - :n WHERE key = :key")
_GIVE = text(
    "UPDATE hook_tokens SET tokens = CASE WHEN tokens + :n > :burst THEN :burst"
    " ELSE tokens + :n END WHERE key = :key"
)


class HookTokens:
    def __init__(self, store: Store) -> None:
        self._store = store

    def take(self, buckets: Buckets, want: int, now: float) -> tuple[int, float]:
        """Take up to `want` tokens from every bucket: (how many, the fewest any kept beyond
        its reserve)."""
        sqlite = self._store.sqlite
        ordered = sorted(buckets)
        with self._store.writer.begin() as conn:
            self._ensure(conn, sqlite, ordered, now)
            available = [
                float(
                    conn.execute(
                        _REFILL[sqlite], {"key": key, "rate": rate, "burst": burst, "now": now}
                    ).scalar_one()
                )
                - reserve
                for key, rate, burst, reserve in ordered
            ]
            fewest = min(available, default=math.inf)
            granted = max(0, min(want, math.floor(fewest + 1e-9)))
            if granted:
                conn.execute(_TAKE, [{"key": key, "n": granted} for key, _, _, _ in ordered])
        return granted, fewest - granted

    def give_back(self, buckets: Buckets, count: int) -> None:
        """Return tokens taken for rounds never started (fewer deliveries were due)."""
        if count <= 0 or not buckets:
            return
        with self._store.writer.begin() as conn:
            conn.execute(
                _GIVE,
                [{"key": key, "n": count, "burst": burst} for key, _, burst, _ in sorted(buckets)],
            )

    @staticmethod
    def _ensure(conn: Connection, sqlite: bool, buckets: Buckets, now: float) -> None:
        for key, _, burst, _ in buckets:
            conn.execute(_START[sqlite], {"key": key, "burst": burst, "now": now})
