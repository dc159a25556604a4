"""The delivery queue: deliveries claimed under a fenced lease, their outcomes and attempts
recorded, released, woken and expired. Synchronous; callers run it in threads
(efd/store/runner.py).
"""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from typing import Any, Protocol

from sqlalchemy import Connection, and_, bindparam, func, literal_column, or_, select, update

from efd.records import AttemptRow, Claimed, ClaimRequest, DeliveryStatus, Outcome
from efd.store import lanes
from efd.store.backends.base import chunked
from efd.store.database import Database
from efd.store.schema import deliveries
from efd.store.statements import release_leases
from efd.store.steps import StepsSource, no_steps

PENDING = DeliveryStatus.PENDING
# Not finished: waiting for a round (pending) or behind its lane's head (queued).
OPEN = (PENDING.value, DeliveryStatus.QUEUED.value)


def _claim_statement(among: Callable[[Any, Any], Any]) -> Any:
    """The claim, built once per store with named parameters (the backend may compile it
    once, too); `among` is the backend's `column IN (rows)`."""
    due = (
        select(deliveries.c.id)
        .where(
            deliveries.c.destination == bindparam("c_destination"),
            # A literal, not a parameter: a plan the server caches for any parameters can
            # then use the due index, which holds only pending rows.
            deliveries.c.status == literal_column(f"'{PENDING.value}'"),
            deliveries.c.next_attempt_at <= bindparam("c_due_by"),
            # A row another process holds under a live lease is never taken, even by a
            # claim that reaches past `now` (a circuit's probe); nor, after a database
            # outage, one whose lease lapsed during it (its holder renews it first).
            or_(
                deliveries.c.lease_owner.is_(None),
                deliveries.c.next_attempt_at < bindparam("c_lapsed"),
            ),
            # A batch's member goes with its batch (efd/store/batches.py), never alone.
            deliveries.c.batch_id.is_(None),
        )
        .order_by(deliveries.c.next_attempt_at)
        .limit(bindparam("c_limit"))
        .with_for_update(skip_locked=True)
        .scalar_subquery()
    )
    return (
        update(deliveries)
        .where(among(deliveries.c.id, due))
        .values(
            lease_owner=bindparam("c_owner"),
            next_attempt_at=bindparam("c_until"),
            lease_token=deliveries.c.lease_token + 1,
        )
        .returning(
            deliveries.c.id,
            deliveries.c.lease_token,
            deliveries.c.message_pk,
            deliveries.c.attempts,
            deliveries.c.first_attempt_at,
            deliveries.c.failed_hooks,
            deliveries.c.body,  # a body of its own (field filters: ingestion.py), else NULL
            deliveries.c.url,  # an action's rendered URL, else NULL
        )
    )


# The last_error of a delivery whose message row no longer exists when it is claimed.
MESSAGE_GONE = "its message is no longer stored (deleted before this delivery was sent)"


def _failed_hooks(column: str | None) -> frozenset[str]:
    """deliveries.failed_hooks (a JSON list, or NULL) as a set."""
    return frozenset(json.loads(column)) if column else frozenset()


class Tokens(Protocol):
    """A claim's rate limits (efd/store/ratelimit.py), in the claim's transaction."""

    def available(self, conn: Connection, want: int) -> int:
        """How many of `want` rounds the buckets allow now (their rows locked)."""
        ...

    def take(self, conn: Connection, used: int) -> None:
        """Take `used` tokens from each bucket."""
        ...


class Queue(Protocol):
    """The delivery queue as its consumers see it (the dispatcher through
    efd/store/runner.py's AsyncDeliveries, the daemon at start and for its gauges)."""

    def claim(self, request: ClaimRequest, *, tokens: Tokens | None = None) -> list[Claimed]: ...

    def renew(self, leases: Sequence[tuple[int, int]], until: float) -> list[int]: ...

    def record(self, outcomes: Sequence[Outcome], attempt_rows: Sequence[AttemptRow]) -> int: ...

    def release(self, leases: Sequence[tuple[int, int]], now: float) -> None: ...

    def release_all_leases(self, now: float) -> int: ...

    def wake(self, destination: str, hook: Sequence[str], now: float) -> int: ...

    def expire_waiting(self, destination: str, window: float, now: float) -> int: ...

    def next_due(self, destination: str) -> float | None: ...

    def backlog(self) -> dict[str, int]: ...


