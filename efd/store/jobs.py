"""Jobs and retention: which process runs a periodic job this turn, the readiness probe's
write, and the purge of finished messages. Synchronous; run in threads.
"""

from __future__ import annotations

from typing import Protocol

from sqlalchemy import delete, or_, select, update

from efd.rows import DeliveryStatus
from efd.store.database import Database
from efd.store.schema import attempts, deliveries, jobs, messages

READINESS_ROW = "readiness"  # the jobs row readiness probes write


class Jobs(Protocol):
    """What the periodic jobs and the readiness probe ask of the store."""

    def claim_job(self, name: str, *, interval: float, owner: str, now: float) -> bool: ...

    def write_probe(self, owner: str, now: float) -> None: ...

    def purge_finished(self, before: float, limit: int) -> int: ...


class JobsStore:
    """Owns the jobs table (turns of periodic jobs, the readiness row) and retention's
    deletes of finished messages with their deliveries and attempts. Never changes a
    pending delivery."""

    def __init__(self, database: Database) -> None:
        self._db = database
        self._backend = database.backend

    def claim_job(self, name: str, *, interval: float, owner: str, now: float) -> bool:
        """True when this process should run the periodic job `name` now: it is due and no
        other process took this turn."""
        upsert = self._backend.insert(jobs).values(name=name, last_run_at=0.0, owner=None)
        with self._db.write() as conn:
            conn.execute(upsert.on_conflict_do_nothing(index_elements=["name"]))
            result = conn.execute(
                update(jobs)
                .where(jobs.c.name == name, jobs.c.last_run_at <= now - interval * 0.9)
                .values(last_run_at=now, owner=owner)
            )
            return result.rowcount == 1

    def write_probe(self, owner: str, now: float) -> None:
        """A small real write and commit, for readiness: the `readiness` row of jobs notes
        which process wrote last, and when."""
        insert = self._backend.insert(jobs).values(name=READINESS_ROW, last_run_at=now, owner=owner)
        with self._db.write() as conn:
            conn.execute(
                insert.on_conflict_do_update(
                    index_elements=["name"], set_={"last_run_at": now, "owner": owner}
                )
            )

    def purge_finished(self, before: float, limit: int) -> int:
        """Delete up to `limit` messages all of whose deliveries finished before `before`,
        and those that never had a delivery, with their deliveries and attempts."""
        unfinished = (
            select(deliveries.c.id)
            .where(
                deliveries.c.message_pk == messages.c.id,
                or_(
                    # waiting for a round, or behind its lane's head
                    deliveries.c.status.in_(
                        [DeliveryStatus.PENDING.value, DeliveryStatus.QUEUED.value]
                    ),
                    deliveries.c.finished_at >= before,
                ),
            )
            .exists()
        )
        with self._db.write() as conn:
            ids = (
                conn.execute(
                    select(messages.c.id)
                    .where(messages.c.received_at < before, ~unfinished)
                    .order_by(messages.c.id)
                    .limit(limit)
                )
                .scalars()
                .all()
            )
            if not ids:
                return 0
            delivery_ids = select(deliveries.c.id).where(deliveries.c.message_pk.in_(ids))
            conn.execute(delete(attempts).where(attempts.c.delivery_id.in_(delivery_ids)))
            conn.execute(delete(deliveries).where(deliveries.c.message_pk.in_(ids)))
            conn.execute(delete(messages).where(messages.c.id.in_(ids)))
            return len(ids)
