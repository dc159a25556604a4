"""Suppressions: which userIds and anonymousIds a regulation suppressed. Checked inside
the ingestion transaction (efd/store/ingestion.py) and by the audience syncs."""

from __future__ import annotations

from typing import TYPE_CHECKING

from sqlalchemy import Connection, select

from efd.store.schema import suppressions

if TYPE_CHECKING:
    from efd.store import Store


class Suppressions:
    """Owns the question "is this id suppressed?". On a single-process backend this process
    sees every change, so it skips the check while there are none; with several processes
    it always asks. Writes nothing: regulations (efd/store/regulations.py) add and remove
    suppressions and tell it through `changed`."""

    def __init__(self, store: Store) -> None:
        self._backend = store.backend
        self.none = False
        if self._backend.single_process:
            with store.database.read() as conn:
                self.none = self.empty(conn)

    def suppressed(self, conn: Connection, ids: set[str]) -> set[str]:
        """Which of these userIds/anonymousIds are suppressed."""
        if self.none:
            return set()
        return self._backend.members(conn, suppressions.c.subject_id, ids)

    def changed(self, none_left: bool) -> None:
        """A regulation changed the suppressions in a committed transaction; `none_left`:
        whether the table is empty now."""
        if self._backend.single_process:
            self.none = none_left

    @staticmethod
    def empty(conn: Connection) -> bool:
        return conn.execute(select(suppressions.c.subject_id).limit(1)).first() is None