class DeliveryQueue:
    """Owns the deliveries' state after ingestion: leases and their fencing tokens, due
    times, outcomes, and the attempt log. Never inserts messages (efd/store/ingestion.py)
    nor deletes anything (retention: efd/store/jobs.py). A head of a lane that gets an
    outcome hands its lane on in the same transaction (efd/store/lanes.py)."""

    def __init__(self, database: Database, steps: StepsSource = no_steps) -> None:
        self._db = database
        self._backend = database.backend
        self._steps = steps  # efd/store/steps.py: whether a destination is ordered
        self._claim = _claim_statement(self._backend.among)

    def claim(self, request: ClaimRequest, *, tokens: Tokens | None = None) -> list[Claimed]:
        """Lease the deliveries `request` asks for (efd/records.py's ClaimRequest).

        The lease moves next_attempt_at to `lease_until` and bumps the fencing token;
        FOR UPDATE SKIP LOCKED (where rows lock) keeps concurrent claimers off each other's
        rows. `tokens`: the rate limits' buckets (efd/store/ratelimit.py), in the same
        transaction: no more are claimed than they allow, and only what is claimed is taken.
        """
        now = request.now
        params = {
            "c_destination": request.destination,
            "c_now": now,
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
            claimed = self._backend.execute(conn, "claim", self._claim, [params])
            if tokens is not None:
                tokens.take(conn, len(claimed))
            if not claimed:
                return []
            pks = [row[2] for row in claimed]
            bodies = {
                pk: (message_id, body, source, received_at, trace)
                for pk, message_id, body, source, received_at, trace in (
                    self._backend.message_fields(conn, pks)
                )
            }
            if len(bodies) < len(set(pks)):
                claimed = self._finish_orphans(conn, claimed, bodies, now)
        result = [
            Claimed(
                delivery_id=delivery_id,
                lease_token=token,
                destination=request.destination,
                attempts=attempts_so_far,
                first_attempt_at=first,
                failed_hooks=_failed_hooks(failed),
                message_id=bodies[pk][0],
                body=bodies[pk][1] if own_body is None else own_body,
                message_pk=pk,
                source=bodies[pk][2],
                received_at=bodies[pk][3],
                url=url,
                trace_context=bodies[pk][4],
            )
            for delivery_id, token, pk, attempts_so_far, first, failed, own_body, url in claimed
        ]
        result.sort(key=lambda c: c.delivery_id)
        return result

    def _finish_orphans(
        self, conn: Connection, claimed: list[Any], bodies: dict[int, Any], now: float
    ) -> list[Any]:
        """Claimed deliveries whose message row is gone (PostgreSQL declares no foreign key,
        migration 0011: deleted by hand, or by retention while a replay was being added) are
        failed for good, and their lanes move on; the others are returned."""
        orphans = [
            Outcome(
                delivery_id=delivery_id,
                lease_token=token,
                status=DeliveryStatus.FAILED,
                attempts=attempts_so_far,
                first_attempt_at=first if first is not None else now,
                next_attempt_at=None,
                finished_at=now,
                failed_hooks=_failed_hooks(failed),
                last_error=MESSAGE_GONE,
            )
            for delivery_id, token, pk, attempts_so_far, first, failed, _, _ in claimed
            if pk not in bodies
        ]
        self._backend.record_outcomes(conn, orphans)
        self._hand_on(conn, orphans)
        return [row for row in claimed if row[2] in bodies]

    def record(self, outcomes: Sequence[Outcome], attempt_rows: Sequence[AttemptRow]) -> int:
        """Write attempt rows and new delivery states; return how many states were stale.

        An outcome whose token no longer matches (the lease expired and another worker
        claimed the delivery) changes nothing; its attempts are still logged, since the
        requests did happen.
        """
        with self._db.bookkeeping() as conn:
            if attempt_rows:
                self._backend.insert_attempts(conn, attempt_rows)
            if not outcomes:
                return 0
            applied = self._backend.record_outcomes(conn, outcomes)
            self._hand_on(conn, outcomes)
        return len(outcomes) - applied

    def renew(self, leases: Sequence[tuple[int, int]], until: float) -> list[int]:
        """Extend the leases (delivery id, token) to `until`, lapsed or not, where the token
        still matches and the delivery is pending; return the ids of the others (another
        claim took them, or they are finished)."""
        if not leases:
            return []
        with self._db.bookkeeping() as conn:
            conn.execute(
                update(deliveries)
                .where(
                    deliveries.c.id == bindparam("r_id"),
                    deliveries.c.lease_token == bindparam("r_token"),
                    deliveries.c.status == PENDING,
                )
                .values(next_attempt_at=bindparam("r_until")),
                [{"r_id": d, "r_token": t, "r_until": until} for d, t in leases],
            )
            held = dict(leases)
            kept: set[int] = set()
            for chunk in chunked(sorted(held)):
                rows = conn.execute(
                    select(deliveries.c.id, deliveries.c.lease_token).where(
                        deliveries.c.id.in_(chunk), deliveries.c.status == PENDING
                    )
                )
                kept.update(pk for pk, token in rows if held[pk] == token)
        return [pk for pk in held if pk not in kept]

    def _hand_on(self, conn: Connection, outcomes: Sequence[Outcome]) -> None:
        """The heads among these outcomes that finished hand their lanes on, in the same
        transaction. A stale outcome finished nothing: its delivery is still pending, so
        its lane stays."""
        if not self._steps().ordered:
            return
        finished = [o for o in outcomes if o.status is not PENDING]
        if finished:
            now = max(o.finished_at or o.first_attempt_at for o in finished)
            heads = [o.delivery_id for o in finished]
            lanes.advance(conn, self._backend, now, heads=heads)

    def release(self, leases: Sequence[tuple[int, int]], now: float) -> None:
        """Give back claimed deliveries that were never sent (shutdown): due again now."""
        if leases:
            with self._db.write() as conn:
                release_leases(conn, deliveries, leases, now)

    def release_all_leases(self, now: float) -> int:
        """Make every leased delivery due now. Only safe when no other process is running
        (a single-process backend, where efd holds an exclusive lock on the database)."""
        with self._db.write() as conn:
            result = conn.execute(
                update(deliveries)
                .where(deliveries.c.status == PENDING, deliveries.c.lease_owner.is_not(None))
                .values(next_attempt_at=now, lease_owner=None)
            )
            return result.rowcount

    def wake(self, destination: str, hook: Sequence[str], now: float) -> int:
        """Make due at `now` the destination's pending deliveries that are not leased and
        whose failed_hooks (a JSON list of strings) holds none of `hook`'s forms: the hook
        has not failed for good for them."""
        needles = []
        for form in hook:
            needle = json.dumps(form)
            for char in ("\\", "%", "_"):
                needle = needle.replace(char, "\\" + char)
            needles.append(needle)
        with self._db.write() as conn:
            result = conn.execute(
                update(deliveries)
                .where(
                    deliveries.c.destination == destination,
                    deliveries.c.status == PENDING,
                    deliveries.c.lease_owner.is_(None),
                    deliveries.c.next_attempt_at > now,
                    or_(
                        deliveries.c.failed_hooks.is_(None),
                        and_(
                            *(
                                deliveries.c.failed_hooks.not_like(f"%{needle}%", escape="\\")
                                for needle in needles
                            )
                        ),
                    ),
                )
                .values(next_attempt_at=now)
            )
            return result.rowcount

    def expire_waiting(self, destination: str, window: float, now: float) -> int:
        """Expire the destination's pending deliveries, not leased, whose retry window has
        closed: counted from the first attempt, or from creation if never attempted. Those
        waiting in lanes too; the lanes of expired heads move on."""
        with self._db.write() as conn:
            waiting = lanes.expire_waiting(conn, destination, window, now)
            result = conn.execute(
                update(deliveries)
                .where(
                    deliveries.c.destination == destination,
                    deliveries.c.status == PENDING,
                    deliveries.c.lease_owner.is_(None),
                    # A batch's members share its outcome: its own window decides.
                    deliveries.c.batch_id.is_(None),
                    func.coalesce(deliveries.c.first_attempt_at, deliveries.c.created_at)
                    <= now - window,
                )
                .values(
                    status=DeliveryStatus.EXPIRED,
                    finished_at=now,
                    next_attempt_at=None,
                    last_error="retry window closed while every hook's circuit was open",
                )
            )
            if result.rowcount:
                lanes.advance(conn, self._backend, now, destination=destination)
            return int(result.rowcount) + waiting

    def next_due(self, destination: str) -> float | None:
        """The earliest next_attempt_at of the destination's pending deliveries (leased
        ones at their lease's end)."""
        with self._db.read() as conn:
            value = conn.execute(
                select(func.min(deliveries.c.next_attempt_at)).where(
                    deliveries.c.destination == destination, deliveries.c.status == PENDING
                )
            ).scalar()
            return float(value) if value is not None else None

    def backlog(self) -> dict[str, int]:
        """Pending deliveries per destination (including those in flight, and those waiting
        in lanes)."""
        with self._db.read() as conn:
            return {name: count for name, (count, _) in open_backlog(conn).items()}


def open_backlog(conn: Connection) -> dict[str, tuple[int, float | None]]:
    """destination -> (its open deliveries, the oldest one's creation time). One query per
    open status, each with its status as a literal, so that each reads only its partial index
    (ix_deliveries_due, ix_deliveries_queued): `status IN (…)` matches neither, and where the
    tables were analysed SQLite then scans every delivery ever stored."""
    found: dict[str, tuple[int, float | None]] = {}
    for status in OPEN:
        rows = conn.execute(
            select(deliveries.c.destination, func.count(), func.min(deliveries.c.created_at))
            .where(deliveries.c.status == literal_column(f"'{status}'"))
            .group_by(deliveries.c.destination)
        ).all()
        for name, count, oldest in rows:
            before, earliest = found.get(name, (0, None))
            if earliest is not None and (oldest is None or earliest < oldest):
                oldest = earliest
            found[name] = (before + count, None if oldest is None else float(oldest))
    return found
