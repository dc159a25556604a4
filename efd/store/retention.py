"""Retention: the purge of finished messages with their deliveries and attempts, and how far
behind it is. Synchronous; run in threads.

The purge walks messages in primary-key order from a cursor (the jobs table's retention row),
never from the start. A step takes the next messages after the cursor up to the first one
received after the horizon, probes their deliveries through ix_deliveries_message_pk, deletes
those whose deliveries all finished before the horizon, and notes the others in
retention_kept, which every run looks at again. A step's cost depends on its size, not on how
many rows are stored or were purged before (docs/decisions.md#retention-walks-from-a-cursor).

Steps commit as bookkeeping does (efd/store/database.py): one lost in a crash of the server
loses its deletes and its cursor together, and the next run does them again. PostgreSQL
plans them with sequential scans off, so a plan cached while the tables were small never
scans them once they are large.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol

from sqlalchemy import ColumnElement, Connection, and_, delete, func, or_, select, update

from efd.records import DeliveryStatus
from efd.store import batches
from efd.store.database import Database
from efd.store.schema import attempts, deliveries, jobs, messages, retention_kept

ROW = "retention"  # the jobs row: retention's turns, and its walk's cursor


@dataclass(frozen=True, slots=True)
class Step:
    """One transaction of the purge."""

    purged: int  # messages deleted, with their deliveries and attempts
    looked_at: int  # messages (or kept ids) looked at; 0: nothing left to look at
    last: int  # the highest message id looked at


@dataclass(frozen=True, slots=True)
class Lag:
    """How far behind retention is, at a horizon."""

    # Receipt time of the first message the walk has not passed, when that is before the
    # horizon; None: the walk has caught up.
    oldest_at: float | None
    behind_seconds: float  # horizon - oldest_at; 0 when caught up
    kept: int  # messages passed while some work of theirs was pending, looked at every run


class Retention(Protocol):
    """What the retention job and the operators' views ask of the store."""

    def revisit(self, before: float, after: int, limit: int) -> Step: ...

    def advance(self, before: float, limit: int) -> Step: ...

    def purge(self, before: float, limit: int) -> int: ...

    def lag(self, before: float) -> Lag: ...


def _unfinished(before: float) -> ColumnElement[bool]:
    """A delivery that keeps its message: waiting for a round or behind its lane's head, or
    finished after the horizon."""
    return or_(
        deliveries.c.status.in_([DeliveryStatus.PENDING.value, DeliveryStatus.QUEUED.value]),
        deliveries.c.finished_at >= before,
    )


