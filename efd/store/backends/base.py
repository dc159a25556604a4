"""What the feature stores may ask of a database dialect: capability flags and the few
operations whose statements or execution paths differ between dialects.

The feature stores (ingestion.py, queue.py, …) write their SQL once with SQLAlchemy and ask
the backend only where a dialect needs its own path; they never test the dialect's name.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from contextlib import AbstractContextManager, contextmanager
from typing import Any, Protocol

from sqlalchemy import Column, ColumnElement, Connection, Engine, ScalarSelect, Table
from sqlalchemy.exc import DBAPIError

from efd.records import AttemptRow, Outcome
from efd.store.statements import hooks_json

NOTIFY_CHANNEL = "efd_deliveries"


class Backend(Protocol):
    """One dialect's paths, chosen once when the store is built (efd/store/backends). The
    backends subclass it, inheriting what is the same on every dialect (`upsert`)."""

    name: str
    # One process per database (the file is locked): leases left by a previous run can be
    # released at start, and a process may cache what only it can change.
    single_process: bool
    # Commits can wake other processes (LISTEN/NOTIFY); without, polling finds the work.
    notifies: bool
    # The database computes percentiles itself (percentile_cont).
    percentiles: bool
    # SELECT … FOR UPDATE locks rows until commit (meaningful with several processes).
    row_locks: bool
    # messages.message_key is indexed in the table (else only in the writer's memory).
    indexes_message_keys: bool
    # SQL giving the database server's clock in UNIX seconds, for times several processes
    # compare (rate limits' buckets); None: the one process's own clock serves.
    clock: str | None

    def engines(self, *, synchronous: str, pool_size: int) -> tuple[Engine, Engine]:
        """(writer, reader) engines for this database; the same engine twice when one pool
        serves both."""
        ...

    def bookkeeping(self, writer: Engine) -> AbstractContextManager[Connection]:
        """A write transaction whose loss in a power cut costs at most a duplicate delivery
        (claims and outcomes: the delivery is then due again)."""
        ...

    def insert(self, table: Table) -> Any:
        """The dialect's INSERT for `table`, which has ON CONFLICT."""
        ...

    def upsert(self, table: Table, keys: list[str], only: list[str] | None = None) -> Any:
        """INSERT that, on a conflict over `keys`, overwrites the row's other columns (or just
        `only`) with the new values. Written once for both dialects: each one's `insert`
        builds ON CONFLICT DO UPDATE alike."""
        statement = self.insert(table)
        columns = only or [c.name for c in table.columns if c.name not in keys]
        return statement.on_conflict_do_update(
            index_elements=keys, set_={c: statement.excluded[c] for c in columns}
        )

    def execute(
        self, conn: Connection, key: str, statement: Any, params: list[dict[str, Any]]
    ) -> list[tuple[Any, ...]]:
        """Run a statement built once (named parameters), with one or many parameter sets;
        the rows of a single execution that returns any. `key` names the statement."""
        ...

    def select(
        self, conn: Connection, key: str, build: Callable[[], Any], params: list[Any]
    ) -> list[Any]:
        """Rows of the SELECT `build()` makes (`params`: its bound values in order, with
        their count part of the statement's identity); a one-column query gives values."""
        ...

    def among(self, column: Column[Any], rows: ScalarSelect[Any]) -> ColumnElement[bool]:
        """`column IN (rows)`, planned as probes of `column`'s index whatever the table's
        size and statistics."""
        ...

    def members(self, conn: Connection, column: Column[Any], values: set[str]) -> set[str]:
        """Which of `values` appear in the text column `column`."""
        ...

    def message_fields(
        self, conn: Connection, pks: Sequence[int]
    ) -> list[tuple[int, str, str | None, str, float, str | None]]:
        """(id, message_id, body, source, received_at, trace_context) of the messages with
        these ids, as a claim sends them."""
        ...

    def prepare_writer(self, conn: Connection, now: float) -> None:
        """Make the writer ready for ingestion (fill any in-memory index) in `conn`."""
        ...

    def recent_message_ids(
        self, conn: Connection, keys: Sequence[int], now: float
    ) -> set[tuple[str, str]]:
        """(source, messageId) of the messages received within the deduplication window
        before `now` whose message_key is in `keys`."""
        ...

    def insert_messages(
        self, conn: Connection, rows: Sequence[tuple[Any, ...]], keys: Sequence[int], now: float
    ) -> Sequence[int]:
        """Insert message rows (tuples in MESSAGE_COLUMNS order, the key last); their ids, in
        the rows' order."""
        ...

    def insert_deliveries(
        self, conn: Connection, rows: Sequence[tuple[Any, ...]], *, numbered: bool = False
    ) -> Sequence[int]:
        """Insert delivery rows (tuples in DELIVERY_COLUMNS order); with `numbered`, their
        ids in the rows' order (else none)."""
        ...

    def insert_shaped(self, conn: Connection, rows: Sequence[tuple[Any, ...]]) -> None:
        """Insert the deliveries routing shaped or mapped (tuples in SHAPED_COLUMNS order)."""
        ...

    def insert_attempts(self, conn: Connection, rows: Sequence[AttemptRow]) -> None: ...

    def record_outcomes(self, conn: Connection, outcomes: Sequence[Outcome]) -> int:
        """Apply outcomes fenced by lease token on pending rows; how many rows changed."""
        ...

    def notify(self, conn: Connection) -> None:
        """Wake every process's dispatcher at commit, where the dialect can."""
        ...

    async def listen(self, url: str, on_notify: Callable[[], None]) -> None:
        """One connection that listens: call `on_notify` once listening and for each
        notification, until cancelled; raise StoreUnavailable when the connection fails."""
        ...

    def autovacuum_off(self, conn: Connection) -> bool:
        """Whether the server runs with autovacuum off."""
        ...


