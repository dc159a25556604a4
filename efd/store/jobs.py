"""Jobs: which process runs a periodic job this turn, and the readiness probe's write.
Synchronous; run in threads. Retention's purge is efd/store/retention.py.
"""

from __future__ import annotations

from typing import Protocol

from sqlalchemy import update

from efd.store.database import Database
from efd.store.retention import RetentionStore
from efd.store.schema import jobs

READINESS_ROW = "readiness"  # the jobs row readiness probes write


class Jobs(Protocol):
    """What the periodic jobs and the readiness probe ask of the store."""

    def claim_job(self, name: str, *, interval: float, owner: str, now: float) -> bool: ...

    def write_probe(self, owner: str, now: float) -> None: ...

    def purge_finished(self, before: float, limit: int) -> int: ...


class JobsStore:
    """Owns the jobs table's turns of periodic jobs and its readiness row."""

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
        """A whole retention run without pauses, `limit` messages a transaction: delete the
        messages all of whose deliveries finished before `before`, and those that never had
        one, with their deliveries and attempts (efd/store/retention.py)."""
        return RetentionStore(self._db).purge(before, limit)
