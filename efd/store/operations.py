"""What operators ask of the store: one message with its deliveries and attempts, a filtered
list of deliveries (keyset pages, newest first), redrive and replay. Synchronous; the
daemon runs it in threads (efd/store/runner.py), the CLI directly.

Looking a message up by messageId uses the message_key index where the table has one; a
backend that keeps it only in the writer's memory (efd/store/dedupe.py) scans messages.

A redrive moves its deliveries in chunks of REDRIVE_CHUNK, each its own short write
transaction, so that a large one never holds the single writer long: ingestion's commits
go in between.
"""

from __future__ import annotations

from array import array
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, Protocol

from sqlalchemy import ColumnElement, Connection, and_, case, func, insert, or_, select, update

from efd.records import (
    ROUTING_FAILURES,
    AttemptRecord,
    BlockedLanes,
    DeliveryQuery,
    DeliveryRecord,
    DeliveryStatus,
    MessageRecord,
    failed_at_routing,
)
from efd.store import lanes
from efd.store.dedupe import message_key
from efd.store.schema import attempts, deliveries, messages

if TYPE_CHECKING:
    from efd.store import Store

REDRIVABLE = (DeliveryStatus.FAILED, DeliveryStatus.EXPIRED)
# Deliveries moved by one transaction of a redrive: a few milliseconds of the writer.
REDRIVE_CHUNK = 500

_DELIVERY_COLUMNS = (
    deliveries.c.id,
    deliveries.c.destination,
    deliveries.c.status,
    deliveries.c.attempts,
    deliveries.c.created_at,
    deliveries.c.first_attempt_at,
    deliveries.c.next_attempt_at,
    deliveries.c.finished_at,
    deliveries.c.last_error,
    deliveries.c.replay_of,
    messages.c.source,
    messages.c.message_id,
    messages.c.type,
    messages.c.user_id,
    messages.c.event,
    messages.c.received_at,
    deliveries.c.url,
)


def _delivery(row: Any) -> DeliveryRecord:
    return DeliveryRecord(*row)


def _message_conditions(query: DeliveryQuery) -> list[ColumnElement[bool]]:
    conditions: list[ColumnElement[bool]] = []
    if query.since is not None:
        conditions.append(messages.c.received_at >= query.since)
    if query.until is not None:
        conditions.append(messages.c.received_at < query.until)
    if query.source is not None:
        conditions.append(messages.c.source == query.source)
    if query.user_id is not None:
        conditions.append(messages.c.user_id == query.user_id)
    if query.message_id is not None:
        conditions.append(messages.c.message_id == query.message_id)
    return conditions


def _delivery_conditions(query: DeliveryQuery) -> list[ColumnElement[bool]]:
    conditions: list[ColumnElement[bool]] = []
    if query.destinations:
        conditions.append(deliveries.c.destination.in_(query.destinations))
    if query.statuses:
        conditions.append(deliveries.c.status.in_([str(s) for s in query.statuses]))
    return conditions


# NULL as "": a NOT over a NULL comparison would leave the row out.
_last_error = func.coalesce(deliveries.c.last_error, "")


def _routed_unsent(kept: Any) -> DeliveryStatus | None:
    """What a replay repeats of an original that routing finished without sending: a
    filter's `filtered`, an action's `failed` whose request could not be made for its
    message (failed with no round sent); None: a delivery to send."""
    if kept is None:
        return None
    if kept.status == DeliveryStatus.FILTERED.value:
        return DeliveryStatus.FILTERED
    if failed_at_routing(kept.status, kept.attempts, kept.last_error):
        return DeliveryStatus.FAILED
    return None


def _redrivable(query: DeliveryQuery) -> ColumnElement[bool]:
    """The deliveries a redrive of `query` moves, and a dry run counts: failed or expired
    (or the subset asked for), of a message whose payload is still there. An action's
    delivery that failed at routing (no round sent: its mapping or request could not be
    made for the message) is not: sent again, it would carry no request of its own."""
    statuses = [s for s in (query.statuses or REDRIVABLE) if s in REDRIVABLE]
    # Correlated, so the status index picks the deliveries and each looks up its message by
    # key: an IN list would gather every kept message first.
    kept = (
        select(messages.c.id)
        .where(
            messages.c.id == deliveries.c.message_pk,
            messages.c.body.is_not(None),
            *_message_conditions(query),
        )
        .exists()
    )
    conditions = [
        deliveries.c.status.in_([str(s) for s in statuses]),
        ~and_(
            deliveries.c.status == DeliveryStatus.FAILED.value,
            deliveries.c.attempts == 0,
            or_(*(_last_error.startswith(p, autoescape=True) for p in ROUTING_FAILURES)),
        ),
    ]
    if query.destinations:
        conditions.append(deliveries.c.destination.in_(query.destinations))
    return and_(*conditions, kept)


