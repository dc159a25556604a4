"""PostgreSQL: several processes on one database, rows as one JSON array per column,
LISTEN/NOTIFY.

Each such statement's text is the same for any number of rows, so the driver and the
server parse and plan it once; a multi-row VALUES list (an executemany) is a new, long text
for every batch size, which the driver parses again on every execution (it caches only
short queries) and the server never gets to prepare.

The statements of ingestion, claims and outcomes are compiled once and run on psycopg's own
cursor inside the SQLAlchemy transaction, as on SQLite: SQLAlchemy's work per execution
costs about as much client CPU as psycopg's, and the writer runs them one after another.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable, Iterator, Sequence
from contextlib import contextmanager
from operator import attrgetter
from typing import Any

import psycopg
from sqlalchemy import (
    Column,
    ColumnElement,
    Connection,
    Engine,
    ScalarSelect,
    Table,
    any_,
    func,
    insert,
    text,
)
from sqlalchemy.dialects.postgresql import insert as pg_insert
from sqlalchemy.dialects.postgresql.psycopg import dialect as psycopg_dialect

from efd.errors import StoreUnavailable
from efd.records import AttemptRow, Outcome
from efd.store.backends.base import (
    ATTEMPT_COLUMNS,
    DELIVERY_COLUMNS,
    MESSAGE_COLUMNS,
    NOTIFY_CHANNEL,
    SHAPED_COLUMNS,
    Backend,
    driver_cursor,
    outcome_values,
)
from efd.store.dedupe import WINDOW_SECONDS
from efd.store.engine import make_engine, normalise_url
from efd.store.schema import deliveries

# The deduplication lookup: one index probe per key. As `message_key IN (...) AND
# received_at > ...` the planner seq-scans `messages` whenever its statistics are missing or
# stale (a fresh database, a restore, autovacuum off). Through LATERAL it plans one index
# probe per key even without statistics; OFFSET 0 keeps the subquery from being flattened
# into a join the planner could turn back into a scan.
RECENT_BY_KEY = text(
    "SELECT m.source, m.message_id"
    " FROM unnest(CAST(:r_keys AS BIGINT[])) AS k(key)"
    " CROSS JOIN LATERAL (SELECT source, message_id FROM messages"
    " WHERE message_key = k.key AND received_at > :r_since OFFSET 0) AS m"
)

TYPES = {
    "source": "TEXT",
    "message_id": "TEXT",
    "type": "TEXT",
    "user_id": "TEXT",
    "anonymous_id": "TEXT",
    "event": "TEXT",
    "timestamp": "DOUBLE PRECISION",
    "received_at": "DOUBLE PRECISION",
    "body": "TEXT",
    "trace_context": "TEXT",
    "original_timestamp": "DOUBLE PRECISION",
    "message_key": "BIGINT",
    "message_pk": "BIGINT",
    "destination": "TEXT",
    "status": "TEXT",
    "attempts": "INTEGER",
    "created_at": "DOUBLE PRECISION",
    "next_attempt_at": "DOUBLE PRECISION",
    "lease_token": "INTEGER",
    "lane": "TEXT",
    "lease_owner": "TEXT",
    "delivery_id": "BIGINT",
    "hook_url": "TEXT",
    "attempted_at": "DOUBLE PRECISION",
    "duration_ms": "DOUBLE PRECISION",
    "outcome": "TEXT",
    "status_code": "INTEGER",
    "error_class": "TEXT",
    "error": "TEXT",
    "response_head": "TEXT",
}


def json_rows_insert(table: str, columns: Sequence[str], *, returning: bool) -> Any:
    """INSERT of rows given as one JSON array per column (see `columns_json`), zipped by
    ROWS FROM. ORDER BY the ordinality makes the sequence hand out ids in the rows' order,
    so the returned ids, sorted, line up with the rows."""
    names = ", ".join(columns)
    values = ", ".join(f"CAST({c} AS {TYPES[c]})" for c in columns)
    return text(
        f"INSERT INTO {table} ({names}) SELECT {values} FROM {json_columns(columns)} ORDER BY n"
        + (" RETURNING id" if returning else "")
    )


def json_columns(columns: Sequence[str]) -> str:
    """A FROM item of the rows in `columns_json` parameters, as text, numbered by `n`."""
    elements = ", ".join(f"json_array_elements_text(CAST(:a_{c} AS JSON))" for c in columns)
    return f"ROWS FROM ({elements}) WITH ORDINALITY AS r({', '.join(columns)}, n)"


def columns_json(columns: Sequence[str], rows: Sequence[Sequence[Any]]) -> dict[str, str]:
    """Rows as one JSON array per column. The driver dumps a Python list into an array
    literal element by element in Python; the json module writes the same values in C, many
    times faster (docs/decisions.md, "Figures behind the code"). Numbers go as their JSON
    text and are cast back exactly (floats by their shortest round-trip repr)."""
    return {
        f"a_{c}": json.dumps([row[i] for row in rows], ensure_ascii=False, allow_nan=False)
        for i, c in enumerate(columns)
    }


def id_array(ids: Iterable[int]) -> str:
    """Integers as an array literal for `CAST(:x AS BIGINT[])`, without the driver's
    element-by-element dumping."""
    return "{" + ",".join(map(str, ids)) + "}"


_INSERT_MESSAGES = json_rows_insert("messages", MESSAGE_COLUMNS, returning=True)
_INSERT_DELIVERIES = json_rows_insert("deliveries", DELIVERY_COLUMNS, returning=False)
_INSERT_NUMBERED_DELIVERIES = json_rows_insert("deliveries", DELIVERY_COLUMNS, returning=True)
# A round's attempt rows as columns, like ingestion's rows: one fixed text, where an
# executemany sends a multi-row VALUES the driver parses again for every batch size.
_INSERT_ATTEMPTS = json_rows_insert("attempts", ATTEMPT_COLUMNS, returning=False)
_attempt_fields = attrgetter(*ATTEMPT_COLUMNS)

# The outcome UPDATE: one statement for the whole batch, its rows as JSON arrays. As one
# UPDATE a row (an executemany), each row is a statement of its own the server parses,
# plans and runs, and the driver sends and reads back. The WHERE is the per-row statement's:
# the id, the fencing token and `pending`, so a stale outcome matches nothing and is counted.
# Two things keep the plan an index probe by primary key whatever the statistics:
# `d.id = ANY(ids)`, without which the join, planned generically (a set-returning function
# assumed to give a hundred rows), hashes every delivery; and `pending` coming from the rows'
# side as `u.was`, kept there by OFFSET 0: as a constant it lets the planner add a scan of
# the whole partial due index to the probe.
_OUTCOME_COLUMNS = ("id", "token", "status", "attempts", "first_at", "next_at", "finished_at",
                    "failed", "error")  # fmt: skip
_OUTCOME_TYPES = {"id": "BIGINT", "token": "INTEGER", "attempts": "INTEGER",
                  "first_at": "DOUBLE PRECISION", "next_at": "DOUBLE PRECISION",
                  "finished_at": "DOUBLE PRECISION"}  # fmt: skip
_RECORD_OUTCOMES = text(
    "UPDATE deliveries AS d SET status = u.status, attempts = u.attempts,"
    " first_attempt_at = u.first_at, next_attempt_at = u.next_at, finished_at = u.finished_at,"
    " failed_hooks = u.failed, last_error = u.error, lease_owner = NULL"
    " FROM (SELECT "
    + ", ".join(
        f"CAST({c} AS {_OUTCOME_TYPES[c]}) AS {c}" if c in _OUTCOME_TYPES else c
        for c in _OUTCOME_COLUMNS
    )
    + ", CAST('pending' AS TEXT) AS was FROM "
    + json_columns(_OUTCOME_COLUMNS)
    + " OFFSET 0) AS u WHERE d.id = ANY(CAST(:ids AS BIGINT[])) AND d.id = u.id"
    " AND d.lease_token = u.token AND d.status = u.was"
)
# A claim's messages: one statement whatever their number, the ids as one array literal.
_MESSAGE_FIELDS = text(
    "SELECT id, message_id, body, source, received_at, trace_context FROM messages"
    " WHERE id = ANY(CAST(:ids AS BIGINT[]))"
)
_NOTIFY = text("SELECT pg_notify(:channel, '')")
# One round trip for both settings, for this transaction only.
_BOOKKEEPING = (
    "SELECT set_config('synchronous_commit', 'off', true),"
    " set_config('enable_seqscan', 'off', true)"
)


_PSYCOPG = psycopg_dialect()  # type: ignore[no-untyped-call]


class PostgresBackend(Backend):
    """PostgreSQL's paths for the feature stores (efd/store/backends/base.py's `Backend`):
    array statements, NOTIFY at commit and the LISTEN connection; holds no data itself."""

    name = "postgresql"
    single_process = False
    notifies = True
    percentiles = True
    row_locks = True
    indexes_message_keys = True
    clock: str | None = "EXTRACT(EPOCH FROM clock_timestamp())"

    def __init__(self, url: str) -> None:
        self.url = url
        self._members: dict[Column[Any], Any] = {}
        # Per statement: psycopg's SQL text and the values it fixes itself (literals).
        self._compiled: dict[Any, tuple[str, dict[str, Any]]] = {}

    def _run(
        self, conn: Connection, statement: Any, params: dict[str, Any]
    ) -> tuple[list[tuple[Any, ...]], int]:
        """`statement` on psycopg's cursor in `conn`'s transaction: its rows (none for a
        statement that returns none) and its row count."""
        compiled = self._compiled.get(statement)
        if compiled is None:
            done = statement.compile(dialect=_PSYCOPG)
            compiled = self._compiled[statement] = (str(done), dict(done.params))
        sql, fixed = compiled
        with driver_cursor(conn, psycopg.Error) as cursor:
            cursor.execute(sql, {**fixed, **params})
            rows = cursor.fetchall() if cursor.description is not None else []
            return rows, cursor.rowcount

    def engines(self, *, synchronous: str, pool_size: int) -> tuple[Engine, Engine]:
        engine = make_engine(self.url, writer=True, pool_size=pool_size)
        return engine, engine

    @contextmanager
    def bookkeeping(self, writer: Engine) -> Iterator[Connection]:
        """Claims and outcomes commit without waiting for the WAL's flush: one lost in a
        crash of the server costs a delivery sent twice, never a message.

        Their statements find rows by index, and are planned with sequential scans off: a
        plan PostgreSQL caches (generic, after psycopg prepares a statement at its fifth
        execution) is kept as the table grows, and one made while `deliveries` held a few
        rows scanned the whole table for every batch of outcomes from then on."""
        with writer.begin() as conn:
            with driver_cursor(conn, psycopg.Error) as cursor:
                cursor.execute(_BOOKKEEPING)
            yield conn

    def insert(self, table: Table) -> Any:
        return pg_insert(table)

    def execute(
        self, conn: Connection, key: str, statement: Any, params: list[dict[str, Any]]
    ) -> list[tuple[Any, ...]]:
        if len(params) == 1:
            return self._run(conn, statement, params[0])[0]
        result = conn.execute(statement, params)
        return [tuple(row) for row in result.all()] if result.returns_rows else []

    def select(
        self, conn: Connection, key: str, build: Callable[[], Any], params: list[Any]
    ) -> list[Any]:
        result = conn.execute(build())
        if len(result.keys()) == 1:
            return list(result.scalars())
        return list(result.all())

    def among(self, column: Column[Any], rows: ScalarSelect[Any]) -> ColumnElement[bool]:
        # As `IN (rows)` the planner may hash-join `rows` against a scan of the whole table
        # (it does below ~100,000 rows); `= ANY(ARRAY(rows))` computes the ids first and
        # probes the index for each.
        return column == any_(func.array(rows))

    def members(self, conn: Connection, column: Column[Any], values: set[str]) -> set[str]:
        # One statement whatever the count, the values as one JSON array (see columns_json);
        # = ANY(ARRAY(...)) is planned as index probes.
        query = self._members.get(column)
        if query is None:
            table = column.table.name
            query = self._members[column] = text(
                f"SELECT {column.name} FROM {table} WHERE {column.name} ="
                " ANY(ARRAY(SELECT json_array_elements_text(CAST(:ids AS JSON))))"
            )
        ids = json.dumps(sorted(values), ensure_ascii=False)
        return set(conn.execute(query, {"ids": ids}).scalars())

    def message_fields(
        self, conn: Connection, pks: Sequence[int]
    ) -> list[tuple[int, str, str | None, str, float, str | None]]:
        return self._run(conn, _MESSAGE_FIELDS, {"ids": id_array(pks)})[0]

    def prepare_writer(self, conn: Connection, now: float) -> None:
        """The deduplication index is a table index: nothing to fill."""

    def recent_message_ids(
        self, conn: Connection, keys: Sequence[int], now: float
    ) -> set[tuple[str, str]]:
        rows, _ = self._run(
            conn,
            RECENT_BY_KEY,
            {"r_keys": id_array(sorted(set(keys))), "r_since": now - WINDOW_SECONDS},
        )
        return {(source, message_id) for source, message_id in rows}

    def insert_messages(
        self, conn: Connection, rows: Sequence[tuple[Any, ...]], keys: Sequence[int], now: float
    ) -> Sequence[int]:
        ids, _ = self._run(conn, _INSERT_MESSAGES, columns_json(MESSAGE_COLUMNS, rows))
        return sorted(pk for (pk,) in ids)

    def insert_deliveries(
        self, conn: Connection, rows: Sequence[tuple[Any, ...]], *, numbered: bool = False
    ) -> Sequence[int]:
        params = columns_json(DELIVERY_COLUMNS, rows)
        if not numbered:
            self._run(conn, _INSERT_DELIVERIES, params)
            return ()
        ids, _ = self._run(conn, _INSERT_NUMBERED_DELIVERIES, params)
        return sorted(pk for (pk,) in ids)

    def insert_shaped(self, conn: Connection, rows: Sequence[tuple[Any, ...]]) -> None:
        conn.execute(
            insert(deliveries), [dict(zip(SHAPED_COLUMNS, row, strict=True)) for row in rows]
        )

    def insert_attempts(self, conn: Connection, rows: Sequence[AttemptRow]) -> None:
        params = columns_json(ATTEMPT_COLUMNS, [_attempt_fields(a) for a in rows])
        self._run(conn, _INSERT_ATTEMPTS, params)

    def record_outcomes(self, conn: Connection, outcomes: Sequence[Outcome]) -> int:
        rows = [outcome_values(o) for o in outcomes]
        params = columns_json(_OUTCOME_COLUMNS, rows)
        params["ids"] = id_array(o.delivery_id for o in outcomes)
        return self._run(conn, _RECORD_OUTCOMES, params)[1]

    def notify(self, conn: Connection) -> None:
        """Delivered at commit, to every process's LISTEN: none waits for a poll."""
        self._run(conn, _NOTIFY, {"channel": NOTIFY_CHANNEL})

    async def listen(self, url: str, on_notify: Callable[[], None]) -> None:
        conninfo = (
            normalise_url(url).set(drivername="postgresql").render_as_string(hide_password=False)
        )
        try:
            async with await psycopg.AsyncConnection.connect(
                conninfo, autocommit=True, connect_timeout=5
            ) as conn:
                await conn.execute(f"LISTEN {NOTIFY_CHANNEL}")
                on_notify()  # anything stored while nothing was listening
                async for _ in conn.notifies():
                    on_notify()
        except psycopg.Error as error:
            raise StoreUnavailable(f"the LISTEN connection failed: {error}") from error

    def autovacuum_off(self, conn: Connection) -> bool:
        return conn.execute(text("SHOW autovacuum")).scalar() == "off"
