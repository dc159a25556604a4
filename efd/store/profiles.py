"""SQL for profiles, identity links and kept events (maintained only while audiences or
computed traits are configured). The identity rules live in efd/personas/capture.py;
these are the statements it runs inside the ingestion transaction, and the reads."""

from __future__ import annotations

import json
from collections.abc import Collection, Iterable, Sequence
from typing import TYPE_CHECKING, Any, Protocol

from sqlalchemy import Connection, delete, insert, select, update

from efd.store.schema import computed_values, events, identities, profiles
from efd.store.statements import chunks

if TYPE_CHECKING:
    from efd.store import Store

ProfileRow = tuple[str, str, str, str]  # (id, kind, traits JSON, trait_times JSON)


class Profiles(Protocol):
    """What profile capture and the periodic jobs ask of the profile tables."""

    def links(self, conn: Connection, ids: Collection[str]) -> dict[str, str]: ...

    def ensure(self, conn: Connection, kinds: dict[str, str], now: float) -> None: ...

    def load(self, conn: Connection, ids: Collection[str]) -> list[ProfileRow]: ...

    def merge(self, conn: Connection, source: str, target: str) -> None: ...

    def save_links(self, conn: Connection, links: dict[str, str], now: float) -> None: ...

    def save(self, conn: Connection, rows: Sequence[ProfileRow], now: float) -> None: ...

    def add_events(self, conn: Connection, rows: Iterable[tuple[str, str, float, str]]) -> None: ...

    def resolve(self, id_: str) -> str: ...

    def profile(self, id_: str) -> tuple[str, str, dict[str, Any]] | None: ...

    def purge_events(
        self, before: float, limit: int, since: float | None = None
    ) -> tuple[int, float | None]: ...


class ProfilesStore:
    """Owns profiles, identity links and kept events: the statements profile capture runs
    inside the ingestion transaction, the reads, and the events' retention. Decides nothing
    about identities (efd/personas/capture.py does)."""

    def __init__(self, store: Store) -> None:
        self._backend = store.backend
        self._db = store.database

    # -- inside the ingestion transaction ----------------------------------------------------

    @staticmethod
    def links(conn: Connection, ids: Collection[str]) -> dict[str, str]:
        """alias id -> canonical id, for those of `ids` that are linked."""
        found: dict[str, str] = {}
        for chunk in chunks(ids):
            found.update(
                conn.execute(
                    select(identities.c.alias_id, identities.c.canonical_id).where(
                        identities.c.alias_id.in_(chunk)
                    )
                ).all()
            )
        return found

    def ensure(self, conn: Connection, kinds: dict[str, str], now: float) -> None:
        """Create the profiles of `kinds` (id -> kind) that do not exist yet."""
        if not kinds:
            return
        conn.execute(
            self._backend.insert(profiles).on_conflict_do_nothing(index_elements=["id"]),
            [
                {"id": i, "kind": k, "traits": "{}", "trait_times": "{}", "updated_at": now}
                for i, k in sorted(kinds.items())
            ],
        )

    def load(self, conn: Connection, ids: Collection[str]) -> list[ProfileRow]:
        """The profiles of `ids`; locked until commit where rows lock (in id order, so
        concurrent ingestion in several processes cannot deadlock)."""
        rows: list[ProfileRow] = []
        for chunk in chunks(ids):
            query = select(
                profiles.c.id, profiles.c.kind, profiles.c.traits, profiles.c.trait_times
            ).where(profiles.c.id.in_(chunk))
            if self._backend.row_locks:
                query = query.order_by(profiles.c.id).with_for_update()
            rows.extend((r[0], r[1], r[2], r[3]) for r in conn.execute(query))
        return rows

    @staticmethod
    def merge(conn: Connection, source: str, target: str) -> None:
        """Move what hangs on profile `source` to `target`, and delete `source`."""
        conn.execute(
            update(identities)
            .where(identities.c.canonical_id == source)
            .values(canonical_id=target)
        )
        conn.execute(update(events).where(events.c.identity == source).values(identity=target))
        conn.execute(delete(computed_values).where(computed_values.c.profile_id == source))
        conn.execute(delete(profiles).where(profiles.c.id == source))

    def save_links(self, conn: Connection, links: dict[str, str], now: float) -> None:
        if links:
            conn.execute(
                self._backend.upsert(identities, ["alias_id"], only=["canonical_id"]),
                [
                    {"alias_id": a, "canonical_id": c, "created_at": now}
                    for a, c in sorted(links.items())
                ],
            )

    def save(self, conn: Connection, rows: Sequence[ProfileRow], now: float) -> None:
        if rows:
            conn.execute(
                self._backend.upsert(profiles, ["id"]),
                [
                    {"id": i, "kind": k, "traits": t, "trait_times": tt, "updated_at": now}
                    for i, k, t, tt in sorted(rows)
                ],
            )

    @staticmethod
    def add_events(conn: Connection, rows: Iterable[tuple[str, str, float, str]]) -> None:
        """(profile id, event name, timestamp, properties JSON) rows."""
        values = [
            {"identity": i, "name": n, "timestamp": t, "properties": p} for i, n, t, p in rows
        ]
        if values:
            conn.execute(insert(events), values)

    # -- reads and housekeeping --------------------------------------------------------------

    def resolve(self, id_: str) -> str:
        with self._db.read() as conn:
            canonical = conn.execute(
                select(identities.c.canonical_id).where(identities.c.alias_id == id_)
            ).scalar()
        return canonical if canonical is not None else id_

    def profile(self, id_: str) -> tuple[str, str, dict[str, Any]] | None:
        """(canonical id, kind, traits) of the profile `id_` belongs to, or None."""
        canonical = self.resolve(id_)
        with self._db.read() as conn:
            row = conn.execute(
                select(profiles.c.kind, profiles.c.traits).where(profiles.c.id == canonical)
            ).first()
        return None if row is None else (canonical, row.kind, json.loads(row.traits))

    def purge_events(
        self, before: float, limit: int, since: float | None = None
    ) -> tuple[int, float | None]:
        """Delete up to `limit` of the oldest events older than `before` and none older than
        `since`; the retention job's step. Returns how many, and the latest timestamp
        deleted: the next step's `since`, so each step reads ix_events_timestamp from where
        the last one stopped, not over the entries the steps before it left for vacuum.
        Commits as bookkeeping does: a step lost in a crash is done again by the next run."""
        with self._db.bookkeeping() as conn:
            query = select(events.c.id, events.c.timestamp).where(events.c.timestamp < before)
            if since is not None:
                query = query.where(events.c.timestamp >= since)
            rows = conn.execute(query.order_by(events.c.timestamp).limit(limit)).all()
            if rows:
                conn.execute(delete(events).where(events.c.id.in_([row.id for row in rows])))
            return len(rows), float(rows[-1].timestamp) if rows else since
