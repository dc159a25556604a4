"""SQL for deletion requests ("regulations") and suppressions.

A regulation is worked through in steps (efd/services/regulations.py), each its own short
transaction fenced by the regulation's lease token, so a process that lost its lease can
never write over the one that took the regulation over, and a resumed regulation never
repeats a finished step. Suppressions are checked inside the ingestion transaction.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol

from sqlalchemy import Connection, and_, delete, func, insert, literal, or_, select, update

from efd.errors import LeaseLost
from efd.records import NewMessage, RegulationStatus
from efd.store.schema import (
    attempts,
    batches,
    computed_values,
    deliveries,
    events,
    identities,
    messages,
    profiles,
    regulation_subjects,
    regulations,
    suppressions,
)
from efd.store.statements import chunks
from efd.store.suppressions import Suppressions

if TYPE_CHECKING:
    from efd.store import Store

REGULATION_TYPES = ("DELETE_ONLY", "SUPPRESS_WITH_DELETE", "SUPPRESS_ONLY", "UNSUPPRESS")
DELETE_TYPES = frozenset({"DELETE_ONLY", "SUPPRESS_WITH_DELETE"})
SUPPRESS_TYPES = frozenset({"SUPPRESS_ONLY", "SUPPRESS_WITH_DELETE"})


@dataclass(slots=True)
class RegulationClaim:
    id: str
    type: str
    scope: str | None
    created_at: float
    token: int
    progress: dict[str, Any] = field(default_factory=dict)


class Regulations(Protocol):
    """What the regulations API and the regulation runner ask of the store."""

    def create_regulation(
        self, reg_id: str, type_: str, scope: str | None, subject_ids: Sequence[str], now: float
    ) -> None: ...

    def release_regulation_leases(self) -> int: ...

    def claim_regulation(
        self, owner: str, now: float, lease_until: float
    ) -> RegulationClaim | None: ...

    def requested_subjects(self, claim: RegulationClaim) -> list[str]: ...

    def record_notifications(
        self,
        claim: RegulationClaim,
        source: str,
        destinations: Sequence[str],
        rows: Sequence[NewMessage],
        *,
        now: float,
        lease_until: float,
    ) -> int: ...

    def link_subjects(self, claim: RegulationClaim, lease_until: float) -> int: ...

    def max_message_pk(self) -> int: ...

    def link_anonymous_ids(
        self, claim: RegulationClaim, low: int, high: int, lease_until: float
    ) -> None: ...

    def purge_messages(
        self, claim: RegulationClaim, low: int, high: int, lease_until: float
    ) -> int: ...

    def purge_profiles(self, claim: RegulationClaim, lease_until: float) -> dict[str, int]: ...

    def finish_regulation(
        self,
        claim: RegulationClaim,
        status: str,
        progress: dict[str, Any],
        now: float,
        error: str | None = None,
    ) -> None: ...

    def release_regulation(self, claim: RegulationClaim) -> None: ...

    def regulation(self, reg_id: str) -> dict[str, Any] | None: ...


class RegulationsStore:
    """Owns the regulations and their subjects, each step fenced by the regulation's lease,
    and the suppressions a regulation starts or ends. Stores delete notifications through
    ingestion's insert; never claims deliveries."""

    def __init__(self, store: Store, suppressions: Suppressions) -> None:
        self._db = store.database
        self._backend = store.backend
        self._ingestion = store.ingestion
        self._suppressions = suppressions

    def create_regulation(
        self, reg_id: str, type_: str, scope: str | None, subject_ids: Sequence[str], now: float
    ) -> None:
        """Record a regulation. Suppressions start (or end) here, with the request, so
        every message stored after the answer is already checked against them."""
        with self._db.write() as conn:
            conn.execute(
                insert(regulations).values(
                    id=reg_id,
                    type=type_,
                    scope=scope,
                    status=RegulationStatus.INITIALIZED,
                    subject_count=len(subject_ids),
                    progress="{}",
                    created_at=now,
                )
            )
            conn.execute(
                insert(regulation_subjects),
                [{"regulation_id": reg_id, "subject_id": s, "requested": 1} for s in subject_ids],
            )
            if type_ in SUPPRESS_TYPES:
                rows = [
                    {"subject_id": s, "user_id": u, "regulation_id": reg_id, "created_at": now}
                    for s, u in self._identity_graph(conn, subject_ids).items()
                ]
                conn.execute(self._backend.upsert(suppressions, ["subject_id"]), rows)
                none_left = False
            elif type_ == "UNSUPPRESS":
                for chunk in chunks(subject_ids):
                    conn.execute(
                        delete(suppressions).where(
                            or_(
                                suppressions.c.user_id.in_(chunk),
                                suppressions.c.subject_id.in_(chunk),
                            )
                        )
                    )
                none_left = Suppressions.empty(conn)
            else:
                none_left = self._suppressions.none
        self._suppressions.changed(none_left)

    def _identity_graph(self, conn: Connection, user_ids: Sequence[str]) -> dict[str, str]:
        """Each requested userId, and every id linked to it in the profile store, mapped to
        the requested userId it belongs to."""
        graph = {u: u for u in user_ids}
        canonical: dict[str, str] = {}  # canonical id -> requested userId
        for chunk in chunks(set(user_ids)):
            for alias, target in conn.execute(
                select(identities.c.alias_id, identities.c.canonical_id).where(
                    identities.c.alias_id.in_(chunk)
                )
            ):
                canonical.setdefault(target, alias)
        for u in user_ids:
            canonical.setdefault(u, u)
        for chunk in chunks(set(canonical)):
            for alias, target in conn.execute(
                select(identities.c.alias_id, identities.c.canonical_id).where(
                    identities.c.canonical_id.in_(chunk)
                )
            ):
                graph.setdefault(alias, canonical[target])
        for target, user in canonical.items():
            graph.setdefault(target, user)
        return graph

    def release_regulation_leases(self) -> int:
        """Make every running regulation resumable now. Only safe when no other process
        is running (a single-process backend, where efd holds the database's lock)."""
        with self._db.write() as conn:
            return conn.execute(
                update(regulations)
                .where(regulations.c.status == RegulationStatus.RUNNING)
                .values(lease_until=0.0)
            ).rowcount

    def claim_regulation(
        self, owner: str, now: float, lease_until: float
    ) -> RegulationClaim | None:
        """Take the oldest regulation that is new, or running with a lapsed lease."""
        due = (
            select(regulations.c.id)
            .where(
                or_(
                    regulations.c.status == RegulationStatus.INITIALIZED,
                    and_(
                        regulations.c.status == RegulationStatus.RUNNING,
                        regulations.c.lease_until < now,
                    ),
                )
            )
            .order_by(regulations.c.created_at)
            .limit(1)
            .with_for_update(skip_locked=True)
        )
        with self._db.write() as conn:
            row = conn.execute(
                update(regulations)
                .where(regulations.c.id.in_(due.scalar_subquery()))
                .values(
                    status=RegulationStatus.RUNNING,
                    owner=owner,
                    lease_until=lease_until,
                    lease_token=regulations.c.lease_token + 1,
                    started_at=func.coalesce(regulations.c.started_at, now),
                )
                .returning(
                    regulations.c.id,
                    regulations.c.type,
                    regulations.c.scope,
                    regulations.c.created_at,
                    regulations.c.lease_token,
                    regulations.c.progress,
                )
            ).first()
        if row is None:
            return None
        return RegulationClaim(
            id=row.id,
            type=row.type,
            scope=row.scope,
            created_at=row.created_at,
            token=row.lease_token,
            progress=json.loads(row.progress),
        )

    def _fence(self, conn: Connection, claim: RegulationClaim, lease_until: float) -> None:
        """Renew the lease, or raise LeaseLost if another process holds it now. On
        PostgreSQL this also locks the row until commit, so no one can take it meanwhile."""
        result = conn.execute(
            update(regulations)
            .where(
                regulations.c.id == claim.id,
                regulations.c.lease_token == claim.token,
                regulations.c.status == RegulationStatus.RUNNING,
            )
            .values(lease_until=lease_until)
        )
        if result.rowcount != 1:
            raise LeaseLost(claim.id)

    @staticmethod
    def _save_progress(conn: Connection, claim: RegulationClaim, progress: dict[str, Any]) -> None:
        conn.execute(
            update(regulations)
            .where(regulations.c.id == claim.id)
            .values(progress=json.dumps(progress, sort_keys=True))
        )

    def requested_subjects(self, claim: RegulationClaim) -> list[str]:
        """The userIds the regulation names, in order (they never change once recorded)."""
        with self._db.read() as conn:
            return list(
                conn.execute(
                    select(regulation_subjects.c.subject_id)
                    .where(
                        regulation_subjects.c.regulation_id == claim.id,
                        regulation_subjects.c.requested == 1,
                    )
                    .order_by(regulation_subjects.c.subject_id)
                )
                .scalars()
                .all()
            )

    def record_notifications(
        self,
        claim: RegulationClaim,
        source: str,
        destinations: Sequence[str],
        rows: Sequence[NewMessage],
        *,
        now: float,
        lease_until: float,
    ) -> int:
        """In ONE transaction: the source's delete notifications (`rows`, one per requested
        user, to each of its destinations) and the source recorded as done. The fence makes
        a regulation taken over by another process refuse this, so none is sent twice."""
        with self._db.write() as conn:
            self._fence(conn, claim, lease_until)
            pks = self._ingestion.insert_with_deliveries(conn, rows, now)
            progress = json.loads(json.dumps(claim.progress))
            progress.setdefault("sources", {})[source] = {
                "status": RegulationStatus.FINISHED,
                "notifications": len(rows),
                "destinations": list(destinations),
                "first_pk": min(pks, default=None),
                "last_pk": max(pks, default=None),
                "finished_at": now,
            }
            self._save_progress(conn, claim, progress)
        claim.progress = progress
        return len(rows)

    def _subjects(self, claim: RegulationClaim) -> Any:
        return select(regulation_subjects.c.subject_id).where(
            regulation_subjects.c.regulation_id == claim.id
        )

    def link_subjects(self, claim: RegulationClaim, lease_until: float) -> int:
        """Add the ids the profile store links to the requested users; the purge covers
        them too. Returns how many were added."""
        with self._db.write() as conn:
            self._fence(conn, claim, lease_until)
            requested = (
                conn.execute(
                    select(regulation_subjects.c.subject_id).where(
                        regulation_subjects.c.regulation_id == claim.id,
                        regulation_subjects.c.requested == 1,
                    )
                )
                .scalars()
                .all()
            )
            linked = set(self._identity_graph(conn, requested)) - set(requested)
            if linked:
                statement = self._backend.insert(regulation_subjects)
                conn.execute(
                    statement.on_conflict_do_nothing(
                        index_elements=["regulation_id", "subject_id"]
                    ),
                    [
                        {"regulation_id": claim.id, "subject_id": s, "requested": 0}
                        for s in sorted(linked)
                    ],
                )
            return len(linked)

    def max_message_pk(self) -> int:
        with self._db.read() as conn:
            return int(conn.execute(select(func.coalesce(func.max(messages.c.id), 0))).scalar_one())

    def link_anonymous_ids(
        self, claim: RegulationClaim, low: int, high: int, lease_until: float
    ) -> None:
        """Add the anonymousIds that messages with pk in (low, high] show together with a
        subject's userId."""
        found = (
            select(literal(claim.id), messages.c.anonymous_id, literal(0))
            .where(
                messages.c.id > low,
                messages.c.id <= high,
                messages.c.anonymous_id.is_not(None),
                messages.c.user_id.in_(self._subjects(claim)),
            )
            .distinct()
        )
        statement = (
            self._backend.insert(regulation_subjects)
            .from_select(["regulation_id", "subject_id", "requested"], found)
            .on_conflict_do_nothing(index_elements=["regulation_id", "subject_id"])
        )
        with self._db.write() as conn:
            self._fence(conn, claim, lease_until)
            conn.execute(statement)

    def purge_messages(
        self, claim: RegulationClaim, low: int, high: int, lease_until: float
    ) -> int:
        """Remove what the subjects' messages with pk in (low, high] say about them: their
        userId, or no userId and their anonymousId. The payload, ids and event name go;
        so do the attempts' excerpts of the receivers' answers (which often echo the body)
        and error texts. Kept for the audit: the rows, their ids, type, times, statuses,
        status codes and error classes. Delete notifications stay. The count is recorded
        in the same transaction."""
        subjects = self._subjects(claim)
        targets = (
            messages.c.id > low,
            messages.c.id <= high,
            messages.c.body.is_not(None),
            messages.c.type != "delete",
            or_(
                messages.c.user_id.in_(subjects),
                and_(messages.c.user_id.is_(None), messages.c.anonymous_id.in_(subjects)),
            ),
        )
        with self._db.write() as conn:
            self._fence(conn, claim, lease_until)
            their_deliveries = select(deliveries.c.id).where(
                deliveries.c.message_pk.in_(select(messages.c.id).where(*targets))
            )
            conn.execute(
                update(attempts)
                .where(attempts.c.delivery_id.in_(their_deliveries))
                .values(response_head=None, error=None)
            )
            # So is a batch's body, the array of its members' bodies: emptied, and a batch
            # still to be sent (a retry) is then left unsent and its other events formed
            # again (efd/delivery/batches.py).
            conn.execute(
                update(batches)
                .where(
                    batches.c.id.in_(
                        select(deliveries.c.batch_id).where(
                            deliveries.c.message_pk.in_(select(messages.c.id).where(*targets)),
                            deliveries.c.batch_id.is_not(None),
                        )
                    )
                )
                .values(body="")
            )
            # A body a field filter made for one destination is the payload too.
            conn.execute(
                update(deliveries)
                .where(
                    deliveries.c.message_pk.in_(select(messages.c.id).where(*targets)),
                    deliveries.c.body.is_not(None),
                )
                .values(body=None)
            )
            purged = conn.execute(
                update(messages)
                .where(*targets)
                .values(body=None, user_id=None, anonymous_id=None, event=None)
            ).rowcount
            progress = self._count_purged(conn, claim, {"messages": purged}, done=False)
        claim.progress = progress
        return purged

    def purge_profiles(self, claim: RegulationClaim, lease_until: float) -> dict[str, int]:
        """Delete the subjects' profiles, identity links, events and memberships: the last
        purge step, so it also marks the purge done."""
        subjects = self._subjects(claim)
        with self._db.write() as conn:
            self._fence(conn, claim, lease_until)
            counts = {
                "events": conn.execute(
                    delete(events).where(events.c.identity.in_(subjects))
                ).rowcount,
                "computed_values": conn.execute(
                    delete(computed_values).where(computed_values.c.profile_id.in_(subjects))
                ).rowcount,
                "identities": conn.execute(
                    delete(identities).where(
                        or_(
                            identities.c.alias_id.in_(subjects),
                            identities.c.canonical_id.in_(subjects),
                        )
                    )
                ).rowcount,
                "profiles": conn.execute(
                    delete(profiles).where(profiles.c.id.in_(subjects))
                ).rowcount,
            }
            progress = self._count_purged(conn, claim, counts, done=True)
        claim.progress = progress
        return counts

    def _count_purged(
        self, conn: Connection, claim: RegulationClaim, counts: dict[str, int], *, done: bool
    ) -> dict[str, Any]:
        progress: dict[str, Any] = json.loads(json.dumps(claim.progress))
        purge = progress.setdefault("purge", {})
        for key, count in counts.items():
            purge[key] = purge.get(key, 0) + count
        if done:
            purge["done"] = True
        self._save_progress(conn, claim, progress)
        return progress

    def finish_regulation(
        self,
        claim: RegulationClaim,
        status: str,
        progress: dict[str, Any],
        now: float,
        error: str | None = None,
    ) -> None:
        with self._db.write() as conn:
            self._fence(conn, claim, now)
            conn.execute(
                update(regulations)
                .where(regulations.c.id == claim.id)
                .values(
                    status=status,
                    progress=json.dumps(progress, sort_keys=True),
                    finished_at=now,
                    owner=None,
                    lease_until=None,
                    error=error,
                )
            )
            # The linked ids were only needed for the purge; keep no more about the user.
            conn.execute(
                delete(regulation_subjects).where(
                    regulation_subjects.c.regulation_id == claim.id,
                    regulation_subjects.c.requested == 0,
                )
            )
        claim.progress = progress

    def release_regulation(self, claim: RegulationClaim) -> None:
        """Give a regulation back (graceful stop): resumable at once by any process."""
        with self._db.write() as conn:
            conn.execute(
                update(regulations)
                .where(
                    regulations.c.id == claim.id,
                    regulations.c.lease_token == claim.token,
                    regulations.c.status == RegulationStatus.RUNNING,
                )
                .values(lease_until=0.0, owner=None)
            )

    def regulation(self, reg_id: str) -> dict[str, Any] | None:
        """The regulation's row, with live delivery counts of its notifications."""
        with self._db.read() as conn:
            row = conn.execute(select(regulations).where(regulations.c.id == reg_id)).first()
            if row is None:
                return None
            result = dict(row._mapping)
            progress = json.loads(row.progress)
            sources: dict[str, dict[str, Any]] = progress.get("sources", {})
            for source, done in sources.items():
                counts: dict[str, dict[str, int]] = {
                    name: {} for name in done.get("destinations", [])
                }
                if done.get("first_pk") is not None:
                    for destination, status, count in conn.execute(
                        select(deliveries.c.destination, deliveries.c.status, func.count())
                        .join(messages, messages.c.id == deliveries.c.message_pk)
                        .where(
                            deliveries.c.message_pk >= done["first_pk"],
                            deliveries.c.message_pk <= done["last_pk"],
                            messages.c.source == source,
                            messages.c.type == "delete",
                            messages.c.message_id.like(f"delete:{reg_id}:%"),
                        )
                        .group_by(deliveries.c.destination, deliveries.c.status)
                    ):
                        counts.setdefault(destination, {})[status] = int(count)
                done["deliveries"] = counts
            result["progress"] = progress
            return result
