"""Ordered delivery's statements: lanes admitted, advanced, expired, shown.

A lane (one user of an ordered destination) has at most one delivery that may be claimed:
its head, named in the `lanes` table, with status `pending`. The others wait as `queued`,
never claimed, and become the head one at a time, lowest id (the order efd acknowledged
them) first. Each function runs in the caller's write transaction, so a lane changes in the
same commit as the deliveries that change it:

- admit: after deliveries joined lanes as `queued` (ingestion, redrive): each lane without
  a head takes its lowest waiting delivery as head, pending and due now.
- advance: after heads got an outcome (recorded, expired, discarded): each such lane takes
  its next waiting delivery as head, due now, or has no row any more (idle).

Where several processes ingest and record at once (a backend with row locks: PostgreSQL),
both paths lock the lane's row before they look at its waiting deliveries (admit upserts it
with ON CONFLICT DO UPDATE, advance selects it FOR UPDATE), in (destination, lane) order, so
per lane they take turns: a delivery that joins a busy lane is committed before its head's
outcome looks for the next, or it finds the lane idle and becomes the head itself. A single
writer gives the same turns without locks.
"""

from __future__ import annotations

from collections.abc import Collection, Sequence
from typing import Any

from sqlalchemy import (
    BindParameter,
    ColumnElement,
    Connection,
    and_,
    bindparam,
    delete,
    func,
    or_,
    select,
    true,
    update,
)
from sqlalchemy.orm import aliased

from efd.records import BlockedLanes, DeliveryStatus
from efd.store.backends import Backend
from efd.store.database import Database
from efd.store.schema import deliveries, lanes, messages

PENDING = DeliveryStatus.PENDING.value
QUEUED = DeliveryStatus.QUEUED.value
_CHUNK = 500  # bound IN lists well below the variable limits

# A lane's waiting deliveries, the next head (lowest id) first, through ix_deliveries_queued.
_waiting = aliased(deliveries, name="waiting")
_NEXT = (
    select(func.min(_waiting.c.id))
    .where(
        _waiting.c.destination == lanes.c.destination,
        _waiting.c.lane == lanes.c.lane,
        _waiting.c.status == QUEUED,
    )
    .scalar_subquery()
)


# `status` behind a function: a condition the status indexes cannot serve, so that a scope
# of a few rows (a message id range, delivery ids) picks the index. Without statistics (a
# database never analyzed) a planner prefers `status = 'queued'` and reads every waiting
# delivery, for each batch ingested.
_IS_QUEUED = func.coalesce(deliveries.c.status, "") == QUEUED


_LO: BindParameter[int] = bindparam("a_lo")
_HI: BindParameter[int] = bindparam("a_hi")
_NOW: BindParameter[float] = bindparam("a_now")
_IDS: BindParameter[list[int]] = bindparam("a_ids", expanding=True)
# The scopes admit() looks at: the deliveries of a range of messages (ingestion), or
# deliveries by id (redrive, and the heads advance() chose).
_SCOPES: dict[str, ColumnElement[bool]] = {
    "messages": deliveries.c.message_pk.between(_LO, _HI),
    "ids": deliveries.c.id.in_(_IDS),
}


def _promote_statement(scope: ColumnElement[bool]) -> Any:
    """Make the queued deliveries in `scope` pending and due now. The retry window of a
    message that waited counts from its receipt (created_at), or from a redrive."""
    return (
        update(deliveries)
        .where(_IS_QUEUED, scope)
        .values(
            status=PENDING,
            next_attempt_at=_NOW,
            first_attempt_at=func.coalesce(deliveries.c.first_attempt_at, deliveries.c.created_at),
            lease_owner=None,
        )
    )


_IS_HEAD = select(lanes.c.head).where(lanes.c.head == deliveries.c.id).exists()
_PROMOTE_HEADS = {k: _promote_statement(and_(v, _IS_HEAD)) for k, v in _SCOPES.items()}
_PROMOTE = _promote_statement(_SCOPES["ids"])
_CHOOSE = {
    k: select(deliveries.c.destination, deliveries.c.lane, func.min(deliveries.c.id))
    .where(v, _IS_QUEUED, deliveries.c.lane.is_not(None))
    .group_by(deliveries.c.destination, deliveries.c.lane)
    .order_by(deliveries.c.destination, deliveries.c.lane)
    for k, v in _SCOPES.items()
}
_admits: dict[tuple[str, str], Any] = {}  # built once per backend and scope


