"""Batched delivery's statements (docs/actions.md#batches): a route's deliveries waiting for a
batch read, batches formed and recorded with their members, claimed under a fenced lease,
their outcomes copied to every member, split after a 413. Synchronous; callers run it in
threads (efd/store/runner.py).

A delivery is in at most one batch at a time. Forming sets its batch_id by an UPDATE guarded
by `batch_id IS NULL` in the transaction that inserts the batch, and a formation that changes
fewer rows than it has members rolls back whole; only a split changes batch_id again, guarded
by the old batch's id and fenced by its lease token. Where several processes share the
database (row locks: PostgreSQL) forming locks the route's `batch_routes` row first, so one
daemon at a time forms a route's batches; a single writer gives the same turns without it.

A batch's members are never claimed on their own: the batch is, and its outcome is copied to
them in the transaction that records it, only where the batch's row changed (the fence).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Collection, Sequence
from dataclasses import dataclass
from typing import Any

from sqlalchemy import (
    ColumnElement,
    Connection,
    and_,
    bindparam,
    func,
    insert,
    literal_column,
    or_,
    select,
    update,
)

from efd.records import AttemptRecord, AttemptRow, ClaimRequest, DeliveryStatus
from efd.store import lanes
from efd.store.backends.base import ATTEMPT_COLUMNS, chunked
from efd.store.database import Database

# A claim's token buckets, as efd/store/ratelimit.py reads and takes them in the claim's
# transaction: batches count requests against a hook's limit as deliveries do.
from efd.store.ratelimit import Buckets
from efd.store.ratelimit import _ClaimTokens as ClaimTokens
from efd.store.schema import attempts, batch_routes, batches, deliveries, messages
from efd.store.schema import lanes as lane_rows
from efd.store.statements import release_leases
from efd.store.steps import StepsSource, no_steps

PENDING = DeliveryStatus.PENDING.value
QUEUED = DeliveryStatus.QUEUED.value
OPEN = (PENDING, QUEUED)
# A batch answered 413 and replaced by its two halves: it has no members any more.
SPLIT = "split"
FINISHED = (
    DeliveryStatus.DELIVERED.value,
    DeliveryStatus.FAILED.value,
    DeliveryStatus.EXPIRED.value,
)


@dataclass(frozen=True, slots=True)
class Waiting:
    """A delivery of a batched route not in any batch, as forming reads it: its stored body
    (its own, else its message's; None once a deletion request purged it), its rendered URL,
    its lane, since when it waits (accepted, or redriven), and its message's row, which its
    own webhook-id is derived from (efd.segment.webhooks.webhook_id)."""

    delivery_id: int
    body: str | None
    url: str | None
    lane: str | None
    since: float
    message_pk: int
    message_id: str
    source: str
    received_at: float
    status: str = PENDING


@dataclass(frozen=True, slots=True)
class Candidates:
    """What forming decides from: the waiting deliveries in the order efd accepted them, and
    the lanes with a delivery in a batch that has no outcome yet (`busy`). `allowed`: the
    most batches the hook's rate limits allow now (None: no limit)."""

    waiting: tuple[Waiting, ...]
    busy: frozenset[str]
    allowed: int | None = None


@dataclass(frozen=True, slots=True)
class NewBatch:
    """A batch to record: its members (delivery ids, in the order of its body, which is the
    order efd accepted them: ascending), its exact body and its webhook-id
    (efd.delivery.batching's array and webhook_id)."""

    def __post_init__(self) -> None:
        if not self.members or list(self.members) != sorted(self.members):
            raise ValueError("a batch's members are one or more delivery ids, ascending")

    members: tuple[int, ...]
    body: bytes
    webhook_id: str


@dataclass(frozen=True, slots=True)
class LeasedBatch:
    """A recorded batch under this process's lease, with what its next request needs."""

    id: int
    lease_token: int
    route: str
    members: tuple[int, ...]
    body: bytes
    webhook_id: str
    attempts: int
    first_attempt_at: float | None


@dataclass(frozen=True, slots=True)
class Formed:
    """A formation's result: the batches recorded, leased to the caller. `contended`: nothing
    was recorded because another daemon was forming the route, or one of the members joined
    another batch meanwhile; forming again later finds what is left."""

    batches: tuple[LeasedBatch, ...]
    contended: bool = False
    # The fewest tokens any of the hook's rate-limit buckets kept beyond its reserve.
    tokens_left: float = math.inf


@dataclass(frozen=True, slots=True)
class BatchOutcome:
    """The state a batch (and so each of its members) moves to after a request, fenced by
    the claim's token. `status` is a DeliveryStatus' value: pending (a retry at
    `next_attempt_at`), delivered, failed or expired."""

    batch_id: int
    lease_token: int
    status: str
    attempts: int
    first_attempt_at: float
    next_attempt_at: float | None
    finished_at: float | None
    last_error: str | None


@dataclass(frozen=True, slots=True)
class BatchAttempt:
    """One request of a batch, for the attempts log: `row.delivery_id` is its first member."""

    batch_id: int
    row: AttemptRow


@dataclass(frozen=True, slots=True)
class Carried:
    """The batch a delivery is in, as operators see it (efd inspect): its id, webhook-id,
    state, how many events it carries, and its requests (attempt rows, oldest first)."""

    batch_id: int
    webhook_id: str
    status: str
    size: int
    attempts: tuple[AttemptRecord, ...]


_RECORD_COLUMNS = (
    "attempted_at",
    "hook_url",
    "outcome",
    "status_code",
    "error_class",
    "error",
    "duration_ms",
    "response_head",
)


class _Lost(Exception):
    """A guarded UPDATE changed fewer rows than it must: the transaction rolls back."""


_CLAIMED = (
    batches.c.id,
    batches.c.lease_token,
    batches.c.route,
    batches.c.body,
    batches.c.webhook_id,
    batches.c.attempts,
    batches.c.first_attempt_at,
)


def _claim_statement(among: Callable[[Any, Any], Any]) -> Any:
    """The claim of due batches, as efd/store/queue.py claims deliveries."""
    due = (
        select(batches.c.id)
        .where(
            batches.c.route == bindparam("c_route"),
            # A literal: a plan cached for any parameters can use the partial due index.
            batches.c.status == literal_column(f"'{PENDING}'"),
            batches.c.next_attempt_at <= bindparam("c_due_by"),
            or_(batches.c.lease_owner.is_(None), batches.c.next_attempt_at < bindparam("c_lapsed")),
        )
        .order_by(batches.c.next_attempt_at)
        .limit(bindparam("c_limit"))
        .with_for_update(skip_locked=True)
        .scalar_subquery()
    )
    return (
        update(batches)
        .where(among(batches.c.id, due))
        .values(
            lease_owner=bindparam("c_owner"),
            next_attempt_at=bindparam("c_until"),
            lease_token=batches.c.lease_token + 1,
        )
        .returning(*_CLAIMED)
    )


class BatchesStore:
    """Owns the batches and batch_routes tables, deliveries.batch_id and attempts.batch_id;
    of the deliveries of batched routes it changes the state only as their batch's outcome
    (or split) says. Retention deletes a batch with its last member (efd/store/retention.py)."""

    def __init__(self, database: Database, steps: StepsSource = no_steps) -> None:
        self._db = database
        self._backend = database.backend
        self._steps = steps  # efd/store/steps.py: whether a route is ordered
        self._claim = _claim_statement(self._backend.among)
        self._routes: set[str] = set()  # routes whose batch_routes row exists

    # -- forming ----------------------------------------------------------------------------

    def candidates(self, route: str, *, ordered: bool, limit: int) -> Candidates:
        """The route's deliveries waiting for a batch (at most `limit`) and its busy lanes."""
        with self._db.read() as conn:
            return _candidates(conn, route, ordered=ordered, limit=limit)

    def form(
        self,
        route: str,
        plan: Callable[[Candidates], Sequence[NewBatch]],
        *,
        ordered: bool,
        limit: int,
        owner: str,
        now: float,
        lease_until: float,
        buckets: Buckets = (),
    ) -> Formed:
        """Read the route's candidates, let `plan` (efd.delivery.batching.form and the
        bodies it makes) choose the batches, and record them in the same transaction, each
        leased to `owner` until `lease_until` (token 1) with its members' batch_id set.
        `buckets`: the hook's rate limits (efd/store/ratelimit.py): the plan is told how
        many batches they allow, and a token is taken from each per batch recorded.

        A member no longer waiting (in another batch, finished) rolls the whole formation
        back; so does another daemon forming the route at the same time (it holds the
        route's row): either way `contended` and nothing recorded."""
        if self._backend.row_locks and route not in self._routes:
            # Committed on its own: a row inserted in the forming transaction would make
            # another daemon's insert wait for that transaction instead of skipping it.
            with self._db.write() as conn:
                conn.execute(
                    self._backend.insert(batch_routes)
                    .values(route=route)
                    .on_conflict_do_nothing(index_elements=["route"])
                )
            self._routes.add(route)
        try:
            with self._db.write() as conn:
                if self._backend.row_locks and not _lock_route(conn, route):
                    # Held by another daemon (or its row is gone: made again next time).
                    self._routes.discard(route)
                    return Formed((), contended=True)
                tokens = ClaimTokens(self._backend.clock, buckets, now) if buckets else None
                allowed = None
                if tokens is not None:
                    allowed = tokens.available(conn, limit)
                    if not allowed:
                        return Formed((), tokens_left=tokens.left)
                found = _candidates(conn, route, ordered=ordered, limit=limit)
                if allowed is not None:
                    found = Candidates(found.waiting, found.busy, allowed)
                chosen = list(plan(found))
                if allowed is not None and len(chosen) > allowed:
                    raise ValueError("the plan chose more batches than the rate limits allow")
                left = math.inf
                if tokens is not None:
                    tokens.take(conn, len(chosen))
                    left = tokens.left
                if not chosen:
                    return Formed((), tokens_left=left)
                if ordered and self._backend.row_locks:
                    _lock_lanes(conn, route, found, chosen)
                formed = tuple(
                    _record(conn, route, new, owner=owner, now=now, lease_until=lease_until)
                    for new in chosen
                )
                return Formed(formed, tokens_left=left)
        except _Lost:
            return Formed((), contended=True)

    # -- claims and leases --------------------------------------------------------------------

    def claim_limited(
        self, request: ClaimRequest, buckets: Buckets
    ) -> tuple[list[LeasedBatch], float]:
        """`claim` under the hook's rate limits, in the same transaction: at most as many
        batches as every bucket has tokens for, one token each (a request). Returns the
        claimed and the fewest tokens any bucket kept beyond its reserve."""
        tokens = ClaimTokens(self._backend.clock, buckets, request.now)
        return self.claim(request, tokens=tokens), tokens.left

    def claim(
        self, request: ClaimRequest, *, tokens: ClaimTokens | None = None
    ) -> list[LeasedBatch]:
        """Lease the batches of `request.destination` (the route) that are due, oldest first,
        as efd/store/queue.py leases deliveries: the lease moves next_attempt_at to
        `lease_until` and bumps the fencing token; FOR UPDATE SKIP LOCKED keeps concurrent
        claimers off each other's rows. Each comes with its members, in its body's order."""
        params = {
            "c_route": request.destination,
            "c_due_by": request.due,
            "c_limit": request.limit,
            "c_lapsed": request.lapsed,
            "c_owner": request.owner,
            "c_until": request.lease_until,
        }
        with self._db.bookkeeping() as conn:
            if tokens is not None:
                params["c_limit"] = tokens.available(conn, request.limit)
                if not params["c_limit"]:
                    return []
            rows = conn.execute(self._claim, params).all()
            if tokens is not None:
                tokens.take(conn, len(rows))
            members = _members(conn, [row.id for row in rows])
        claimed = [
            LeasedBatch(
                id=row.id,
                lease_token=row.lease_token,
                route=row.route,
                members=members.get(row.id, ()),
                body=row.body.encode("utf-8", "surrogatepass"),
                webhook_id=row.webhook_id,
                attempts=row.attempts,
                first_attempt_at=row.first_attempt_at,
            )
            for row in rows
        ]
        claimed.sort(key=lambda b: b.id)
        return claimed

    def renew(self, leases: Sequence[tuple[int, int]], until: float) -> list[int]:
        """Extend the leases (batch id, token) to `until` where the token still matches and
        the batch is pending; return the ids of the others."""
        if not leases:
            return []
        with self._db.bookkeeping() as conn:
            kept = [
                pk
                for pk, token in leases
                if conn.execute(
                    update(batches)
                    .where(
                        batches.c.id == pk,
                        batches.c.lease_token == token,
                        batches.c.status == PENDING,
                    )
                    .values(next_attempt_at=until)
                ).rowcount
            ]
        return [pk for pk, _ in leases if pk not in kept]

    def release(self, leases: Sequence[tuple[int, int]], now: float) -> None:
        """Give back claimed batches that were never sent (shutdown): due again now."""
        if leases:
            with self._db.write() as conn:
                release_leases(conn, batches, leases, now)

    def dissolve(self, batch_id: int, lease_token: int, now: float, error: str) -> bool:
        """End a leased batch unsent, as failed with `error`, and take its open members out
        of it, to be formed again: some of its events were finished by hand (discarded), so
        it no longer carries what it should. Fenced by the token; False when stale."""
        with self._db.bookkeeping() as conn:
            ended = conn.execute(
                update(batches)
                .where(
                    batches.c.id == batch_id,
                    batches.c.lease_token == lease_token,
                    batches.c.status == PENDING,
                )
                .values(
                    status=DeliveryStatus.FAILED.value,
                    finished_at=now,
                    next_attempt_at=None,
                    lease_owner=None,
                    last_error=error,
                )
            ).rowcount
            if not ended:
                return False
            conn.execute(
                update(deliveries)
                .where(deliveries.c.batch_id == batch_id, deliveries.c.status.in_(list(OPEN)))
                .values(batch_id=None)
            )
            return True

    def free_redriven(self, route: str) -> int:
        """Take out of their batch the route's open deliveries whose batch has an outcome:
        an operator redrove them (efd/store/operations.py), and they are formed again into
        new batches. Returns how many. Reads the route's open deliveries, as forming does."""
        finished = (
            select(batches.c.id)
            .where(batches.c.id == deliveries.c.batch_id, batches.c.status != PENDING)
            .exists()
        )
        statuses: list[Any] = [literal_column(f"'{s}'") for s in OPEN]
        with self._db.write() as conn:
            return int(
                conn.execute(
                    update(deliveries)
                    .where(
                        deliveries.c.destination == route,
                        deliveries.c.status.in_(statuses),
                        deliveries.c.batch_id.is_not(None),
                        finished,
                    )
                    .values(batch_id=None)
                ).rowcount
            )

    def routes_pending(self) -> set[str]:
        """The routes with a batch that has no outcome yet (the due index holds them)."""
        with self._db.read() as conn:
            return set(
                conn.execute(
                    select(batches.c.route)
                    .where(batches.c.status == literal_column(f"'{PENDING}'"))
                    .distinct()
                ).scalars()
            )

    def release_all_leases(self, now: float) -> int:
        """Make every leased batch due now: only where no other process runs (SQLite)."""
        with self._db.write() as conn:
            return int(
                conn.execute(
                    update(batches)
                    .where(batches.c.status == PENDING, batches.c.lease_owner.is_not(None))
                    .values(next_attempt_at=now, lease_owner=None)
                ).rowcount
            )

    # -- outcomes -----------------------------------------------------------------------------

    def record(self, outcomes: Sequence[BatchOutcome], tried: Sequence[BatchAttempt]) -> int:
        """Write the requests' attempt rows and the batches' new states, each copied to every
        member of its batch in the same transaction; return how many outcomes were stale.

        An outcome whose token no longer matches (the lease lapsed and another daemon claimed
        the batch) changes neither the batch nor its members; its attempts are still logged,
        since the requests did happen. The heads among finished members hand their lanes on."""
        with self._db.bookkeeping() as conn:
            _insert_attempts(conn, tried)
            applied = [o for o in outcomes if _apply(conn, o)]
            self._hand_on(conn, [o.batch_id for o in applied if o.status != PENDING], outcomes)
        return len(outcomes) - len(applied)

    def split(
        self,
        outcome: BatchOutcome,
        halves: tuple[NewBatch, NewBatch],
        tried: Sequence[BatchAttempt],
        *,
        ordered: bool,
        owner: str,
        now: float,
        lease_until: float,
    ) -> tuple[LeasedBatch, ...] | None:
        """Record a 413: the batch ends as `split` (its attempt kept), fenced by its token,
        and its members move to its two halves, new batches leased to `owner` (token 1)
        whose retry window counts from the batch's first attempt. On an ordered route only
        the first half is recorded: the second half's members leave the batch (batch_id NULL)
        and are formed again once the first half has its outcome. Returns the halves
        recorded; None when the outcome was stale (nothing changed but the attempts log).
        The 413's attempt row (in `tried`) is what names the split batch to retention."""
        try:
            with self._db.bookkeeping() as conn:
                _insert_attempts(conn, tried)
                split = BatchOutcome(
                    outcome.batch_id,
                    outcome.lease_token,
                    SPLIT,
                    outcome.attempts,
                    outcome.first_attempt_at,
                    None,
                    outcome.finished_at if outcome.finished_at is not None else now,
                    outcome.last_error,
                )
                route = conn.execute(
                    update(batches)
                    .where(*_fence(split))
                    .values(**_batch_values(split))
                    .returning(batches.c.route)
                ).scalar()
                if route is None:
                    return None
                first, second = halves
                recorded = [
                    _record(
                        conn,
                        route,
                        first,
                        owner=owner,
                        now=now,
                        lease_until=lease_until,
                        moved_from=outcome.batch_id,
                        first_attempt_at=outcome.first_attempt_at,
                    )
                ]
                if ordered:
                    _move(conn, second.members, outcome.batch_id, None)
                else:
                    recorded.append(
                        _record(
                            conn,
                            route,
                            second,
                            owner=owner,
                            now=now,
                            lease_until=lease_until,
                            moved_from=outcome.batch_id,
                            first_attempt_at=outcome.first_attempt_at,
                        )
                    )
                left = conn.execute(
                    select(func.count())
                    .select_from(deliveries)
                    .where(deliveries.c.batch_id == outcome.batch_id)
                ).scalar_one()
                if left:
                    raise _Lost
                return tuple(recorded)
        except _Lost:
            return None

    def fail_unbatched(
        self, route: str, delivery_ids: Sequence[int], now: float, error: str
    ) -> int:
        """Fail these deliveries of the route that are in no batch and not finished (a
        deletion request purged their payload: there is nothing to send), and hand their
        lanes on; return how many."""
        if not delivery_ids:
            return 0
        failed = 0
        with self._db.write() as conn:
            for chunk in chunked(sorted(set(delivery_ids))):
                failed += conn.execute(
                    update(deliveries)
                    .where(
                        deliveries.c.id.in_(list(chunk)),
                        deliveries.c.destination == route,
                        deliveries.c.batch_id.is_(None),
                        deliveries.c.status.in_(list(OPEN)),
                    )
                    .values(
                        status=DeliveryStatus.FAILED.value,
                        finished_at=now,
                        next_attempt_at=None,
                        lease_owner=None,
                        last_error=error,
                    )
                ).rowcount
            if failed and self._steps().ordered:
                lanes.advance(conn, self._backend, now, heads=list(delivery_ids))
        return int(failed)

    def carried(self, delivery_ids: Sequence[int]) -> dict[int, Carried]:
        """Delivery id -> the batch it is in, for those of `delivery_ids` that are in one."""
        found: dict[int, Carried] = {}
        with self._db.read() as conn:
            for chunk in chunked(sorted(set(delivery_ids))):
                rows = conn.execute(
                    select(
                        deliveries.c.id,
                        batches.c.id.label("batch_id"),
                        batches.c.webhook_id,
                        batches.c.status,
                    )
                    .select_from(deliveries.join(batches, batches.c.id == deliveries.c.batch_id))
                    .where(deliveries.c.id.in_(list(chunk)))
                ).all()
                ids = sorted({int(row.batch_id) for row in rows})
                sizes: dict[int, int] = dict(
                    conn.execute(
                        select(deliveries.c.batch_id, func.count())
                        .where(deliveries.c.batch_id.in_(ids))
                        .group_by(deliveries.c.batch_id)
                    ).all()
                )
                tried: dict[int, list[AttemptRecord]] = {}
                for row in conn.execute(
                    select(attempts.c.batch_id, *(attempts.c[c] for c in _RECORD_COLUMNS))
                    .where(attempts.c.batch_id.in_(ids))
                    .order_by(attempts.c.attempted_at, attempts.c.id)
                ).all():
                    values = {c: getattr(row, c) for c in _RECORD_COLUMNS}
                    tried.setdefault(int(row.batch_id), []).append(AttemptRecord(**values))
                for row in rows:
                    pk = int(row.batch_id)
                    found[int(row.id)] = Carried(
                        pk,
                        row.webhook_id,
                        row.status,
                        int(sizes.get(pk, 0)),
                        tuple(tried.get(pk, ())),
                    )
        return found

    def members(self, batch_ids: Sequence[int]) -> dict[int, tuple[Waiting, ...]]:
        """Each batch's members with their bodies, in its body's order (a 413 splits them)."""
        with self._db.read() as conn:
            found: dict[int, list[Waiting]] = {pk: [] for pk in batch_ids}
            for chunk in chunked(sorted(set(batch_ids))):
                rows = conn.execute(
                    _waiting_query()
                    .add_columns(deliveries.c.batch_id)
                    .where(deliveries.c.batch_id.in_(list(chunk)))
                    .order_by(deliveries.c.id)
                ).all()
                for row in rows:
                    found[row.batch_id].append(_waiting(row))
        return {pk: tuple(rows) for pk, rows in found.items()}

    def _hand_on(
        self, conn: Connection, finished: Sequence[int], outcomes: Sequence[BatchOutcome]
    ) -> None:
        """The heads among the finished batches' members hand their lanes on."""
        if not finished or not self._steps().ordered:
            return
        heads = [pk for ids in _members(conn, finished).values() for pk in ids]
        now = max(o.finished_at or o.first_attempt_at for o in outcomes)
        lanes.advance(conn, self._backend, now, heads=heads)


# -- statements ------------------------------------------------------------------------------


def _waiting_query() -> Any:
    return select(
        deliveries.c.id,
        func.coalesce(deliveries.c.body, messages.c.body).label("body"),
        deliveries.c.url,
        deliveries.c.lane,
        func.coalesce(deliveries.c.first_attempt_at, deliveries.c.created_at).label("since"),
        messages.c.id.label("message_pk"),
        messages.c.message_id,
        messages.c.source,
        messages.c.received_at,
        deliveries.c.status,
    ).select_from(deliveries.join(messages, messages.c.id == deliveries.c.message_pk))


def _waiting(row: Any) -> Waiting:
    return Waiting(
        delivery_id=int(row.id),
        body=row.body,
        url=row.url,
        lane=row.lane,
        since=float(row.since),
        message_pk=int(row.message_pk),
        message_id=row.message_id,
        source=row.source,
        received_at=float(row.received_at),
        status=row.status,
    )


def _candidates(conn: Connection, route: str, *, ordered: bool, limit: int) -> Candidates:
    """Pending deliveries not in a batch, and on an ordered route the queued ones too (a
    lane's events after its head may share the head's batch, in their order)."""
    # Literals, not parameters: a plan the server caches for any parameters can then use
    # the partial indexes of pending (and queued) deliveries.
    statuses: list[Any] = [literal_column(f"'{s}'") for s in (OPEN if ordered else (PENDING,))]
    rows = conn.execute(
        _waiting_query()
        .where(
            deliveries.c.destination == route,
            deliveries.c.status.in_(statuses),
            deliveries.c.batch_id.is_(None),
        )
        .order_by(deliveries.c.id)
        .limit(limit)
    ).all()
    busy: frozenset[str] = frozenset()
    if ordered:
        busy = frozenset(
            conn.execute(
                select(deliveries.c.lane)
                .where(
                    deliveries.c.destination == route,
                    deliveries.c.batch_id.is_not(None),
                    deliveries.c.status.in_(list(OPEN)),
                    deliveries.c.lane.is_not(None),
                )
                .distinct()
            ).scalars()
        )
    return Candidates(tuple(_waiting(row) for row in rows), busy)


def _lock_route(conn: Connection, route: str) -> bool:
    """Lock the route's batch_routes row; False when another transaction holds it."""
    held = conn.execute(
        select(batch_routes.c.route)
        .where(batch_routes.c.route == route)
        .with_for_update(skip_locked=True)
    ).first()
    return held is not None


def _lock_lanes(
    conn: Connection, route: str, found: Candidates, chosen: Sequence[NewBatch]
) -> None:
    """Lock the rows of the lanes the batches take, in (destination, lane) order as
    lanes.advance locks them, so ingestion and forming take turns per lane."""
    lane_of = {w.delivery_id: w.lane for w in found.waiting}
    taken = sorted({lane for b in chosen for pk in b.members if (lane := lane_of.get(pk))})
    for chunk in chunked(taken):
        conn.execute(
            select(lane_rows.c.lane)
            .where(lane_rows.c.destination == route, lane_rows.c.lane.in_(list(chunk)))
            .order_by(lane_rows.c.destination, lane_rows.c.lane)
            .with_for_update()
        ).all()


def _record(
    conn: Connection,
    route: str,
    new: NewBatch,
    *,
    owner: str,
    now: float,
    lease_until: float,
    moved_from: int | None = None,
    first_attempt_at: float | None = None,
) -> LeasedBatch:
    """Insert a batch leased to `owner` (token 1, as a hand-over at ingestion leaves a
    delivery) and make its members its own: those not in a batch (forming) or in
    `moved_from` (a split). Fewer members changed than it has: _Lost."""
    body = new.body.decode("utf-8", "surrogatepass")
    pk = conn.execute(
        insert(batches)
        .values(
            route=route,
            body=body,
            webhook_id=new.webhook_id,
            status=PENDING,
            attempts=0,
            created_at=now,
            first_attempt_at=first_attempt_at,
            next_attempt_at=lease_until,
            lease_owner=owner,
            lease_token=1,
        )
        .returning(batches.c.id)
    ).scalar_one()
    _move(conn, new.members, moved_from, int(pk), route=route)
    return LeasedBatch(
        id=int(pk),
        lease_token=1,
        route=route,
        members=new.members,
        body=new.body,
        webhook_id=new.webhook_id,
        attempts=0,
        first_attempt_at=first_attempt_at,
    )


def _move(
    conn: Connection,
    members: Sequence[int],
    old: int | None,
    new: int | None,
    *,
    route: str | None = None,
) -> None:
    """Set these open deliveries' batch_id from `old` (None: not in a batch) to `new`, each
    exactly once: any member that is elsewhere raises _Lost."""
    changed = 0
    for chunk in chunked(list(members)):
        where = [
            deliveries.c.id.in_(list(chunk)),
            deliveries.c.status.in_(list(OPEN)),
            deliveries.c.batch_id.is_(None) if old is None else deliveries.c.batch_id == old,
        ]
        if route is not None:
            where.append(deliveries.c.destination == route)
        changed += conn.execute(update(deliveries).where(*where).values(batch_id=new)).rowcount
    if changed != len(set(members)) or len(set(members)) != len(members):
        raise _Lost


def _members(conn: Connection, batch_ids: Sequence[int]) -> dict[int, tuple[int, ...]]:
    found: dict[int, list[int]] = {}
    for chunk in chunked(sorted(set(batch_ids))):
        rows = conn.execute(
            select(deliveries.c.batch_id, deliveries.c.id)
            .where(deliveries.c.batch_id.in_(list(chunk)))
            .order_by(deliveries.c.id)
        ).all()
        for batch_id, pk in rows:
            found.setdefault(int(batch_id), []).append(int(pk))
    return {pk: tuple(ids) for pk, ids in found.items()}


def _fence(outcome: BatchOutcome) -> tuple[Any, ...]:
    return (
        batches.c.id == outcome.batch_id,
        batches.c.lease_token == outcome.lease_token,
        batches.c.status == PENDING,
    )


def _batch_values(outcome: BatchOutcome) -> dict[str, Any]:
    return {
        "status": outcome.status,
        "attempts": outcome.attempts,
        "first_attempt_at": outcome.first_attempt_at,
        "next_attempt_at": outcome.next_attempt_at,
        "finished_at": outcome.finished_at,
        "last_error": outcome.last_error,
        "lease_owner": None,
    }


def _apply(conn: Connection, outcome: BatchOutcome) -> bool:
    """The outcome on its batch, fenced; copied to every member only where the batch's row
    changed (the UPDATE's row count, the row locked until commit)."""
    if outcome.status not in (PENDING, *FINISHED):
        raise ValueError(f"not a batch's outcome: {outcome.status!r}")
    values = _batch_values(outcome)
    if not conn.execute(update(batches).where(*_fence(outcome)).values(**values)).rowcount:
        return False
    if outcome.status == PENDING:
        # A retry: members queued behind their lane's head stay queued, so a lane keeps
        # one pending delivery, its head, as efd/store/lanes.py has it.
        del values["status"]
    conn.execute(
        update(deliveries)
        .where(deliveries.c.batch_id == outcome.batch_id, deliveries.c.status.in_(list(OPEN)))
        .values(**values)
    )
    return True


def _insert_attempts(conn: Connection, tried: Sequence[BatchAttempt]) -> None:
    if tried:
        conn.execute(
            insert(attempts),
            [
                {"batch_id": t.batch_id, **{c: getattr(t.row, c) for c in ATTEMPT_COLUMNS}}
                for t in tried
            ],
        )


def batch_ids_of(conn: Connection, where: ColumnElement[bool]) -> set[int]:
    """The batches the deliveries `where` selects are in or were sent in: a split batch has
    no members left, but its request's attempt row names its first member, which is in the
    first half. One pass over those deliveries that have a batch."""
    sent = attempts.alias("sent")
    rows = conn.execute(
        select(deliveries.c.batch_id, sent.c.batch_id)
        .select_from(
            deliveries.outerjoin(
                sent, and_(sent.c.delivery_id == deliveries.c.id, sent.c.batch_id.is_not(None))
            )
        )
        # Behind a function, which the partial index of batched deliveries cannot serve:
        # `where` (a step's range of messages) picks the index, not every batched delivery.
        .where(where, func.coalesce(deliveries.c.batch_id, 0) != 0)
        .distinct()
    ).all()
    return {int(pk) for row in rows for pk in row if pk is not None}


def drop_memberless(conn: Connection, batch_ids: Collection[int]) -> int:
    """Delete those of these batches no delivery is in any more, with their attempts
    (retention, once it deleted their last member). Returns how many."""
    ids = sorted(batch_ids)
    if not ids:
        return 0
    kept: set[int] = set()
    for chunk in chunked(ids):
        kept.update(
            int(pk)
            for pk in conn.execute(
                select(deliveries.c.batch_id).where(deliveries.c.batch_id.in_(list(chunk)))
            ).scalars()
        )
    gone = [pk for pk in ids if pk not in kept]
    for chunk in chunked(gone):
        conn.execute(attempts.delete().where(attempts.c.batch_id.in_(list(chunk))))
        conn.execute(batches.delete().where(batches.c.id.in_(list(chunk))))
    return len(gone)
