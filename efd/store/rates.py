"""Deliveries finished per destination and minute over a recent window, for the console's
chart. Synchronous; the daemon runs it in a reader thread. One query, bounded by time on
ix_deliveries_status_finished_at (status, finished_at): it reads only the window's finished
deliveries, however large the table."""

from __future__ import annotations

from typing import TYPE_CHECKING

from sqlalchemy import Integer, cast, func, select

from efd.records import DeliveryStatus
from efd.store.schema import deliveries

if TYPE_CHECKING:
    from efd.store import Store

COUNTED = (DeliveryStatus.DELIVERED.value, DeliveryStatus.FAILED.value)


class Rates:
    """Reads finished deliveries' counts; writes nothing."""

    def __init__(self, store: Store) -> None:
        self._db = store.database

    def per_minute(self, since: float) -> dict[str, dict[int, dict[str, int]]]:
        """destination -> minute (whole minutes since `since`) -> status -> count, for the
        deliveries delivered or failed since `since`."""
        minute = cast(func.floor((deliveries.c.finished_at - since) / 60), Integer)
        query = (
            select(deliveries.c.destination, minute, deliveries.c.status, func.count())
            .where(deliveries.c.status.in_(COUNTED), deliveries.c.finished_at >= since)
            .group_by(deliveries.c.destination, minute, deliveries.c.status)
        )
        found: dict[str, dict[int, dict[str, int]]] = {}
        with self._db.read() as conn:
            for destination, at, status, count in conn.execute(query):
                found.setdefault(destination, {}).setdefault(int(at), {})[status] = int(count)
        return found
