"""Endpoint health from the attempt log: per destination and hook URL (as the attempts
table stores it, redacted) over a recent window, and the pending backlog per destination.
Synchronous; the daemon runs it in a reader thread.

The counts are exact. Percentiles are the database's percentile_cont over the whole window
where the backend has one; elsewhere they are computed from the newest `SAMPLE` attempts of
the window, which bounds the rows read per hook.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol

from sqlalchemy import ColumnElement, and_, case, func, select, text

from efd.store.queue import open_backlog
from efd.store.schema import attempts, deliveries

if TYPE_CHECKING:
    from efd.store import Store

SAMPLE = 10_000

# A hook as its statistics are keyed: (destination or route name, redacted hook URL).
Hook = tuple[str, str]


@dataclass(frozen=True, slots=True)
class WindowStats:
    attempts: int
    successes: int
    p50_ms: float | None
    p99_ms: float | None


@dataclass(frozen=True, slots=True)
class LastError:
    error: str
    at: float


def _percentile(sorted_values: Sequence[float], fraction: float) -> float | None:
    """Linear interpolation between closest ranks, as percentile_cont does."""
    if not sorted_values:
        return None
    position = (len(sorted_values) - 1) * fraction
    low, high = math.floor(position), math.ceil(position)
    weight = position - low
    return sorted_values[low] * (1 - weight) + sorted_values[high] * weight


class Health(Protocol):
    """What the status endpoints, the live API and the daemon ask about health."""

    def ping(self) -> None: ...

    def autovacuum_off(self) -> bool: ...

    def backlog(self) -> dict[str, tuple[int, float | None]]: ...

    def window(self, hooks: Sequence[Hook], since: float) -> dict[Hook, WindowStats]: ...

    def last_errors(self, hooks: Sequence[Hook], since: float) -> dict[Hook, LastError]: ...


class HealthStore:
    """Owns the read-only questions about the store's and the endpoints' health: whether the
    database answers, the backlog, per destination and hook windows of the attempt log.
    Writes nothing."""

    def __init__(self, store: Store) -> None:
        self._db = store.database
        self._percentiles = store.backend.percentiles
        self._backend = store.backend

    def ping(self) -> None:
        with self._db.read() as conn:
            conn.execute(text("SELECT 1"))

    def autovacuum_off(self) -> bool:
        """Whether the database server runs with autovacuum off."""
        with self._db.read() as conn:
            return self._backend.autovacuum_off(conn)

    def backlog(self) -> dict[str, tuple[int, float | None]]:
        """destination -> (pending deliveries, the oldest one's creation time)."""
        with self._db.read() as conn:
            return open_backlog(conn)

    def window(self, hooks: Sequence[Hook], since: float) -> dict[Hook, WindowStats]:
        """Attempts since `since` of each (destination, redacted hook URL) of `hooks`: a URL
        two destinations post to counts for each only its own deliveries' attempts."""
        if not hooks:
            return {}
        wanted = set(hooks)
        success = case((attempts.c.outcome == "success", 1), else_=0)
        # Bounded by time first (ix_attempts_attempted_at), then each attempt's delivery by
        # its primary key for the destination.
        recent = and_(
            attempts.c.attempted_at >= since,
            attempts.c.hook_url.in_({url for _, url in wanted}),
            deliveries.c.destination.in_({name for name, _ in wanted}),
        )
        joined = attempts.join(deliveries, deliveries.c.id == attempts.c.delivery_id)
        keys = [deliveries.c.destination, attempts.c.hook_url]
        columns = [*keys, func.count(), func.sum(success)]
        if self._percentiles:
            columns += [
                func.percentile_cont(0.5).within_group(attempts.c.duration_ms),
                func.percentile_cont(0.99).within_group(attempts.c.duration_ms),
            ]
        result: dict[Hook, WindowStats] = {}
        with self._db.read() as conn:
            rows = conn.execute(select(*columns).select_from(joined).where(recent).group_by(*keys))
            for row in rows.all():
                key = (str(row[0]), str(row[1]))
                if key not in wanted:
                    continue
                count, successes = int(row[2]), int(row[3] or 0)
                if self._percentiles:
                    p50, p99 = row[4], row[5]
                else:
                    durations = sorted(
                        conn.execute(
                            select(attempts.c.duration_ms)
                            .select_from(joined)
                            .where(_of(key), attempts.c.attempted_at >= since)
                            .order_by(attempts.c.attempted_at.desc())
                            .limit(SAMPLE)
                        ).scalars()
                    )
                    p50, p99 = _percentile(durations, 0.5), _percentile(durations, 0.99)
                result[key] = WindowStats(
                    count,
                    successes,
                    None if p50 is None else float(p50),
                    None if p99 is None else float(p99),
                )
        return result

    def last_errors(self, hooks: Sequence[Hook], since: float) -> dict[Hook, LastError]:
        """Each (destination, hook)'s latest failed attempt since `since`."""
        found: dict[Hook, LastError] = {}
        joined = attempts.join(deliveries, deliveries.c.id == attempts.c.delivery_id)
        with self._db.read() as conn:
            for key in dict.fromkeys(hooks):
                row = conn.execute(
                    select(
                        attempts.c.attempted_at,
                        attempts.c.status_code,
                        attempts.c.error_class,
                        attempts.c.error,
                    )
                    .select_from(joined)
                    .where(
                        _of(key),
                        attempts.c.attempted_at >= since,
                        attempts.c.outcome != "success",
                    )
                    .order_by(attempts.c.attempted_at.desc())
                    .limit(1)
                ).first()
                if row is None:
                    continue
                at, status, error_class, error = row
                text = f"HTTP {status}" if status is not None else f"{error_class}: {error}"
                found[key] = LastError(text, float(at))
        return found


def _of(key: Hook) -> ColumnElement[bool]:
    """The attempts (joined to their deliveries) of one destination's hook."""
    return and_(deliveries.c.destination == key[0], attempts.c.hook_url == key[1])
