"""SQLite: one process per file, statements compiled once and run on the driver's cursor,
the deduplication index in the writer's memory.

At delivery and ingestion rates SQLAlchemy's per-execution processing costs more than
SQLite's own work, so the hot statements are built with SQLAlchemy, compiled to SQLite's SQL
once, and executed on the sqlite3 cursor inside the same transaction.

Deduplication keys (efd/store/dedupe.py) are indexed in the writer connection's memory (an
attached in-memory database), filled from the messages of the last 24 hours when the writer
connects. One process writes a SQLite file (efd holds a lock), so no other process needs
it, and nothing is lost in a crash: the messages table is the truth, and the index is
rebuilt from it. Message ids are random, so an on-disk index of them takes a write at a
random page per message once it outgrows a commit, which slows ingestion as the table grows;
in memory it costs a few tens of bytes per message of the last 24 hours and under a second
to fill at start (docs/decisions.md, "Figures behind the code").
"""

from __future__ import annotations

import logging
import sqlite3
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from itertools import chain
from operator import attrgetter
from typing import Any

from sqlalchemy import (
    BigInteger,
    Column,
    ColumnElement,
    Connection,
    Engine,
    MetaData,
    PrimaryKeyConstraint,
    ScalarSelect,
    Table,
    bindparam,
    func,
    insert,
    select,
)
from sqlalchemy.dialects.sqlite import dialect as sqlite_dialect
from sqlalchemy.dialects.sqlite import insert as sqlite_insert

from efd.records import AttemptRow, DeliveryStatus, Outcome
from efd.store.backends.base import (
    ATTEMPT_COLUMNS,
    DELIVERY_COLUMNS,
    MESSAGE_COLUMNS,
    SHAPED_COLUMNS,
    Backend,
    chunked,
    driver_cursor,
    outcome_values,
)
from efd.store.dedupe import WINDOW_SECONDS
from efd.store.engine import make_engine
from efd.store.schema import attempts, deliveries, messages

log = logging.getLogger("efd.store")

SCHEMA = "dedupe"
PRUNE_EVERY_SECONDS = 300

# Not in schema.metadata: it lives in memory, never in a migration.
recent = Table(
    "recent",
    MetaData(),
    Column("message_key", BigInteger, nullable=False),
    Column("message_pk", BigInteger, nullable=False),
    # One b-tree sorted by key: half the memory of a rowid table plus an index.
    PrimaryKeyConstraint("message_key", "message_pk"),
    schema=SCHEMA,
    sqlite_with_rowid=False,
)

_SQLITE = sqlite_dialect()
_compiled: dict[tuple[Any, ...], tuple[str, list[str], dict[str, Any]]] = {}
_multirow: dict[tuple[str, int], str] = {}
_ROWS_PER_STATEMENT = 256
_IN_LIST = 512  # values per IN list: a power of two, so a padded chunk stays this long

_attempt_fields = attrgetter(*ATTEMPT_COLUMNS)
_OUTCOME_SQL: dict[int, str] = {}


def _record_outcomes_sql(rows: int) -> str:
    """An UPDATE of `rows` deliveries from a VALUES list of (id, token, status, attempts,
    first attempt, next attempt, finished, failed hooks, last error): applied where the
    delivery is still pending under that lease token."""
    sql = _OUTCOME_SQL.get(rows)
    if sql is None:
        values = ", ".join(["(?, ?, ?, ?, ?, ?, ?, ?, ?)"] * rows)
        sql = _OUTCOME_SQL[rows] = (
            "UPDATE deliveries SET status = v.column3, attempts = v.column4,"
            " first_attempt_at = v.column5, next_attempt_at = v.column6,"
            " finished_at = v.column7, failed_hooks = v.column8, last_error = v.column9,"
            f" lease_owner = NULL FROM (VALUES {values}) AS v"
            " WHERE deliveries.id = v.column1 AND deliveries.lease_token = v.column2"
            f" AND deliveries.status = '{DeliveryStatus.PENDING.value}'"
        )
    return sql


def compiled(
    key: tuple[Any, ...], build: Callable[[], Any]
) -> tuple[str, list[str], dict[str, Any]]:
    """SQLite SQL text of the statement `build()` makes, compiled once per key: the text, the
    order of its parameters, and the values of those the statement fixes itself (literals
    such as 'pending'). IN lists are rendered out, so their length belongs in the key."""
    cached = _compiled.get(key)
    if cached is None:
        done = build().compile(dialect=_SQLITE, compile_kwargs={"render_postcompile": True})
        cached = _compiled[key] = (str(done), list(done.positiontup or []), dict(done.params))
    return cached


