"""Paused and disabled destinations and hooks: the `pauses` table.

A row names a target, a whole destination (hook NULL) or one of its hooks (numbered from 1
in the configuration's order), and its kind:

- `paused`: an operator paused it (`efd pause`, POST /admin/destinations/{name}/pause);
- `disabled`: it failed for `[delivery] disable_after_hours` and efd took it out;
- `failing`: not a pause. The start of a hook's current run of failures, kept while
  `disable_after_hours` is set, so that the run survives restarts and counts every daemon's
  attempts; the first success deletes it, and one old enough becomes `disabled`.

A resume deletes the row, and moves the retry window of the destination's open deliveries
forward by the time it was paused (never before their first attempt), and makes the
pending ones due now. Synchronous; the daemon runs it off the event loop.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from sqlalchemy import Connection, and_, case, delete, func, select, update

from efd.records import DeliveryStatus
from efd.store.database import Database
from efd.store.schema import deliveries, pauses

# (destination, hook or None, kind, reason, since)
PauseRow = tuple[str, int | None, str, str | None, float]

PAUSED, DISABLED, FAILING = "paused", "disabled", "failing"
KINDS = (PAUSED, DISABLED)  # the kinds that hold deliveries back
_PENDING = DeliveryStatus.PENDING.value
_QUEUED = DeliveryStatus.QUEUED.value


def _target(destination: str, hook: int | None) -> Any:
    hook_is = pauses.c.hook.is_(None) if hook is None else pauses.c.hook == hook
    return and_(pauses.c.destination == destination, hook_is)


def _row(conn: Connection, destination: str, hook: int | None) -> PauseRow | None:
    found = conn.execute(
        select(pauses.c.destination, pauses.c.hook, pauses.c.kind, pauses.c.reason, pauses.c.since)
        .where(_target(destination, hook))
        .limit(1)
    ).first()
    return None if found is None else (found[0], found[1], found[2], found[3], float(found[4]))


class PausesStore:
    """Owns the `pauses` table; on a resume it moves the destination's open deliveries'
    windows and due times, and nothing else of theirs."""

    def __init__(self, database: Database) -> None:
        self._db = database
        self._backend = database.backend

    def all(self, *, failing: bool = False) -> list[PauseRow]:
        """Every pause and disable, by destination and hook (the whole destination first);
        `failing`: the runs of failures too."""
        query = select(
            pauses.c.destination, pauses.c.hook, pauses.c.kind, pauses.c.reason, pauses.c.since
        ).order_by(pauses.c.destination, func.coalesce(pauses.c.hook, 0))
        if not failing:
            query = query.where(pauses.c.kind.in_(KINDS))
        with self._db.read() as conn:
            return [(d, h, k, r, float(s)) for d, h, k, r, s in conn.execute(query)]

    def pause(self, destination: str, hook: int | None, reason: str | None, now: float) -> PauseRow:
        """Pause the target; one already paused or disabled keeps its `since` (the time its
        deliveries have been held) and takes the new reason. Returns the row."""
        with self._db.write() as conn:
            existing = _row(conn, destination, hook)
            if existing is None or existing[2] == FAILING:
                conn.execute(delete(pauses).where(_target(destination, hook)))
                conn.execute(
                    pauses.insert().values(
                        destination=destination, hook=hook, kind=PAUSED, reason=reason, since=now
                    )
                )
                return (destination, hook, PAUSED, reason, now)
            conn.execute(
                update(pauses).where(_target(destination, hook)).values(kind=PAUSED, reason=reason)
            )
            return (destination, hook, PAUSED, reason, existing[4])

    def resume(
        self, destination: str, hook: int | None, routes: Sequence[str], now: float
    ) -> tuple[PauseRow | None, int]:
        """Lift the target's pause or disable: (the row it lifted, or None when there was
        none; how many pending deliveries of `routes`, not in flight, are due now)."""
        with self._db.write() as conn:
            existing = _row(conn, destination, hook)
            if existing is None or existing[2] == FAILING:
                return None, 0
            conn.execute(delete(pauses).where(_target(destination, hook)))
            due = self._move_windows(conn, routes, existing[4], now)
            if due:
                self._backend.notify(conn)
            return existing, due

    def _move_windows(
        self, conn: Connection, routes: Sequence[str], since: float, now: float
    ) -> int:
        """The window counts from the first attempt (or receipt, for a delivery waiting in a
        lane): moved forward by the paused time, and to now for one first sent while paused."""
        if not routes or now <= since:
            return 0
        ours = deliveries.c.destination.in_(list(routes))
        first = deliveries.c.first_attempt_at
        conn.execute(
            update(deliveries)
            .where(ours, deliveries.c.status == _PENDING, first.is_not(None), first < now)
            .values(first_attempt_at=case((first > since, now), else_=first + (now - since)))
        )
        waited = func.coalesce(first, deliveries.c.created_at)
        conn.execute(
            update(deliveries)
            .where(ours, deliveries.c.status == _QUEUED, waited < now)
            .values(first_attempt_at=case((waited > since, now), else_=waited + (now - since)))
        )
        conn.execute(
            update(deliveries)
            .where(
                ours,
                deliveries.c.status == _PENDING,
                deliveries.c.lease_owner.is_(None),
                deliveries.c.next_attempt_at > now,
            )
            .values(next_attempt_at=now)
        )
        return int(
            conn.execute(
                select(func.count()).where(
                    ours, deliveries.c.status == _PENDING, deliveries.c.lease_owner.is_(None)
                )
            ).scalar_one()
        )

    # -- runs of failures, for disable_after_hours --------------------------------------------

    def failing(self, destination: str, hook: int, began: float) -> PauseRow:
        """Note the hook's run of failures that began at `began`: the row of its target as
        it is afterwards (an earlier start, when a run was already noted; or a pause)."""
        with self._db.write() as conn:
            existing = _row(conn, destination, hook)
            if existing is not None:
                return existing
            conn.execute(
                pauses.insert().values(
                    destination=destination, hook=hook, kind=FAILING, reason=None, since=began
                )
            )
            return (destination, hook, FAILING, None, began)

    def answered(self, destination: str, hook: int) -> bool:
        """The hook succeeded: its run of failures, if one was noted, ends. True if one did."""
        with self._db.write() as conn:
            return bool(
                conn.execute(
                    delete(pauses).where(_target(destination, hook), pauses.c.kind == FAILING)
                ).rowcount
            )

    def disable(
        self, destination: str, hook: int, reason: str, started_before: float, now: float
    ) -> bool:
        """Disable the hook if its run of failures started at or before `started_before`;
        False when it did not (a success ended it, or it is paused or disabled already).
        Its `since` becomes `now`: deliveries are held from then on (the reason names the
        run's start)."""
        with self._db.write() as conn:
            return bool(
                conn.execute(
                    update(pauses)
                    .where(
                        _target(destination, hook),
                        pauses.c.kind == FAILING,
                        pauses.c.since <= started_before,
                    )
                    .values(kind=DISABLED, reason=reason, since=now)
                ).rowcount
            )
