"""Endpoint health from the attempt log: per hook URL (as the attempts table stores it,
redacted) over a recent window, and the pending backlog per destination. Synchronous; the
daemon runs it in a reader thread.

The counts are exact. Percentiles are the database's percentile_cont over the whole window
where the backend has one; elsewhere they are computed from the newest `SAMPLE` attempts of
the window, which bounds the rows read per hook.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol

from sqlalchemy import and_, case, func, select, text

from efd.records import DeliveryStatus
from efd.store.schema import attempts, deliveries

if TYPE_CHECKING:
    from efd.store import Store

SAMPLE = 10_000


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

    def window(self, hooks: Sequence[str], since: float) -> dict[str, WindowStats]: ...

    def last_errors(self, hooks: Sequence[str], since: float) -> dict[str, LastError]: ...


class HealthStore:
    """Owns the read-only questions about the store's and the endpoints' health: whether the
    database answers, the backlog, per-hook windows of the attempt log. Writes nothing."""

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
            rows = conn.execute(
                select(deliveries.c.destination, func.count(), func.min(deliveries.c.created_at))
                .where(
                    deliveries.c.status.in_(
                        [DeliveryStatus.PENDING.value, DeliveryStatus.QUEUED.value]
                    )
                )
                .group_by(deliveries.c.destination)
            ).all()
        return {name: (count, oldest) for name, count, oldest in rows}

    def window(self, hooks: Sequence[str], since: float) -> dict[str, WindowStats]:
        """Attempts to each of `hooks` (redacted URLs) since `since`."""
        if not hooks:
            return {}
        success = case((attempts.c.outcome == "success", 1), else_=0)
        recent = and_(attempts.c.hook_url.in_(hooks), attempts.c.attempted_at >= since)
        columns = [attempts.c.hook_url, func.count(), func.sum(success)]
        if self._percentiles:
            columns += [
                func.percentile_cont(0.5).within_group(attempts.c.duration_ms),
                func.percentile_cont(0.99).within_group(attempts.c.duration_ms),
            ]
        result: dict[str, WindowStats] = {}
        with self._db.read() as conn:
            for row in conn.execute(select(*columns).where(recent).group_by(attempts.c.hook_url)):
                url, count, successes = row[0], int(row[1]), int(row[2] or 0)
                if self._percentiles:
                    p50, p99 = row[3], row[4]
                else:
                    durations = sorted(
                        conn.execute(
                            select(attempts.c.duration_ms)
                            .where(attempts.c.hook_url == url, attempts.c.attempted_at >= since)
                            .order_by(attempts.c.attempted_at.desc())
                            .limit(SAMPLE)
                        ).scalars()
                    )
                    p50, p99 = _percentile(durations, 0.5), _percentile(durations, 0.99)
                result[url] = WindowStats(
                    count,
                    successes,
                    None if p50 is None else float(p50),
                    None if p99 is None else float(p99),
                )
        return result

    def last_errors(self, hooks: Sequence[str], since: float) -> dict[str, LastError]:
        """Each hook's latest failed attempt since `since`."""
        found: dict[str, LastError] = {}
        with self._db.read() as conn:
            for url in hooks:
                row = conn.execute(
                    select(
                        attempts.c.attempted_at,
                        attempts.c.status_code,
                        attempts.c.error_class,
                        attempts.c.error,
                    )
                    .where(
                        attempts.c.hook_url == url,
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
                found[url] = LastError(text, float(at))
        return found