def _positional(params: dict[str, Any], order: list[str], fixed: dict[str, Any]) -> tuple[Any, ...]:
    return tuple(params[n] if n in params else fixed[n] for n in order)


def _in_lists(values: Sequence[Any]) -> Iterator[list[Any]]:
    """`values` as IN lists of at most _IN_LIST, each lengthened to the next power of two by
    repeating its last value: the same matches, and a few statement texts instead of one per
    length, so SQLite's prepared statements stay in the driver's cache instead of being
    prepared again."""
    for chunk in chunked(values, _IN_LIST):
        size = 1 << (len(chunk) - 1).bit_length()
        yield [*chunk, *[chunk[-1]] * (size - len(chunk))]


def _chunk_sizes(count: int) -> Iterator[int]:
    """Full chunks, then the rest in powers of two: few distinct statements to prepare."""
    while count >= _ROWS_PER_STATEMENT:
        yield _ROWS_PER_STATEMENT
        count -= _ROWS_PER_STATEMENT
    size = _ROWS_PER_STATEMENT // 2
    while count:
        if count >= size:
            yield size
            count -= size
        size //= 2


def insert_many(
    cursor: Any,
    table: Table,
    columns: tuple[str, ...],
    rows: list[tuple[Any, ...]],
    *,
    or_ignore: bool = False,
) -> None:
    """INSERT `rows` (tuples in `columns` order, the table's) into `table`, many rows per statement.

    One statement per chunk means one call into SQLite, which runs with the GIL released:
    the event loop goes on parsing requests meanwhile. executemany would release and retake
    the GIL for every row, and each retake waits its turn behind the busy event loop.
    """

    def build() -> Any:
        statement = insert(table).values({c: bindparam(c) for c in columns})
        return statement.prefix_with("OR IGNORE") if or_ignore else statement

    sql, order, _ = compiled(("insert", table.fullname, columns, or_ignore), build)
    if order != list(columns):  # rows go to SQLite as they are, never reordered per row
        raise ValueError(f"{table.name}: columns {columns} are not in the table's order")
    head, _, group = sql.rpartition(" VALUES ")

    def statement(size: int) -> str:
        text = _multirow.get((sql, size))
        if text is None:
            text = _multirow[(sql, size)] = f"{head} VALUES {', '.join([group] * size)}"
        return text

    _in_chunks(cursor, rows, statement)


def _in_chunks(
    cursor: Any, rows: Sequence[tuple[Any, ...]], statement: Callable[[int], str]
) -> int:
    """Run `statement(n)` once per chunk of n rows, with the chunk's values in order as its
    parameters; how many rows the statements changed."""
    changed = 0
    start = 0
    for size in _chunk_sizes(len(rows)):
        cursor.execute(statement(size), list(chain.from_iterable(rows[start : start + size])))
        changed += cursor.rowcount
        start += size
    return changed


def attach(dbapi_connection: Any) -> None:
    """Give a new writer connection its empty in-memory index (ATTACH cannot run inside a
    transaction, so this happens at connect; `ensure` fills it)."""
    dbapi_connection.execute(f"ATTACH DATABASE ':memory:' AS {SCHEMA}")
    dbapi_connection.execute(
        f"CREATE TABLE {SCHEMA}.recent (message_key INTEGER NOT NULL, "
        "message_pk INTEGER NOT NULL, PRIMARY KEY (message_key, message_pk)) WITHOUT ROWID"
    )
    # One row once filled: kept in the same transactions as the keys, so a fill that is
    # rolled back is also forgotten, and done again.
    dbapi_connection.execute(f"CREATE TABLE {SCHEMA}.state (pruned_at REAL NOT NULL)")