class RetentionStore:
    """Owns retention_kept and the retention row's cursor, and deletes finished messages with
    their deliveries and attempts, and a batch with its last member (efd/store/batches.py).
    Never deletes a message that has a pending, queued or recently finished delivery; never
    changes a delivery."""

    def __init__(self, database: Database) -> None:
        self._db = database
        self._backend = database.backend

    def advance(self, before: float, limit: int) -> Step:
        """One step of the walk: the next `limit` messages after the cursor, up to the first
        received at or after `before`. Purges the finished ones, keeps the ids of the others,
        and moves the cursor past them all."""
        with self._db.bookkeeping() as conn:
            cursor = self._cursor(conn)
            rows = conn.execute(
                select(messages.c.id, messages.c.received_at)
                .where(messages.c.id > cursor)
                .order_by(messages.c.id)
                .limit(limit)
            ).all()
            old = 0
            while old < len(rows) and rows[old].received_at < before:
                old += 1
            if not old:
                return Step(0, 0, cursor)
            high = int(rows[old - 1].id)
            # Locked, so a replay adding a delivery to one of them either committed before
            # (and the probe below sees it) or waits, then finds the message gone. Read
            # again: a message whose insert committed after the read above is in range too.
            found = conn.execute(
                select(messages.c.id, messages.c.received_at)
                .where(messages.c.id > cursor, messages.c.id <= high)
                .with_for_update()
            ).all()
            busy = self._busy(conn, before, deliveries.c.message_pk > cursor, high)
            kept = [int(row.id) for row in found if row.received_at >= before or row.id in busy]
            purged = len(found) - len(kept)
            if purged:
                self._delete_range(conn, before, cursor, high, kept)
            self._keep(conn, kept)
            # SQLite gives a new row the highest id stored plus one: once the newest messages
            # are purged, their ids come again, and a cursor left above them would pass the
            # new messages by. The cursor stops at the highest id left; new ids are above it.
            top = conn.execute(select(func.max(messages.c.id))).scalar()
            cursor = high if top is not None and top >= high else int(top or 0)
            conn.execute(update(jobs).where(jobs.c.name == ROW).values(cursor_pk=cursor))
            return Step(purged, len(found), cursor)

    def revisit(self, before: float, after: int, limit: int) -> Step:
        """One step over the kept messages: the next `limit` ids above `after`. Purges those
        whose work has finished before `before`, forgets those gone, keeps the rest."""
        with self._db.bookkeeping() as conn:
            kept = [
                int(pk)
                for pk in conn.execute(
                    select(retention_kept.c.message_pk)
                    .where(retention_kept.c.message_pk > after)
                    .order_by(retention_kept.c.message_pk)
                    .limit(limit)
                ).scalars()
            ]
            if not kept:
                return Step(0, 0, after)
            found = conn.execute(
                select(messages.c.id, messages.c.received_at)
                .where(messages.c.id.in_(kept))
                .with_for_update()
            ).all()
            candidates = [int(row.id) for row in found if row.received_at < before]
            busy = self._busy(conn, before, deliveries.c.message_pk.in_(candidates))
            done = [pk for pk in candidates if pk not in busy]
            self._delete(conn, done)
            present = {int(row.id) for row in found}
            settled = [pk for pk in kept if pk not in present or pk in done]
            if settled:
                conn.execute(delete(retention_kept).where(retention_kept.c.message_pk.in_(settled)))
            return Step(len(done), len(kept), kept[-1])

    def purge(self, before: float, limit: int) -> int:
        """A whole run without pauses, `limit` messages a transaction: the kept messages,
        then the walk up to the horizon. Returns how many messages were purged."""
        purged, after = 0, 0
        while (step := self.revisit(before, after, limit)).looked_at:
            purged, after = purged + step.purged, step.last
        while (step := self.advance(before, limit)).looked_at:
            purged += step.purged
        return purged

    def lag(self, before: float) -> Lag:
        """How far behind the walk is at the horizon `before`, and how many it keeps."""
        with self._db.snapshot() as conn:
            cursor = conn.execute(select(jobs.c.cursor_pk).where(jobs.c.name == ROW)).scalar()
            oldest = conn.execute(
                select(messages.c.received_at)
                .where(messages.c.id > (cursor or 0))
                .order_by(messages.c.id)
                .limit(1)
            ).scalar()
            kept = conn.execute(select(func.count()).select_from(retention_kept)).scalar_one()
        if oldest is None or oldest >= before:
            return Lag(None, 0.0, int(kept))
        return Lag(float(oldest), before - float(oldest), int(kept))

    # -- parts of a step ----------------------------------------------------------------------

    def _cursor(self, conn: Connection) -> int:
        """The walk's cursor, its row locked until the step commits: steps of two processes
        (a run that outlasted its turn, and the next) take turns, each from where the other
        stopped."""
        query = select(jobs.c.cursor_pk).where(jobs.c.name == ROW).with_for_update()
        row = conn.execute(query).first()
        if row is None:
            insert = self._backend.insert(jobs).values(name=ROW, last_run_at=0.0, owner=None)
            conn.execute(insert.on_conflict_do_nothing(index_elements=["name"]))
            row = conn.execute(query).first()
        return 0 if row is None or row.cursor_pk is None else int(row.cursor_pk)

    @staticmethod
    def _busy(
        conn: Connection, before: float, where: ColumnElement[bool], high: int | None = None
    ) -> set[int]:
        """The messages among `where` (and at most `high`) with an unfinished delivery."""
        query = select(deliveries.c.message_pk).where(where, _unfinished(before)).distinct()
        if high is not None:
            query = query.where(deliveries.c.message_pk <= high)
        return {int(pk) for pk in conn.execute(query).scalars()}

    @staticmethod
    def _delete(conn: Connection, done: Sequence[int]) -> None:
        """Delete the messages `done` with their deliveries and attempts, each by its index."""
        if not done:
            return
        ids = list(done)
        delivery_ids = list(
            conn.execute(select(deliveries.c.id).where(deliveries.c.message_pk.in_(ids))).scalars()
        )
        if delivery_ids:
            batched = batches.batch_ids_of(conn, deliveries.c.message_pk.in_(ids))
            conn.execute(delete(attempts).where(attempts.c.delivery_id.in_(delivery_ids)))
            conn.execute(delete(deliveries).where(deliveries.c.id.in_(delivery_ids)))
            batches.drop_memberless(conn, batched)
        conn.execute(delete(messages).where(messages.c.id.in_(ids)))

    @staticmethod
    def _delete_range(
        conn: Connection, before: float, low: int, high: int, kept: Sequence[int]
    ) -> None:
        """Delete the messages with ids in (low, high] but `kept`, with their deliveries and
        attempts: each statement one index range scan, whatever the step's size. The
        conditions repeat what made them candidates, so a row that changed since is left."""
        gone = and_(
            deliveries.c.message_pk > low,
            deliveries.c.message_pk <= high,
            deliveries.c.message_pk.not_in(kept),
            deliveries.c.status.not_in([DeliveryStatus.PENDING.value, DeliveryStatus.QUEUED.value]),
            or_(deliveries.c.finished_at.is_(None), deliveries.c.finished_at < before),
        )
        batched = batches.batch_ids_of(conn, gone)
        conn.execute(
            delete(attempts).where(attempts.c.delivery_id.in_(select(deliveries.c.id).where(gone)))
        )
        conn.execute(delete(deliveries).where(gone))
        batches.drop_memberless(conn, batched)
        conn.execute(
            delete(messages).where(
                messages.c.id > low,
                messages.c.id <= high,
                messages.c.id.not_in(kept),
                messages.c.received_at < before,
            )
        )

    def _keep(self, conn: Connection, ids: Sequence[int]) -> None:
        if ids:
            insert = self._backend.insert(retention_kept).values([{"message_pk": pk} for pk in ids])
            conn.execute(insert.on_conflict_do_nothing(index_elements=["message_pk"]))