def _admit_statement(backend: Backend, scope: str) -> Any:
    key = (backend.name, scope)
    if key not in _admits:
        upsert = backend.insert(lanes).from_select(["destination", "lane", "head"], _CHOOSE[scope])
        keys = ["destination", "lane"]
        _admits[key] = (
            upsert.on_conflict_do_update(index_elements=keys, set_={"head": lanes.c.head})
            if backend.row_locks
            else upsert.on_conflict_do_nothing(index_elements=keys)
        )
    return _admits[key]


def admit(
    conn: Connection,
    backend: Backend,
    now: float,
    *,
    messages: tuple[int, int] | None = None,
    ids: Sequence[int] | None = None,
) -> int:
    """Give each lane of the queued deliveries of `messages` (a range of message ids) or
    with these delivery `ids` that has no head its lowest waiting delivery as head, pending
    and due now; return how many became heads.

    A lane that has a head keeps it. Where rows lock (several processes write), its row is
    locked until commit by a no-op update, so its head's outcome cannot look for the next
    head before these deliveries are visible; a single writer needs no lock and skips the
    write."""
    params: dict[str, Any]
    if messages is not None:
        scope, params = "messages", {"a_lo": messages[0], "a_hi": messages[1], "a_now": now}
    else:
        scope, params = "ids", {"a_ids": list(ids or ()), "a_now": now}
    conn.execute(_admit_statement(backend, scope), params)
    return int(conn.execute(_PROMOTE_HEADS[scope], params).rowcount)


def advance(
    conn: Connection,
    backend: Backend,
    now: float,
    *,
    heads: Sequence[int] | None = None,
    destination: str | None = None,
    every: bool = False,
) -> int:
    """Move on each lane whose head has an outcome (is no longer pending, or is gone):
    among `heads` (delivery ids), every lane of `destination`, or `every` lane. Its lowest
    waiting delivery becomes the head, pending and due now, and every process is woken; a
    lane with none waiting is dropped (idle). Returns how many deliveries became heads.
    Where rows lock, the lanes' rows are locked before their waiting deliveries are read."""
    head = aliased(deliveries, name="head")
    finished = or_(head.c.id.is_(None), head.c.status != PENDING)
    scopes: list[ColumnElement[bool]] = []
    if heads is not None:
        scopes += [
            lanes.c.head.in_(list(heads[i : i + _CHUNK])) for i in range(0, len(heads), _CHUNK)
        ]
    if destination is not None:
        scopes.append(lanes.c.destination == destination)
    if every:
        scopes.append(true())
    promoted = 0
    done = lanes.outerjoin(head, head.c.id == lanes.c.head)
    for scope in scopes:
        if backend.row_locks:
            # Locked first, read after: the next statement's snapshot sees every delivery
            # that joined the lane while another transaction held its row.
            locked = (
                conn.execute(
                    select(lanes.c.head)
                    .select_from(done)
                    .where(scope, finished)
                    .order_by(lanes.c.destination, lanes.c.lane)
                    .with_for_update(of=lanes)
                )
                .scalars()
                .all()
            )
            if not locked:
                continue
            query = select(lanes.c.head, _NEXT).where(lanes.c.head.in_(locked))
        else:
            query = select(lanes.c.head, _NEXT).select_from(done).where(scope, finished)
        moves = conn.execute(query).all()
        following = [(old, new) for old, new in moves if new is not None]
        idle = [old for old, new in moves if new is None]
        if idle:
            conn.execute(delete(lanes).where(lanes.c.head.in_(idle)))
        if following:
            conn.execute(
                update(lanes)
                .where(lanes.c.head == bindparam("l_old"))
                .values(head=bindparam("l_new")),
                [{"l_old": old, "l_new": new} for old, new in following],
            )
            params = {"a_ids": [n for _, n in following], "a_now": now}
            promoted += int(conn.execute(_PROMOTE, params).rowcount)
    if promoted:
        backend.notify(conn)
    return promoted


def expire_waiting(conn: Connection, destination: str, window: float, now: float) -> int:
    """Expire the destination's queued deliveries whose retry window (from receipt, or from
    a redrive) closed while they waited behind their lane's head. No lane moves: a queued
    delivery is never a head."""
    return int(
        conn.execute(
            update(deliveries)
            .where(
                deliveries.c.destination == destination,
                deliveries.c.status == QUEUED,
                # A batch's members share its outcome: its own window decides.
                deliveries.c.batch_id.is_(None),
                func.coalesce(deliveries.c.first_attempt_at, deliveries.c.created_at)
                <= now - window,
            )
            .values(
                status=DeliveryStatus.EXPIRED.value,
                finished_at=now,
                next_attempt_at=None,
                last_error="retry window closed while waiting behind an earlier message "
                "of its lane",
            )
        ).rowcount
    )