def ensure(conn: Connection, now: float, window: float) -> None:
    """Fill this connection's index from the messages of the last `window` seconds the first
    time it is used, and drop keys older than the window every few minutes.

    Runs inside the caller's write transaction, so no message can be stored between the
    fill and the caller's own lookup."""
    pruned_at = conn.exec_driver_sql(f"SELECT pruned_at FROM {SCHEMA}.state").scalar()
    if pruned_at is None:
        started = time.monotonic()
        count = conn.exec_driver_sql(
            f"INSERT INTO {SCHEMA}.recent (message_key, message_pk) "
            "SELECT message_key, id FROM main.messages "
            "WHERE received_at > ? AND message_key IS NOT NULL ORDER BY message_key, id",
            (now - window,),
        ).rowcount
        conn.exec_driver_sql(f"INSERT INTO {SCHEMA}.state (pruned_at) VALUES (?)", (now,))
        log.info(
            "deduplication: %d messageIds of the last %g h indexed in memory in %.1f s",
            count,
            window / 3600,
            time.monotonic() - started,
        )
    elif now - pruned_at >= PRUNE_EVERY_SECONDS:
        # Every message with a smaller id was received before the window opened.
        [first] = conn.exec_driver_sql(
            "SELECT min(id) FROM main.messages WHERE received_at > ?", (now - window,)
        ).one()
        if first is None:
            conn.exec_driver_sql(f"DELETE FROM {SCHEMA}.recent")
        else:
            conn.exec_driver_sql(f"DELETE FROM {SCHEMA}.recent WHERE message_pk < ?", (first,))
        conn.exec_driver_sql(f"UPDATE {SCHEMA}.state SET pruned_at = ?", (now,))