def _discardable(query: DeliveryQuery) -> ColumnElement[bool]:
    """The pending deliveries to `query`'s destinations, and those waiting in their lanes,
    of a message received in its window; purged messages' too (they would never be sent
    either)."""
    conditions: list[ColumnElement[bool]] = [
        deliveries.c.status.in_([DeliveryStatus.PENDING.value, DeliveryStatus.QUEUED.value]),
        deliveries.c.destination.in_(query.destinations),
    ]
    window = _message_conditions(DeliveryQuery(since=query.since, until=query.until))
    if window:
        conditions.append(
            select(messages.c.id).where(messages.c.id == deliveries.c.message_pk, *window).exists()
        )
    return and_(*conditions)


class Operations(Protocol):
    """What operators ask of the store (the admin API, the CLI)."""

    def message(self, source: str, message_id: str) -> MessageRecord | None: ...

    def deliveries(
        self, query: DeliveryQuery, *, limit: int, before: int | None = None
    ) -> list[DeliveryRecord]: ...

    def redrivable_ids(self, query: DeliveryQuery) -> Sequence[int]: ...

    def count_redrivable(self, query: DeliveryQuery) -> int: ...

    def count_discardable(self, query: DeliveryQuery) -> int: ...

    def blocked_lanes(self) -> dict[str, BlockedLanes]: ...

    def discard(self, query: DeliveryQuery, now: float, limit: int) -> int: ...

    def redrive(self, query: DeliveryQuery, now: float, chunk: int | None = None) -> int: ...

    def redrive_ids(self, query: DeliveryQuery, ids: Sequence[int], now: float) -> int: ...

    def replay_sources(
        self, source: str, message_id: str
    ) -> tuple[int, bool, dict[str, int]] | None: ...

    def replay(
        self, message_pk: int, targets: Sequence[tuple[int, str]], now: float
    ) -> list[tuple[int, str]] | None: ...


