"""Persistence: tables, migrations and every SQL statement.

`Store` builds the shared `Database` (engines, the dialect's backend, the error edge) and
the parts every daemon needs: ingestion, the delivery queue, batches, jobs and retention,
the listener, the pauses. The other parts (operations, health, regulations, suppressions, profiles,
computations) take the Store and are built by whoever uses them. docs/architecture.md maps
them.
"""

from __future__ import annotations

from efd.store.batches import BatchesStore
from efd.store.database import Database
from efd.store.ingestion import Ingestion
from efd.store.jobs import Jobs, JobsStore
from efd.store.lanes import LanesStore
from efd.store.listener import Listener, Listens
from efd.store.pauses import PausesStore
from efd.store.queue import DeliveryQueue, Queue
from efd.store.retention import Retention, RetentionStore
from efd.store.steps import Steps, StepsSource, no_steps


class Store:
    """The store's front door: owns the Database and the core parts built on it. Holds no
    SQL; each part owns its tables' statements."""

    def __init__(
        self,
        url: str,
        *,
        synchronous: str = "FULL",
        pool_size: int = 5,
        steps: StepsSource = no_steps,
    ) -> None:
        """`steps`: called at each ingestion and each recorded outcome for the steps the
        configuration asks of them (efd/store/steps.py); by default none."""
        self.url = url
        self.database = Database(url, synchronous=synchronous, pool_size=pool_size)
        self.backend = self.database.backend
        self.ingestion = Ingestion(self.database, steps)
        self.queue: Queue = DeliveryQueue(self.database, steps)
        self.jobs: Jobs = JobsStore(self.database)
        self.retention: Retention = RetentionStore(self.database)
        self.listener: Listens = Listener(self.database)
        self.lanes = LanesStore(self.database)
        self.batches = BatchesStore(self.database, steps)
        self.pauses = PausesStore(self.database)

    @property
    def single_process(self) -> bool:
        """One process per database: leases and regulations left by an earlier run are
        released at start (efd holds the database's lock)."""
        return self.backend.single_process

    def dispose(self) -> None:
        self.database.dispose()


__all__ = ["Database", "Steps", "Store"]
