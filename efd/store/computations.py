"""SQL for audience and computed trait syncs: the profiles a sync walks in chunks, what the
last sync delivered (`computed_values`), and each computation's bookkeeping."""

from __future__ import annotations

from collections.abc import Collection, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol

from sqlalchemy import delete, func, select, update

from efd.records import Event, NewMessage, ProfileKind
from efd.store.schema import computations, computed_values, events, profiles, suppressions
from efd.store.statements import chunks, loads
from efd.store.suppressions import Suppressions

if TYPE_CHECKING:
    from efd.store import Store


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


class Computations(Protocol):
    """What the audience and computed trait syncs ask of the store."""

    def load_sync_chunk(
        self,
        key: str,
        *,
        after: str | None,
        limit: int,
        event_names: Collection[str],
        since: float | None,
        with_traits: bool,
    ) -> SyncChunk: ...

    def apply_sync_chunk(
        self,
        key: str,
        outgoing: Sequence[NewMessage],
        values: Sequence[tuple[str, str | None]],
        now: float,
    ) -> None: ...

    def start_sync(
        self, key: str, kind: str, name: str, definition_hash: str, now: float
    ) -> None: ...

    def finish_sync(self, key: str, now: float, sent: int) -> None: ...

    def fail_sync(self, key: str, error: str) -> None: ...

    def computation_rows(self) -> dict[str, ComputationRow]: ...


class ComputationsStore:
    """Owns the audience and computed-trait syncs' tables: what each sync last delivered
    and its bookkeeping; reads profiles and events in chunks. Stores its identify messages
    through ingestion's insert; never changes a profile."""

    def __init__(self, store: Store, suppressions: Suppressions) -> None:
        self._db = store.database
        self._backend = store.backend
        self._ingestion = store.ingestion
        self._suppressions = suppressions

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
        query = select(*columns).where(profiles.c.kind == ProfileKind.USER)
        if after is not None:
            query = query.where(profiles.c.id > after)
        query = query.order_by(profiles.c.id).limit(limit)
        with self._db.snapshot() as conn:
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
            if not self._suppressions.none:
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
        with self._db.write() as conn:
            self._ingestion.insert_with_deliveries(conn, outgoing, now)
            upserts = [
                {"computation": key, "profile_id": pid, "value": value, "updated_at": now}
                for pid, value in values
                if value is not None
            ]
            if upserts:
                conn.execute(
                    self._backend.upsert(computed_values, ["computation", "profile_id"]), upserts
                )
            removed = [pid for pid, value in values if value is None]
            for chunk in chunks(removed):
                conn.execute(
                    delete(computed_values).where(
                        computed_values.c.computation == key,
                        computed_values.c.profile_id.in_(chunk),
                    )
                )

    def start_sync(self, key: str, kind: str, name: str, definition_hash: str, now: float) -> None:
        statement = self._backend.insert(computations).values(
            key=key, kind=kind, name=name, definition_hash=definition_hash, last_sync_at=now
        )
        with self._db.write() as conn:
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
        with self._db.write() as conn:
            conn.execute(
                update(computations)
                .where(computations.c.key == key)
                .values(last_success_at=now, last_sent=sent, last_error=None)
            )

    def fail_sync(self, key: str, error: str) -> None:
        with self._db.write() as conn:
            conn.execute(
                update(computations)
                .where(computations.c.key == key)
                .values(last_error=error[:1000])
            )

    def computation_rows(self) -> dict[str, ComputationRow]:
        with self._db.read() as conn:
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
