"""Ingestion: messages stored with their deliveries, deduplicated, suppressions checked, in
one transaction. Synchronous; the daemon runs it on the writer thread (efd/store/runner.py).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from operator import attrgetter
from typing import Any, Protocol

from sqlalchemy import Connection

from efd.records import Claimed, DeliveryStatus, InsertStatus, NewMessage
from efd.store import lanes, shaped
from efd.store.backends.base import MESSAGE_FIELDS
from efd.store.database import Database
from efd.store.dedupe import message_key
from efd.store.steps import Lanes, StepsSource, no_steps

# Rows carry the statuses as plain str: the sqlite3 driver sends any subclass of str (an
# enum member) through its slow, failing search for an adapter (efd/store/engine.py).
PENDING = DeliveryStatus.PENDING.value
QUEUED = DeliveryStatus.QUEUED.value

_message_fields = attrgetter(*MESSAGE_FIELDS)


class Handoff(Protocol):
    """A dispatcher's free slots for fresh deliveries (efd/delivery/handoff.py): the ones it
    takes are inserted leased to `owner` and listed in `claimed`, to be handed to it once
    the transaction committed, instead of claimed from the table a moment later."""

    owner: str
    lease_seconds: float
    claimed: list[Claimed]
    lease_until: float
    left_pending: bool  # whether the insert left a pending delivery for a claim to find
    short: set[str]  # destinations of plain pending deliveries it had no room for

    def take(self, destination: str, wanted: int) -> int:
        """How many of `wanted` fresh deliveries to `destination` to insert leased."""
        ...


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

    def insert_messages(
        self, rows: Sequence[NewMessage], now: float, *, handoff: Handoff | None = None
    ) -> list[InsertStatus]: ...

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

    def insert_messages(
        self, rows: Sequence[NewMessage], now: float, *, handoff: Handoff | None = None
    ) -> list[InsertStatus]:
        """Store messages and their deliveries in one transaction.

        Returns, per row, STORED; DUPLICATE for a messageId the same source already sent
        within 24 hours (or earlier in `rows`): acknowledged but not stored again; or
        SUPPRESSED for a message from a userId or anonymousId a regulation suppressed:
        acknowledged and dropped. `handoff`: the deliveries it has room for are inserted
        leased to its owner and listed in it (see Handoff).
        """
        if handoff is not None:
            handoff.claimed, handoff.left_pending, handoff.short = [], False, set()
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
            self._insert(conn, fresh, now, fresh_keys, steps.lanes, handoff)
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
        handoff: Handoff | None = None,
    ) -> list[int]:
        message_rows = [(*_message_fields(r), k) for r, k in zip(rows, keys, strict=True)]
        ids = self._backend.insert_messages(conn, message_rows, keys, now)
        delivery_rows: list[tuple[Any, ...]]
        if lanes_of is None:
            delivery_rows = [
                (pk, name, PENDING, 0, now, now, None, 0, None)
                for pk, r in zip(ids, rows, strict=True)
                for name in r.destinations
            ]
        else:
            # A delivery that joins a lane waits, queued, until admit() below makes it the
            # head of a lane that has none.
            lane_of = lanes_of.lane
            delivery_rows = [
                (pk, name, PENDING, 0, now, now, None, 0, None)
                if (lane := lane_of(r, name)) is None
                else (pk, name, QUEUED, 0, now, None, None, 0, lane)
                for pk, r in zip(ids, rows, strict=True)
                for name in r.destinations
            ]
        handed = _hand_off(handoff, delivery_rows, now) if handoff is not None else []
        if delivery_rows:
            delivery_ids = self._backend.insert_deliveries(
                conn, delivery_rows, numbered=bool(handed)
            )
            if handed and handoff is not None:
                by_pk = dict(zip(ids, rows, strict=True))
                handoff.claimed = [
                    _claimed(delivery_ids[i], delivery_rows[i], by_pk[delivery_rows[i][0]])
                    for i in handed
                ]
        pending = len(delivery_rows) > len(handed)
        laned = any(row[8] is not None for row in delivery_rows)
        if any(r.shaped or r.mapped for r in rows):
            shaped_rows = shaped.rows(ids, rows, now)
            if lanes_of is not None:
                by_pk = dict(zip(ids, rows, strict=True))
                laned = shaped.join_lanes(shaped_rows, by_pk, lanes_of.lane) or laned
            pending = shaped.insert_rows(conn, self._backend, shaped_rows) or pending
        if laned:
            lanes.admit(conn, self._backend, now, messages=(min(ids), max(ids)))
        if pending:
            self._backend.notify(conn)
        if handoff is not None:
            handoff.left_pending = pending
        return list(ids)


def _hand_off(handoff: Handoff, rows: list[tuple[Any, ...]], now: float) -> list[int]:
    """Lease to the handoff's owner the pending rows (not in a lane) it has room for, in
    place in `rows`; their positions. The lease is what a claim would have given them:
    token 1, due again when the lease ends."""
    wanted = Counter(row[1] for row in rows if row[2] == PENDING)
    room = {name: got for name, count in wanted.items() if (got := handoff.take(name, count))}
    handoff.short = {name for name, count in wanted.items() if room.get(name, 0) < count}
    if not room:
        return []
    until = now + handoff.lease_seconds
    handoff.lease_until = until
    owner = handoff.owner
    handed = []
    for i, row in enumerate(rows):
        if row[2] == PENDING and room.get(row[1], 0) > 0:
            room[row[1]] -= 1
            rows[i] = (row[0], row[1], PENDING, 0, now, until, owner, 1, None)
            handed.append(i)
    return handed


def _claimed(delivery_id: int, row: tuple[Any, ...], message: NewMessage) -> Claimed:
    return Claimed(
        delivery_id=delivery_id,
        lease_token=row[7],
        destination=row[1],
        attempts=0,
        first_attempt_at=None,
        failed_hooks=frozenset(),
        message_id=message.message_id,
        body=message.body,
        message_pk=row[0],
        source=message.source,
        received_at=message.received_at,
        trace_context=message.trace_context,
    )
