"""SQL for profiles, audiences and computed traits, and deletion requests (regulations).

Two hooks run inside Store.insert_messages' transaction (see `IngestHooks`): the
suppression check, and — only when audiences or computed traits are configured — profile
capture: identify traits, identity links, and track/page/screen events.

Regulations are worked through in steps, each its own short transaction fenced by the
regulation's lease token, so a process that lost its lease can never write over the one
that took the regulation over, and a resumed regulation never repeats a finished step.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Collection, Iterator, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from sqlalchemy import (
    Connection,
    Table,
    Text,
    and_,
    bindparam,
    delete,
    func,
    insert,
    literal,
    or_,
    select,
    update,
)
from sqlalchemy.dialects.postgresql import ARRAY
from sqlalchemy.dialects.postgresql import insert as pg_insert
from sqlalchemy.dialects.sqlite import insert as sqlite_insert

from efd import webhooks
from efd.audiences import Event
from efd.personas.profiles import ANONYMOUS, USER, ProfileState, event_of, merge_into, set_traits
from efd.store.schema import (
    FINISHED,
    INITIALIZED,
    RUNNING,
    attempts,
    computations,
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
from efd.store.sql import NewMessage, Store

REGULATION_TYPES = ("DELETE_ONLY", "SUPPRESS_WITH_DELETE", "SUPPRESS_ONLY", "UNSUPPRESS")
DELETE_TYPES = frozenset({"DELETE_ONLY", "SUPPRESS_WITH_DELETE"})
SUPPRESS_TYPES = frozenset({"SUPPRESS_ONLY", "SUPPRESS_WITH_DELETE"})
_CAPTURED = frozenset({"identify", "track", "page", "screen", "alias"})
_CHUNK = 500  # bound IN lists well below SQLite's variable limit


def _chunks(items: Collection[str], size: int = _CHUNK) -> Iterator[list[str]]:
    ordered = sorted(items)
    for start in range(0, len(ordered), size):
        yield ordered[start : start + size]


_scan: Callable[[str, int], tuple[Any, int]] = json.JSONDecoder().scan_once  # type: ignore[attr-defined]


def loads_stored(text: str) -> Any:
    """json.loads for the compact JSON efd itself stored: the C scanner without the
    whitespace handling around it, about twice as fast on small objects."""
    try:
        return _scan(text, 0)[0]
    except StopIteration:
        return json.loads(text)


def _json(value: Any) -> str:
    # ASCII escapes: a lone surrogate from a client must not break a UTF-8 database.
    return json.dumps(value, separators=(",", ":"))


class LeaseLost(Exception):
    """Another process took the regulation over; this one must stop working on it."""


@dataclass(frozen=True, slots=True)
class SyncChunk:
    """One slice of profiles (in id order) with what a sync needs to evaluate them."""

    profiles: list[tuple[str, str | None]]  # (id, traits JSON; None when not needed)
    events: dict[str, list[Event]]  # by profile id, in arrival order
    stored: dict[str, str]  # profile id -> the JSON value the last sync delivered
    suppressed: frozenset[str]
    rows_read: int
    next_after: str | None  # where the next chunk starts; None: this was the last


@dataclass(frozen=True, slots=True)
class ComputationRow:
    key: str
    kind: str
    name: str
    definition_hash: str
    last_sync_at: float | None
    last_success_at: float | None
    last_sent: int | None
    last_error: str | None
    values: int  # members (audience) or profiles with a value (computed trait)


@dataclass(slots=True)
class RegulationClaim:
    id: str
    type: str
    scope: str | None
    created_at: float
    token: int
    progress: dict[str, Any] = field(default_factory=dict)


class PersonasStore:
    """Profiles, computations and regulations on the Store's engines.

    Constructing it installs the ingestion hooks on `store`; `capture` turns profile
    capture on (audiences or computed traits configured).
    """

    def __init__(self, store: Store, *, capture: bool, install: bool = True) -> None:
        self.store = store
        self.sqlite = store.sqlite
        self.capture_enabled = capture
        self._insert = sqlite_insert if store.sqlite else pg_insert

        # SQLite serves one process, so this process sees every change to suppressions
        # and can skip the check while there are none. PostgreSQL: always checked.
        self._none_suppressed = False
        if store.sqlite:
            with store.reader.connect() as conn:
                self._none_suppressed = self._suppressions_empty(conn)
        self._suppressed_any = select(suppressions.c.subject_id).where(
            suppressions.c.subject_id == func.any(bindparam("ids", type_=ARRAY(Text)))
        )
        if install:
            store.hooks = self

    def _upsert(self, table: Table, keys: list[str], only: list[str] | None = None) -> Any:
        """INSERT that, on a conflict over `keys`, overwrites the row's other columns (or
        just `only`) with the new values."""
        statement = self._insert(table)
        columns = only or [c.name for c in table.columns if c.name not in keys]
        return statement.on_conflict_do_update(
            index_elements=keys, set_={c: statement.excluded[c] for c in columns}
        )

    # -- ingestion hooks (inside Store.insert_messages' transaction) ---------------------------

    def suppressed(self, conn: Connection, ids: set[str]) -> set[str]:
        if self._none_suppressed:
            return set()
        if not self.sqlite:
            # One statement whatever the count: = ANY(array) is also cheaper than IN lists.
            return set(conn.execute(self._suppressed_any, {"ids": list(ids)}).scalars())
        found: set[str] = set()
        for chunk in _chunks(ids):
            found.update(
                conn.execute(
                    select(suppressions.c.subject_id).where(suppressions.c.subject_id.in_(chunk))
                ).scalars()
            )
        return found

    @staticmethod
    def _suppressions_empty(conn: Connection) -> bool:
        return conn.execute(select(suppressions.c.subject_id).limit(1)).first() is None

    def capture(self, conn: Connection, rows: Sequence[NewMessage]) -> None:
        """Fold the rows just stored into profiles, identity links and events."""
        if not self.capture_enabled:
            return
        items = [(row, json.loads(row.body)) for row in rows if row.type in _CAPTURED]
        if items:
            _Capture(self, conn, items).run()

    # -- profiles (reads, for tests and the CLI) -----------------------------------------------

    def resolve(self, id_: str) -> str:
        with self.store.reader.connect() as conn:
            canonical = conn.execute(
                select(identities.c.canonical_id).where(identities.c.alias_id == id_)
            ).scalar()
        return canonical if canonical is not None else id_

    def profile(self, id_: str) -> tuple[str, str, dict[str, Any]] | None:
        """(canonical id, kind, traits) of the profile `id_` belongs to, or None."""
        canonical = self.resolve(id_)
        with self.store.reader.connect() as conn:
            row = conn.execute(
                select(profiles.c.kind, profiles.c.traits).where(profiles.c.id == canonical)
            ).first()
        return None if row is None else (canonical, row.kind, json.loads(row.traits))

    # -- sync ------------------------------------------------------------------------------

    def load_sync_chunk(
        self,
        key: str,
        *,
        after: str | None,
        limit: int,
        event_names: Collection[str],
        since: float | None,
        with_traits: bool,
    ) -> SyncChunk:
        """The next `limit` user profiles after `after`, with their events named
        `event_names` at or after `since`, the values stored for computation `key`, and
        which of them are suppressed."""
        columns = [profiles.c.id, profiles.c.traits] if with_traits else [profiles.c.id]
        query = select(*columns).where(profiles.c.kind == USER)
        if after is not None:
            query = query.where(profiles.c.id > after)
        query = query.order_by(profiles.c.id).limit(limit)
        with self.store.reader.begin() as conn:
            rows = conn.execute(query).all()
            last = rows[-1][0] if len(rows) == limit else None

            def in_range(column: Any) -> list[Any]:
                conditions = []
                if after is not None:
                    conditions.append(column > after)
                if last is not None:
                    conditions.append(column <= last)
                return conditions

            by_profile: dict[str, list[Event]] = {}
            read = len(rows)
            if event_names and rows:
                event_query = select(
                    events.c.identity, events.c.name, events.c.timestamp, events.c.properties
                ).where(*in_range(events.c.identity), events.c.name.in_(sorted(event_names)))
                if since is not None:
                    event_query = event_query.where(events.c.timestamp >= since)
                loads = loads_stored
                for identity, name, timestamp, properties in conn.execute(
                    event_query.order_by(events.c.id)
                ):
                    read += 1
                    found = by_profile.get(identity)
                    if found is None:
                        found = by_profile[identity] = []
                    found.append(Event(name, timestamp, loads(properties)))
            stored = dict(
                conn.execute(
                    select(computed_values.c.profile_id, computed_values.c.value).where(
                        computed_values.c.computation == key,
                        *in_range(computed_values.c.profile_id),
                    )
                ).all()
            )
            read += len(stored)
            blocked: frozenset[str] = frozenset()
            if not self._none_suppressed:
                blocked = frozenset(
                    conn.execute(
                        select(suppressions.c.subject_id).where(
                            *in_range(suppressions.c.subject_id)
                        )
                    ).scalars()
                )
                read += len(blocked)
        return SyncChunk(
            profiles=[(row[0], row[1] if with_traits else None) for row in rows],
            events=by_profile,
            stored=stored,
            suppressed=blocked,
            rows_read=read,
            next_after=last,
        )

    def apply_sync_chunk(
        self,
        key: str,
        outgoing: Sequence[NewMessage],
        values: Sequence[tuple[str, str | None]],
        now: float,
    ) -> None:
        """In one transaction: the identify messages and their deliveries, and the new
        stored values (None deletes), so a crash can neither resend nor lose a change."""
        with self.store.writer.begin() as conn:
            self.store.insert_with_deliveries(conn, outgoing, now)
            upserts = [
                {"computation": key, "profile_id": pid, "value": value, "updated_at": now}
                for pid, value in values
                if value is not None
            ]
            if upserts:
                conn.execute(self._upsert(computed_values, ["computation", "profile_id"]), upserts)
            removed = [pid for pid, value in values if value is None]
            for chunk in _chunks(removed):
                conn.execute(
                    delete(computed_values).where(
                        computed_values.c.computation == key,
                        computed_values.c.profile_id.in_(chunk),
                    )
                )

    def start_sync(self, key: str, kind: str, name: str, definition_hash: str, now: float) -> None:
        statement = self._insert(computations).values(
            key=key, kind=kind, name=name, definition_hash=definition_hash, last_sync_at=now
        )
        with self.store.writer.begin() as conn:
            conn.execute(
                statement.on_conflict_do_update(
                    index_elements=["key"],
                    set_={
                        "kind": kind,
                        "name": name,
                        "definition_hash": definition_hash,
                        "last_sync_at": now,
                    },
                )
            )

    def finish_sync(self, key: str, now: float, sent: int) -> None:
        with self.store.writer.begin() as conn:
            conn.execute(
                update(computations)
                .where(computations.c.key == key)
                .values(last_success_at=now, last_sent=sent, last_error=None)
            )

    def fail_sync(self, key: str, error: str) -> None:
        with self.store.writer.begin() as conn:
            conn.execute(
                update(computations)
                .where(computations.c.key == key)
                .values(last_error=error[:1000])
            )

    def computation_rows(self) -> dict[str, ComputationRow]:
        with self.store.reader.connect() as conn:
            counts: dict[str, int] = {
                key: int(count)
                for key, count in conn.execute(
                    select(computed_values.c.computation, func.count()).group_by(
                        computed_values.c.computation
                    )
                )
            }
            return {
                row.key: ComputationRow(
                    key=row.key,
                    kind=row.kind,
                    name=row.name,
                    definition_hash=row.definition_hash,
                    last_sync_at=row.last_sync_at,
                    last_success_at=row.last_success_at,
                    last_sent=row.last_sent,
                    last_error=row.last_error,
                    values=counts.get(row.key, 0),
                )
                for row in conn.execute(select(computations))
            }

    def purge_events(self, before: float, limit: int) -> int:
        """Delete up to `limit` events older than `before`; the retention job's step."""
        with self.store.writer.begin() as conn:
            ids = (
                conn.execute(select(events.c.id).where(events.c.timestamp < before).limit(limit))
                .scalars()
                .all()
            )
            if ids:
                conn.execute(delete(events).where(events.c.id.in_(ids)))
            return len(ids)

    # -- regulations -------------------------------------------------------------------------

    def create_regulation(
        self, reg_id: str, type_: str, scope: str | None, subject_ids: Sequence[str], now: float
    ) -> None:
        """Record a regulation. Suppressions start (or end) here, with the request, so
        every message stored after the answer is already checked against them."""
        with self.store.writer.begin() as conn:
            conn.execute(
                insert(regulations).values(
                    id=reg_id,
                    type=type_,
                    scope=scope,
                    status=INITIALIZED,
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
                conn.execute(self._upsert(suppressions, ["subject_id"]), rows)
                none_left = False
            elif type_ == "UNSUPPRESS":
                for chunk in _chunks(subject_ids):
                    conn.execute(
                        delete(suppressions).where(
                            or_(
                                suppressions.c.user_id.in_(chunk),
                                suppressions.c.subject_id.in_(chunk),
                            )
                        )
                    )
                none_left = self._suppressions_empty(conn)
            else:
                none_left = self._none_suppressed
        if self.sqlite:
            self._none_suppressed = none_left

    def _identity_graph(self, conn: Connection, user_ids: Sequence[str]) -> dict[str, str]:
        """Each requested userId, and every id linked to it in the profile store, mapped to
        the requested userId it belongs to."""
        graph = {u: u for u in user_ids}
        canonical: dict[str, str] = {}  # canonical id -> requested userId
        for chunk in _chunks(set(user_ids)):
            for alias, target in conn.execute(
                select(identities.c.alias_id, identities.c.canonical_id).where(
                    identities.c.alias_id.in_(chunk)
                )
            ):
                canonical.setdefault(target, alias)
        for u in user_ids:
            canonical.setdefault(u, u)
        for chunk in _chunks(set(canonical)):
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
        is running (SQLite, where efd holds an exclusive lock on the database file)."""
        with self.store.writer.begin() as conn:
            return conn.execute(
                update(regulations).where(regulations.c.status == RUNNING).values(lease_until=0.0)
            ).rowcount

    def claim_regulation(
        self, owner: str, now: float, lease_until: float
    ) -> RegulationClaim | None:
        """Take the oldest regulation that is new, or running with a lapsed lease."""
        due = (
            select(regulations.c.id)
            .where(
                or_(
                    regulations.c.status == INITIALIZED,
                    and_(regulations.c.status == RUNNING, regulations.c.lease_until < now),
                )
            )
            .order_by(regulations.c.created_at)
            .limit(1)
            .with_for_update(skip_locked=True)
        )
        with self.store.writer.begin() as conn:
            row = conn.execute(
                update(regulations)
                .where(regulations.c.id.in_(due.scalar_subquery()))
                .values(
                    status=RUNNING,
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
                regulations.c.status == RUNNING,
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

    def renew(self, claim: RegulationClaim, lease_until: float) -> None:
        with self.store.writer.begin() as conn:
            self._fence(conn, claim, lease_until)

    def notify_source(
        self,
        claim: RegulationClaim,
        source: str,
        destinations: Sequence[str],
        *,
        now: float,
        lease_until: float,
    ) -> int:
        """In ONE transaction: a delete notification per requested user to each of the
        source's destinations, and the source recorded as done."""
        when = datetime.fromtimestamp(claim.created_at, UTC)
        with self.store.writer.begin() as conn:
            self._fence(conn, claim, lease_until)
            users = (
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
            rows = [
                NewMessage(
                    source=source,
                    message_id=f"delete:{claim.id}:{n}",
                    type="delete",
                    user_id=user,
                    anonymous_id=None,
                    event=None,
                    timestamp=claim.created_at,
                    received_at=now,
                    body=webhooks.encode(webhooks.delete_body(user, when)).decode("utf-8"),
                    destinations=tuple(destinations),
                )
                for n, user in enumerate(users)
            ]
            pks = self.store.insert_with_deliveries(conn, rows, now)
            progress = json.loads(json.dumps(claim.progress))
            progress.setdefault("sources", {})[source] = {
                "status": FINISHED,
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
        with self.store.writer.begin() as conn:
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
                statement = self._insert(regulation_subjects)
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
        with self.store.reader.connect() as conn:
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
            self._insert(regulation_subjects)
            .from_select(["regulation_id", "subject_id", "requested"], found)
            .on_conflict_do_nothing(index_elements=["regulation_id", "subject_id"])
        )
        with self.store.writer.begin() as conn:
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
        with self.store.writer.begin() as conn:
            self._fence(conn, claim, lease_until)
            their_deliveries = select(deliveries.c.id).where(
                deliveries.c.message_pk.in_(select(messages.c.id).where(*targets))
            )
            conn.execute(
                update(attempts)
                .where(attempts.c.delivery_id.in_(their_deliveries))
                .values(response_head=None, error=None)
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
        with self.store.writer.begin() as conn:
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
        with self.store.writer.begin() as conn:
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
        with self.store.writer.begin() as conn:
            conn.execute(
                update(regulations)
                .where(
                    regulations.c.id == claim.id,
                    regulations.c.lease_token == claim.token,
                    regulations.c.status == RUNNING,
                )
                .values(lease_until=0.0, owner=None)
            )

    def regulation(self, reg_id: str) -> dict[str, Any] | None:
        """The regulation's row, with live delivery counts of its notifications."""
        with self.store.reader.connect() as conn:
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


class _Capture:
    """Applies one group commit's messages to profiles, in order, with few statements.

    Identity rules: a message with a userId belongs to that user's profile; an anonymousId
    seen with a userId is linked to it (and its anonymous profile merged in) unless it is
    already linked to another user (a shared device); alias joins the previous id's
    profile to the userId's, whatever kind it is. Links are kept flat: alias -> canonical.
    """

    def __init__(
        self, owner: PersonasStore, conn: Connection, items: list[tuple[NewMessage, Any]]
    ) -> None:
        self.owner = owner
        self.conn = conn
        self.items = items
        self.links: dict[str, str] = {}
        self.new_links: dict[str, str] = {}
        self.states: dict[str, ProfileState] = {}
        self.merges: list[tuple[str, str]] = []
        self.pending_events: list[tuple[str, str, float, str]] = []
        self.now = time.time()

    def resolve(self, id_: str) -> str:
        return self.links.get(id_, id_)

    def run(self) -> None:
        conn, owner = self.conn, self.owner
        raw: set[str] = set()
        for row, body in self.items:
            raw.update(i for i in (row.user_id, row.anonymous_id) if i is not None)
            if row.type == "alias":
                raw.add(body["previousId"])
        for chunk in _chunks(raw):
            self.links.update(
                conn.execute(
                    select(identities.c.alias_id, identities.c.canonical_id).where(
                        identities.c.alias_id.in_(chunk)
                    )
                ).all()
            )
        resolve = self.resolve
        ensure: dict[str, str] = {}  # profiles the messages need: canonical id -> kind
        lock: set[str] = set()
        for row, body in self.items:
            if row.user_id is not None:
                ensure[resolve(row.user_id)] = USER
                if row.anonymous_id is not None:
                    lock.add(resolve(row.anonymous_id))
                if row.type == "alias":
                    lock.add(resolve(body["previousId"]))
            elif row.anonymous_id is not None:
                ensure.setdefault(resolve(row.anonymous_id), ANONYMOUS)
        if ensure:
            conn.execute(
                owner._insert(profiles).on_conflict_do_nothing(index_elements=["id"]),
                [
                    {
                        "id": i,
                        "kind": k,
                        "traits": "{}",
                        "trait_times": "{}",
                        "updated_at": self.now,
                    }
                    for i, k in sorted(ensure.items())
                ],
            )
        for chunk in _chunks(lock | set(ensure)):
            query = select(
                profiles.c.id, profiles.c.kind, profiles.c.traits, profiles.c.trait_times
            ).where(profiles.c.id.in_(chunk))
            if not owner.sqlite:
                query = query.order_by(profiles.c.id).with_for_update()
            for pid, kind, traits, times in conn.execute(query):
                state = self.states[pid] = ProfileState(pid, kind, traits, times)
                if ensure.get(pid) == USER and kind != USER:
                    state.kind = USER
                    state.dirty = True
        self.apply()
        self.write()

    def apply(self) -> None:
        resolve = self.resolve
        for row, body in self.items:
            user, anonymous = row.user_id, row.anonymous_id
            if row.type == "alias":
                assert user is not None
                target, previous = resolve(user), resolve(body["previousId"])
                if previous != target:
                    self.merge(previous, target)
                continue
            if user is not None:
                target = resolve(user)
                if anonymous is not None:
                    linked = resolve(anonymous)
                    if linked != target:
                        state = self.states.get(linked)
                        if state is None:
                            if linked == anonymous:
                                self.link(anonymous, target)  # first seen here
                        elif state.kind == ANONYMOUS:
                            self.merge(linked, target)
                        # else: the anonymousId belongs to another user already; keep that.
            else:
                assert anonymous is not None
                target = resolve(anonymous)
            if row.type == "identify":
                traits = body.get("traits")
                if isinstance(traits, dict) and traits:
                    set_traits(self.state(target), traits, row.timestamp)
                continue
            event = event_of(row.type, body)
            if event is not None:
                self.pending_events.append((target, event[0], row.timestamp, _json(event[1])))

    def state(self, id_: str) -> ProfileState:
        state = self.states.get(id_)
        if state is None:  # not expected: every target was ensured; stay correct anyway
            state = self.states[id_] = ProfileState(id_, USER)
            state.dirty = True
        return state

    def link(self, alias: str, canonical: str) -> None:
        self.links[alias] = canonical
        self.new_links[alias] = canonical

    def merge(self, source: str, target: str) -> None:
        previous = self.states.pop(source, None)
        if previous is not None:
            merge_into(previous, self.state(target))
            self.merges.append((source, target))
        for alias, canonical in self.links.items():
            if canonical == source:
                self.links[alias] = target
                if alias in self.new_links:
                    self.new_links[alias] = target
        self.link(source, target)

    def write(self) -> None:
        conn, owner = self.conn, self.owner
        for source, target in self.merges:
            conn.execute(
                update(identities)
                .where(identities.c.canonical_id == source)
                .values(canonical_id=target)
            )
            conn.execute(update(events).where(events.c.identity == source).values(identity=target))
            conn.execute(delete(computed_values).where(computed_values.c.profile_id == source))
            conn.execute(delete(profiles).where(profiles.c.id == source))
        if self.new_links:
            conn.execute(
                owner._upsert(identities, ["alias_id"], only=["canonical_id"]),
                [
                    {"alias_id": a, "canonical_id": self.resolve(a), "created_at": self.now}
                    for a in sorted(self.new_links)
                ],
            )
        dirty = [s for s in self.states.values() if s.dirty]
        if dirty:
            conn.execute(
                owner._upsert(profiles, ["id"]),
                [
                    {
                        "id": s.id,
                        "kind": s.kind,
                        "traits": s.traits_json(),
                        "trait_times": s.times_json(),
                        "updated_at": self.now,
                    }
                    for s in sorted(dirty, key=lambda s: s.id)
                ],
            )
        if self.pending_events:
            conn.execute(
                insert(events),
                [
                    {
                        "identity": self.resolve(target),
                        "name": name,
                        "timestamp": timestamp,
                        "properties": properties,
                    }
                    for target, name, timestamp, properties in self.pending_events
                ],
            )
