"""Ingestion: messages stored with their deliveries, deduplicated, suppressions checked, in
one transaction. Synchronous; the daemon runs it on the writer thread (efd/store/runner.py).
"""

from __future__ import annotations

from collections.abc import Sequence
from operator import attrgetter
from typing import Any, Protocol

from sqlalchemy import Connection

from efd.rows import DeliveryStatus, InsertStatus, NewMessage
from efd.store import lanes, shaped
from efd.store.backends.base import MESSAGE_FIELDS
from efd.store.database import Database
from efd.store.dedupe import message_key
from efd.store.steps import Lanes, StepsSource, no_steps

PENDING = DeliveryStatus.PENDING
QUEUED = DeliveryStatus.QUEUED

_message_fields = attrgetter(*MESSAGE_FIELDS)


class StoresMessages(Protocol):
    """What the other parts of the store use to add messages inside their own
    transactions (regulations' notifications, audience syncs)."""

    def insert_with_deliveries(
        self,
        conn: Connection,
        rows: Sequence[NewMessage],
        now: float,
        *,
        keys: Sequence[int] | None = None,
    ) -> list[int]: ...


class Ingests(StoresMessages, Protocol):
    """What ingestion (the daemon's batcher) asks of the store."""

    def insert_messages(self, rows: Sequence[NewMessage], now: float) -> list[InsertStatus]: ...

    def index_recent_messages(self, now: float) -> None: ...


class Ingestion:
    """Owns the message insert and its deliveries: deduplication (efd/store/dedupe.py),
    the suppression check, lanes and profile capture inside the same transaction (the
    steps the configuration asks for: efd/store/steps.py), and the wake-up at commit.
    Never claims, records or deletes deliveries (efd/store/queue.py)."""

    def __init__(self, database: Database, steps: StepsSource = no_steps) -> None:
        self._db = database
        self._backend = database.backend
        self._steps = steps

    def insert_messages(self, rows: Sequence[NewMessage], now: float) -> list[InsertStatus]:
        """Store messages and their deliveries in one transaction.

        Returns, per row, STORED; DUPLICATE for a messageId the same source already sent
        within 24 hours (or earlier in `rows`): acknowledged but not stored again; or
        SUPPRESSED for a message from a userId or anonymousId a regulation suppressed:
        acknowledged and dropped.
        """
        steps = self._steps()
        with self._db.write() as conn:
            blocked: set[str] = set()
            if steps.suppressions is not None:
                who = {i for r in rows for i in (r.user_id, r.anonymous_id) if i is not None}
                if who:
                    blocked = steps.suppressions.suppressed(conn, who)
            keys = [message_key(r.source, r.message_id) for r in rows]
            seen = self._backend.recent_message_ids(conn, keys, now)
            fresh: list[NewMessage] = []
            fresh_keys: list[int] = []
            status: list[InsertStatus] = []
            for row, key in zip(rows, keys, strict=True):
                if blocked and (row.user_id in blocked or row.anonymous_id in blocked):
                    status.append(InsertStatus.SUPPRESSED)
                    continue
                pair = (row.source, row.message_id)
                if pair in seen:
                    status.append(InsertStatus.DUPLICATE)
                    continue
                seen.add(pair)
                fresh.append(row)
                fresh_keys.append(key)
                status.append(InsertStatus.STORED)
            if not fresh:
                return status
            self._insert(conn, fresh, now, fresh_keys, steps.lanes)
            if steps.capture is not None:
                steps.capture(conn, fresh)
            return status

    def index_recent_messages(self, now: float) -> None:
        """Fill the writer's in-memory deduplication index now rather than at the first
        insert, where the backend keeps one."""
        with self._db.write() as conn:
            self._backend.prepare_writer(conn, now)

    def insert_with_deliveries(
        self,
        conn: Connection,
        rows: Sequence[NewMessage],
        now: float,
        *,
        keys: Sequence[int] | None = None,
    ) -> list[int]:
        """Insert messages and their pending deliveries in `conn`'s transaction, without
        deduplication; return the messages' ids. Ingestion, regulations and audience syncs
        all store their messages through here. `keys`: the rows' message_key, when the
        caller has them already."""
        if keys is None:
            keys = [message_key(r.source, r.message_id) for r in rows]
        return self._insert(conn, rows, now, keys, self._steps().lanes)

    def _insert(
        self,
        conn: Connection,
        rows: Sequence[NewMessage],
        now: float,
        keys: Sequence[int],
        lanes_of: Lanes | None,
    ) -> list[int]:
        message_rows = [(*_message_fields(r), k) for r, k in zip(rows, keys, strict=True)]
        ids = self._backend.insert_messages(conn, message_rows, keys, now)
        delivery_rows: list[tuple[Any, ...]]
        if lanes_of is None:
            delivery_rows = [
                (pk, name, PENDING, 0, now, now, 0, None)
                for pk, r in zip(ids, rows, strict=True)
                for name in r.destinations
            ]
        else:
            # A delivery that joins a lane waits, queued, until admit() below makes it the
            # head of a lane that has none.
            lane_of = lanes_of.lane
            delivery_rows = [
                (pk, name, PENDING, 0, now, now, 0, None)
                if (lane := lane_of(r, name)) is None
                else (pk, name, QUEUED, 0, now, None, 0, lane)
                for pk, r in zip(ids, rows, strict=True)
                for name in r.destinations
            ]
        if delivery_rows:
            self._backend.insert_deliveries(conn, delivery_rows)
        pending = bool(delivery_rows)
        laned = any(row[7] is not None for row in delivery_rows)
        if any(r.shaped for r in rows):
            shaped_rows = shaped.rows(ids, rows, now)
            if lanes_of is not None:
                by_pk = dict(zip(ids, rows, strict=True))
                laned = shaped.join_lanes(shaped_rows, by_pk, lanes_of.lane) or laned
            pending = shaped.insert_rows(conn, shaped_rows) or pending
        if laned:
            lanes.admit(conn, self._backend, now, messages=(min(ids), max(ids)))
        if pending:
            self._backend.notify(conn)
        return list(ids)