def dissolve(conn: Connection, ordered: Collection[str], now: float) -> int:
    """Drop the lanes of every destination not in `ordered` (its ordering was turned off):
    their waiting deliveries become pending and due now, each on its own. Returns how many."""
    keep = list(ordered)
    released = conn.execute(
        update(deliveries)
        .where(deliveries.c.status == QUEUED, deliveries.c.destination.not_in(keep))
        .values(status=PENDING, next_attempt_at=now)
    ).rowcount
    conn.execute(delete(lanes).where(lanes.c.destination.not_in(keep)))
    return int(released)


def blocked(conn: Connection) -> dict[str, BlockedLanes]:
    """Per destination with lanes: those whose head failed at least once and has no outcome
    yet, how many, and the one blocked longest (its messageId, its first attempt)."""
    head = deliveries
    is_blocked = and_(head.c.status == PENDING, head.c.attempts > 0)
    joined = lanes.join(head, head.c.id == lanes.c.head)
    counts = conn.execute(
        select(lanes.c.destination, func.count())
        .select_from(joined)
        .where(is_blocked)
        .group_by(lanes.c.destination)
    ).all()
    result: dict[str, BlockedLanes] = {}
    for destination, count in counts:
        oldest = conn.execute(
            select(messages.c.message_id, head.c.first_attempt_at)
            .select_from(joined.join(messages, messages.c.id == head.c.message_pk))
            .where(lanes.c.destination == destination, is_blocked)
            .order_by(head.c.first_attempt_at, head.c.id)
            .limit(1)
        ).first()
        result[destination] = BlockedLanes(
            count=int(count),
            oldest_message_id=None if oldest is None else oldest[0],
            oldest_since=None if oldest is None else oldest[1],
        )
    return result


def waiting_for(conn: Connection, delivery_ids: Sequence[int]) -> dict[int, str | None]:
    """For each of these deliveries that is queued: the messageId of its lane's head (None
    when its lane has no head yet)."""
    if not delivery_ids:
        return {}
    head = aliased(deliveries, name="head")
    rows = conn.execute(
        select(deliveries.c.id, messages.c.message_id)
        .select_from(
            deliveries.outerjoin(
                lanes,
                and_(
                    lanes.c.destination == deliveries.c.destination,
                    lanes.c.lane == deliveries.c.lane,
                ),
            )
            .outerjoin(head, head.c.id == lanes.c.head)
            .outerjoin(messages, messages.c.id == head.c.message_pk)
        )
        .where(deliveries.c.id.in_(list(delivery_ids)), deliveries.c.status == QUEUED)
    ).all()
    return {int(delivery_id): message_id for delivery_id, message_id in rows}


class LanesStore:
    """What the daemon, the operators and housekeeping ask of lanes outside the queue's own
    transactions: blocked lanes, what a waiting delivery waits for, lanes of destinations no
    longer ordered dropped, and the periodic tending (expiry of waiting deliveries, lanes
    whose head finished outside a recorded outcome moved on). It owns the `lanes` table;
    of `deliveries` it changes only the status of queued rows and of heads it expires."""

    def __init__(self, database: Database) -> None:
        self._db = database
        self._backend = database.backend

    def blocked(self) -> dict[str, BlockedLanes]:
        with self._db.read() as conn:
            return blocked(conn)

    def waiting_for(self, delivery_ids: Sequence[int]) -> dict[int, str | None]:
        with self._db.read() as conn:
            return waiting_for(conn, delivery_ids)

    def dissolve(self, ordered: Collection[str], now: float) -> int:
        with self._db.write() as conn:
            released = dissolve(conn, ordered, now)
            if released:
                self._backend.notify(conn)
            return released

    def tend(
        self, destinations: Collection[str], window: float, now: float
    ) -> tuple[dict[str, int], int]:
        """Expire the waiting deliveries of `destinations` whose window closed, and move on
        every lane whose head has an outcome; returns ({destination: expired}, promoted)."""
        with self._db.write() as conn:
            expired = {name: expire_waiting(conn, name, window, now) for name in destinations}
            promoted = advance(conn, self._backend, now, every=True)
            return expired, promoted