class SqliteBackend(Backend):
    """SQLite's paths for the feature stores (efd/store/backends/base.py's `Backend`). Owns
    the fast cursor path and the in-memory deduplication index; holds no data itself."""

    name = "sqlite"
    single_process = True
    notifies = False
    percentiles = False
    row_locks = False
    indexes_message_keys = False
    clock: str | None = None

    def __init__(self, url: str) -> None:
        self.url = url
        self._synchronous = "FULL"

    def engines(self, *, synchronous: str, pool_size: int) -> tuple[Engine, Engine]:
        self._synchronous = synchronous
        writer = make_engine(self.url, writer=True, synchronous=synchronous, on_connect=attach)
        reader = make_engine(self.url, writer=False, synchronous=synchronous, pool_size=2)
        return writer, reader

    @contextmanager
    def bookkeeping(self, writer: Engine) -> Iterator[Connection]:
        """Only an acknowledged message must survive power loss (synchronous=FULL, an fsync
        per commit). Claims and outcomes may be lost with the last moments before a power
        cut: the delivery is then simply due again. So they commit without waiting for the
        disk (synchronous=NORMAL in WAL mode), and the next FULL commit flushes them too.
        A process crash loses nothing either way: committed pages are in the OS cache."""
        if self._synchronous != "FULL":
            with writer.begin() as conn:
                yield conn
            return
        with writer.connect() as conn:
            # On the driver connection: SQLAlchemy would open a transaction first, and the
            # safety level cannot change inside one.
            raw = conn.connection.driver_connection
            assert raw is not None
            raw.execute("PRAGMA synchronous=NORMAL")
            try:
                with conn.begin():
                    yield conn
            finally:
                raw.execute("PRAGMA synchronous=FULL")

    def insert(self, table: Table) -> Any:
        return sqlite_insert(table)

    def execute(
        self, conn: Connection, key: str, statement: Any, params: list[dict[str, Any]]
    ) -> list[tuple[Any, ...]]:
        sql, order, fixed = compiled((key,), lambda: statement)
        with driver_cursor(conn, sqlite3.Error) as cursor:
            if len(params) == 1:
                return list(cursor.execute(sql, _positional(params[0], order, fixed)))
            cursor.executemany(sql, [_positional(p, order, fixed) for p in params])
            return []

    def select(
        self, conn: Connection, key: str, build: Callable[[], Any], params: list[Any]
    ) -> list[Any]:
        sql, _, _ = compiled((key, len(params)), build)
        with driver_cursor(conn, sqlite3.Error) as cursor:
            rows: list[Any] = cursor.execute(sql, params).fetchall()
            if len(cursor.description) == 1:
                return [row[0] for row in rows]
            return rows

    def message_fields(
        self, conn: Connection, pks: Sequence[int]
    ) -> list[tuple[int, str, str | None, str, float, str | None]]:
        found: list[tuple[int, str, str | None, str, float, str | None]] = []
        for chunk in _in_lists(pks):

            def query(chunk: Sequence[int] = chunk) -> Any:
                return select(
                    messages.c.id,
                    messages.c.message_id,
                    messages.c.body,
                    messages.c.source,
                    messages.c.received_at,
                    messages.c.trace_context,
                ).where(messages.c.id.in_(chunk))

            found.extend(self.select(conn, "bodies", query, list(chunk)))
        return found

    def among(self, column: Column[Any], rows: ScalarSelect[Any]) -> ColumnElement[bool]:
        return column.in_(rows)

    def members(self, conn: Connection, column: Column[Any], values: set[str]) -> set[str]:
        found: set[str] = set()
        for chunk in chunked(sorted(values)):
            found.update(conn.execute(select(column).where(column.in_(chunk))).scalars())
        return found

    def prepare_writer(self, conn: Connection, now: float) -> None:
        ensure(conn, now, WINDOW_SECONDS)

    def recent_message_ids(
        self, conn: Connection, keys: Sequence[int], now: float
    ) -> set[tuple[str, str]]:
        since = now - WINDOW_SECONDS
        seen: set[tuple[str, str]] = set()
        ensure(conn, now, WINDOW_SECONDS)
        for chunk in _in_lists(sorted(set(keys))):

            def query(chunk: Sequence[int] = chunk) -> Any:
                return (
                    select(messages.c.source, messages.c.message_id)
                    .select_from(recent.join(messages, messages.c.id == recent.c.message_pk))
                    .where(recent.c.message_key.in_(chunk), messages.c.received_at > since)
                )

            # Compiled once per padded size; SQLAlchemy's expanding IN costs more than the
            # query itself at ingestion rates.
            found = self.select(conn, "recent", query, [*chunk, since])
            seen.update((source, message_id) for source, message_id in found)
        return seen

    def insert_messages(
        self, conn: Connection, rows: Sequence[tuple[Any, ...]], keys: Sequence[int], now: float
    ) -> Sequence[int]:
        # The hot path of ingestion. Under BEGIN IMMEDIATE this connection is the only
        # writer, so it numbers the rows itself, and one multi-row statement per chunk
        # replaces SQLAlchemy's per-row processing: about twice the throughput.
        [last] = self.select(conn, "last-id", lambda: select(func.max(messages.c.id)), [])
        first = (last or 0) + 1
        ids = range(first, first + len(rows))
        ensure(conn, now, WINDOW_SECONDS)
        with driver_cursor(conn, sqlite3.Error) as cursor:
            insert_many(
                cursor,
                messages,
                ("id", *MESSAGE_COLUMNS),
                [(pk, *t) for pk, t in zip(ids, rows, strict=True)],
            )
            # OR IGNORE: a key may remain from a deleted message whose id is reused.
            insert_many(
                cursor,
                recent,
                ("message_key", "message_pk"),
                list(zip(keys, ids, strict=True)),
                or_ignore=True,
            )
        return ids

    def insert_deliveries(
        self, conn: Connection, rows: Sequence[tuple[Any, ...]], *, numbered: bool = False
    ) -> Sequence[int]:
        if not numbered:
            with driver_cursor(conn, sqlite3.Error) as cursor:
                insert_many(cursor, deliveries, DELIVERY_COLUMNS, list(rows))
            return ()
        # The only writer numbers the rows itself, as insert_messages does.
        [last] = self.select(
            conn, "last-delivery-id", lambda: select(func.max(deliveries.c.id)), []
        )
        ids = range((last or 0) + 1, (last or 0) + 1 + len(rows))
        with driver_cursor(conn, sqlite3.Error) as cursor:
            insert_many(
                cursor,
                deliveries,
                ("id", *DELIVERY_COLUMNS),
                [(pk, *row) for pk, row in zip(ids, rows, strict=True)],
            )
        return ids

    def insert_shaped(self, conn: Connection, rows: Sequence[tuple[Any, ...]]) -> None:
        with driver_cursor(conn, sqlite3.Error) as cursor:
            insert_many(cursor, deliveries, SHAPED_COLUMNS, list(rows))

    def insert_attempts(self, conn: Connection, rows: Sequence[AttemptRow]) -> None:
        with driver_cursor(conn, sqlite3.Error) as cursor:
            insert_many(cursor, attempts, ATTEMPT_COLUMNS, [_attempt_fields(a) for a in rows])

    def record_outcomes(self, conn: Connection, outcomes: Sequence[Outcome]) -> int:
        # One UPDATE … FROM (VALUES …) per chunk instead of one UPDATE per outcome: one call
        # into SQLite (and one release of the GIL) for the whole chunk. Each VALUES row
        # matches at most one delivery (id and token), so the rows changed are the outcomes
        # applied.
        rows = [outcome_values(o) for o in outcomes]
        with driver_cursor(conn, sqlite3.Error) as cursor:
            return _in_chunks(cursor, rows, _record_outcomes_sql)

    def notify(self, conn: Connection) -> None:
        """Nothing to wake: one process serves the file, and its callers wake it."""

    async def listen(self, url: str, on_notify: Callable[[], None]) -> None:
        raise NotImplementedError("one process serves a SQLite file: nothing to listen for")

    def autovacuum_off(self, conn: Connection) -> bool:
        return False