# Columns of the message and delivery inserts, named as NewMessage's attributes (the key
# computed from source and messageId last), in the table's order: the SQLite insert then
# passes rows as they are.
MESSAGE_FIELDS = (
    "source",
    "message_id",
    "type",
    "user_id",
    "anonymous_id",
    "event",
    "timestamp",
    "original_timestamp",
    "received_at",
    "body",
    "trace_context",
)
MESSAGE_COLUMNS = (*MESSAGE_FIELDS, "message_key")
DELIVERY_COLUMNS = (
    "message_pk",
    "destination",
    "status",
    "attempts",
    "created_at",
    "next_attempt_at",
    "lease_owner",
    "lease_token",
    "lane",
)  # in the table's order: the SQLite insert then passes rows as they are
# The deliveries routing shapes (a filter's body) or maps (an action's body and URL), finished
# at once or pending, in the table's order.
SHAPED_COLUMNS = (
    "message_pk",
    "destination",
    "status",
    "attempts",
    "created_at",
    "next_attempt_at",
    "finished_at",
    "last_error",
    "lease_token",
    "body",
    "lane",
    "url",
)
ATTEMPT_COLUMNS = (
    "delivery_id",
    "hook_url",
    "attempted_at",
    "duration_ms",
    "outcome",
    "status_code",
    "error_class",
    "error",
    "response_head",
)


@contextmanager
def driver_cursor(conn: Connection, errors: type[Exception]) -> Iterator[Any]:
    """A cursor of the driver's own inside `conn`'s transaction, for the statements on the
    hot path: SQLAlchemy's work per execution costs more than these statements' own.

    The driver's `errors` are raised as SQLAlchemy raises them for every other statement, so
    the store's edge (efd/store/database.py) classifies them all alike. A connection such an
    error left broken is invalidated when the transaction rolls back (SQLAlchemy's dialect
    checks the driver's connection then), so the pool never hands it out again."""
    cursor = conn.connection.driver_connection.cursor()  # type: ignore[union-attr]
    try:
        yield cursor
    except errors as error:
        raise DBAPIError.instance(None, None, error, errors) from error
    finally:
        cursor.close()


def chunked(items: Sequence[Any], size: int = 500) -> Iterator[Sequence[Any]]:
    """Bound IN lists well below the databases' variable limits."""
    for start in range(0, len(items), size):
        yield items[start : start + size]


def outcome_values(o: Outcome) -> tuple[Any, ...]:
    """An outcome as the backends' UPDATE takes it: (id, token, status, attempts,
    first_attempt_at, next_attempt_at, finished_at, failed_hooks as stored, last_error)."""
    return (
        o.delivery_id,
        o.lease_token,
        o.status.value,
        o.attempts,
        o.first_attempt_at,
        o.next_attempt_at,
        o.finished_at,
        hooks_json(o.failed_hooks),
        o.last_error,
    )