class OperationsStore:
    """Owns what operators read and do by hand: a message's story, delivery listings,
    redrive, discard and replay. Never claims or records (the dispatcher's queue) and
    never deletes rows (retention)."""

    def __init__(self, store: Store) -> None:
        self._db = store.database
        self._backend = store.backend

    # -- reads -------------------------------------------------------------------------------

    def message(self, source: str, message_id: str) -> MessageRecord | None:
        """The newest stored message with this source and messageId (one sent again after
        the 24-hour deduplication window is stored again), with its deliveries and
        attempts; None when there is none."""
        with self._db.read() as conn:
            pk = self._message_pk(conn, source, message_id)
            if pk is None:
                return None
            row = conn.execute(
                select(
                    messages.c.id,
                    messages.c.source,
                    messages.c.message_id,
                    messages.c.type,
                    messages.c.user_id,
                    messages.c.anonymous_id,
                    messages.c.event,
                    messages.c.received_at,
                    messages.c.body,
                ).where(messages.c.id == pk)
            ).one()
            found = [
                _delivery(r)
                for r in conn.execute(
                    select(*_DELIVERY_COLUMNS)
                    .select_from(
                        deliveries.join(messages, messages.c.id == deliveries.c.message_pk)
                    )
                    .where(deliveries.c.message_pk == pk)
                    .order_by(deliveries.c.id)
                )
            ]
            by_delivery: dict[int, list[AttemptRecord]] = {d.id: [] for d in found}
            if found:
                for delivery_id, *fields in conn.execute(
                    select(
                        attempts.c.delivery_id,
                        attempts.c.attempted_at,
                        attempts.c.hook_url,
                        attempts.c.outcome,
                        attempts.c.status_code,
                        attempts.c.error_class,
                        attempts.c.error,
                        attempts.c.duration_ms,
                        attempts.c.response_head,
                    )
                    .where(attempts.c.delivery_id.in_(list(by_delivery)))
                    .order_by(attempts.c.attempted_at, attempts.c.id)
                ):
                    by_delivery[delivery_id].append(AttemptRecord(*fields))
            queued = [d.id for d in found if d.status == DeliveryStatus.QUEUED.value]
            waiting = lanes.waiting_for(conn, queued) if queued else {}
        return MessageRecord(
            *row,
            deliveries=tuple(found),
            attempts={k: tuple(v) for k, v in by_delivery.items()},
            waiting_for=waiting,
        )

    @staticmethod
    def _message_pk(conn: Connection, source: str, message_id: str) -> int | None:
        pk = conn.execute(
            select(func.max(messages.c.id)).where(
                messages.c.message_key == message_key(source, message_id),
                messages.c.source == source,
                messages.c.message_id == message_id,
            )
        ).scalar()
        return None if pk is None else int(pk)

    def deliveries(
        self, query: DeliveryQuery, *, limit: int, before: int | None = None
    ) -> list[DeliveryRecord]:
        """Up to `limit` deliveries matching `query`, newest first; `before`: only those
        older than that delivery id (the previous page's last)."""
        conditions = [*_delivery_conditions(query), *_message_conditions(query)]
        if before is not None:
            conditions.append(deliveries.c.id < before)
        statement = (
            select(*_DELIVERY_COLUMNS)
            .select_from(deliveries.join(messages, messages.c.id == deliveries.c.message_pk))
            .where(*conditions)
            .order_by(deliveries.c.id.desc())
            .limit(limit)
        )
        with self._db.read() as conn:
            return [_delivery(r) for r in conn.execute(statement)]

    def redrivable_ids(self, query: DeliveryQuery) -> Sequence[int]:
        """The ids of the deliveries `redrive(query)` would move now, in order (compact:
        a redrive may cover millions)."""
        with self._db.read() as conn:
            return array(
                "q",
                conn.execute(
                    select(deliveries.c.id).where(_redrivable(query)).order_by(deliveries.c.id)
                ).scalars(),
            )

    def count_redrivable(self, query: DeliveryQuery) -> int:
        """How many deliveries `redrive(query)` would move now (a dry run)."""
        with self._db.read() as conn:
            return int(
                conn.execute(
                    select(func.count()).select_from(deliveries).where(_redrivable(query))
                ).scalar_one()
            )

    def count_discardable(self, query: DeliveryQuery) -> int:
        """How many deliveries `discard(query, …)` would mark now (a dry run)."""
        with self._db.read() as conn:
            return int(
                conn.execute(
                    select(func.count()).select_from(deliveries).where(_discardable(query))
                ).scalar_one()
            )

    # -- writes ------------------------------------------------------------------------------

    def discard(self, query: DeliveryQuery, now: float, limit: int) -> int:
        """Mark up to `limit` of the pending deliveries matching `query` (to destinations no
        longer configured) `discarded`, finished now: their rows and attempts stay for
        audit until retention purges them like any finished delivery. A round still in
        flight cannot overwrite them: outcomes are recorded only on pending rows. Returns
        how many were marked; the caller repeats until fewer than `limit`, so the writer
        is never held for long."""
        chosen = select(deliveries.c.id).where(_discardable(query)).limit(limit)
        with self._db.write() as conn:
            marked = conn.execute(
                update(deliveries)
                .where(deliveries.c.id.in_(chosen.scalar_subquery()))
                .values(
                    status=DeliveryStatus.DISCARDED.value,
                    finished_at=now,
                    next_attempt_at=None,
                    lease_owner=None,
                    last_error="discarded by an operator: the destination is not configured",
                )
            ).rowcount
            if marked:
                for name in query.destinations:
                    lanes.advance(conn, self._backend, now, destination=name)
            return int(marked)

    def blocked_lanes(self) -> dict[str, BlockedLanes]:
        """Per destination with lanes: its blocked lanes (efd/store/lanes.py)."""
        with self._db.read() as conn:
            return lanes.blocked(conn)

    def redrive(self, query: DeliveryQuery, now: float, chunk: int | None = None) -> int:
        """Move the failed or expired deliveries matching `query` back to pending with a
        fresh start: due now, the retry window and the backoff counted from now. Their rows
        and attempts stay. Deliveries whose message a deletion request purged are left as
        they are. `chunk` (REDRIVE_CHUNK by default) at a time, each in its own transaction.
        Returns how many moved."""
        size = chunk or REDRIVE_CHUNK
        ids = self.redrivable_ids(query)
        return sum(
            self.redrive_ids(query, ids[start : start + size], now)
            for start in range(0, len(ids), size)
        )

    def redrive_ids(self, query: DeliveryQuery, ids: Sequence[int], now: float) -> int:
        """One chunk of a redrive: those of `ids` that a redrive of `query` still moves
        (one may have been redriven or purged since they were read), in one transaction.
        A delivery of a lane goes back into it: the head if the lane is idle, else waiting,
        ahead of the later messages that wait (lanes go lowest id first). Returns how many
        moved."""
        unordered = deliveries.c.lane.is_(None)
        with self._db.write() as conn:
            moved = conn.execute(
                update(deliveries)
                .where(deliveries.c.id.in_(list(ids)), _redrivable(query))
                .values(
                    status=case(
                        (unordered, DeliveryStatus.PENDING.value),
                        else_=DeliveryStatus.QUEUED.value,
                    ),
                    attempts=0,
                    first_attempt_at=now,
                    next_attempt_at=case((unordered, now), else_=None),
                    finished_at=None,
                    failed_hooks=None,
                    lease_owner=None,
                )
            ).rowcount
            if moved:
                lanes.admit(conn, self._backend, now, ids=ids)
                self._notify(conn)
            return int(moved)

    def replay_sources(
        self, source: str, message_id: str
    ) -> tuple[int, bool, dict[str, int]] | None:
        """For a replay of the newest such message: (its pk, whether its payload is still
        there, {destination: its first delivery there that is not itself a replay}), or None
        when no such message is stored."""
        with self._db.read() as conn:
            pk = self._message_pk(conn, source, message_id)
            if pk is None:
                return None
            kept = conn.execute(
                select(messages.c.body.is_not(None)).where(messages.c.id == pk)
            ).scalar_one()
            originals: dict[str, int] = {}
            for delivery_id, destination in conn.execute(
                select(deliveries.c.id, deliveries.c.destination)
                .where(deliveries.c.message_pk == pk, deliveries.c.replay_of.is_(None))
                .order_by(deliveries.c.id)
            ):
                originals.setdefault(destination, delivery_id)
        return pk, bool(kept), originals

    def replay(
        self, message_pk: int, targets: Sequence[tuple[int, str]], now: float
    ) -> list[tuple[int, str]] | None:
        """New deliveries of the message, one per (original delivery id, destination);
        returns their (id, destination). Each repeats what routing made of its original:
        pending and due now with the same body, or, where the destination's filters stopped
        the message, `filtered` again (docs/filters.md). None when the message is no longer
        stored (retention purged it since it was looked up)."""
        created: list[tuple[int, str]] = []
        with self._db.write() as conn:
            # Shared lock: retention, which locks a message before it looks at its
            # deliveries, either purged it already or waits and then sees the replay.
            present = conn.execute(
                select(messages.c.id).where(messages.c.id == message_pk).with_for_update(read=True)
            ).first()
            if present is None:
                return None
            for original, destination in targets:
                kept = conn.execute(
                    select(
                        deliveries.c.status,
                        deliveries.c.last_error,
                        deliveries.c.body,
                        deliveries.c.url,
                        deliveries.c.attempts,
                    ).where(deliveries.c.id == original)
                ).first()
                again = _routed_unsent(kept)
                new_id = conn.execute(
                    insert(deliveries)
                    .values(
                        message_pk=message_pk,
                        destination=destination,
                        status=(again or DeliveryStatus.PENDING).value,
                        attempts=0,
                        created_at=now,
                        next_attempt_at=None if again else now,
                        finished_at=now if again else None,
                        last_error=kept.last_error if again and kept is not None else None,
                        lease_token=0,
                        replay_of=original,
                        body=None if kept is None else kept.body,
                        url=None if kept is None else kept.url,
                    )
                    .returning(deliveries.c.id)
                ).scalar_one()
                created.append((int(new_id), destination))
            if created:
                self._notify(conn)
        return created

    def _notify(self, conn: Connection) -> None:
        """Wake every daemon's dispatcher at commit, where the backend notifies; elsewhere
        the daemon finds the work at its next poll, or is woken by the caller."""
        self._backend.notify(conn)
