"""SQLite's fast path: statements compiled once and run on the driver's cursor.

At delivery and ingestion rates SQLAlchemy's per-execution processing costs more than
SQLite's own work, so the queue's hot statements (efd/store/queue.py) are built with
SQLAlchemy, compiled to SQLite's SQL once, and executed on the sqlite3 cursor inside the
same transaction.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

from sqlalchemy import Connection, Table, bindparam, insert
from sqlalchemy.dialects.sqlite import dialect as sqlite_dialect
from sqlalchemy.exc import DBAPIError

_SQLITE = sqlite_dialect()
_compiled: dict[tuple[Any, ...], tuple[str, list[str], dict[str, Any]]] = {}


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


@contextmanager
def driver_cursor(conn: Connection) -> Iterator[Any]:
    """A sqlite3 cursor inside `conn`'s transaction, for the statements on the hot path.

    The driver's errors are raised as SQLAlchemy's, as every other statement's are, so
    callers handle one kind (a full disk is a 503, not a crash)."""
    cursor = conn.connection.driver_connection.cursor()  # type: ignore[union-attr]
    try:
        yield cursor
    except sqlite3.Error as error:
        raise DBAPIError(None, None, error) from error
    finally:
        cursor.close()


def positional(params: dict[str, Any], order: list[str], fixed: dict[str, Any]) -> tuple[Any, ...]:
    return tuple(params[n] if n in params else fixed[n] for n in order)


def query(conn: Connection, name: str, build: Callable[[], Any], params: list[Any]) -> list[Any]:
    """Run a SELECT on the sqlite3 connection, positional parameters in order. A one-column
    query gives its values, a wider one its rows."""
    sql, _, _ = compiled((name, len(params)), build)
    with driver_cursor(conn) as cursor:
        rows: list[Any] = cursor.execute(sql, params).fetchall()
        if len(cursor.description) == 1:
            return [row[0] for row in rows]
        return rows


_ROWS_PER_STATEMENT = 256


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
    """INSERT `rows` (tuples in `columns` order) into `table`, many rows per statement.

    One statement per chunk means one call into SQLite, which runs with the GIL released:
    the event loop goes on parsing requests meanwhile. executemany would release and retake
    the GIL for every row, and each retake waits its turn behind the busy event loop.
    """

    def build() -> Any:
        statement = insert(table).values({c: bindparam(c) for c in columns})
        return statement.prefix_with("OR IGNORE") if or_ignore else statement

    sql, order, _ = compiled(("insert", table.fullname, columns, or_ignore), build)
    if order != list(columns):
        positions = [columns.index(name) for name in order]
        rows = [tuple(row[i] for i in positions) for row in rows]
    head, _, group = sql.rpartition(" VALUES ")
    start = 0
    for size in _chunk_sizes(len(rows)):
        statement = _multirow.get((sql, size))
        if statement is None:
            statement = _multirow[(sql, size)] = f"{head} VALUES {', '.join([group] * size)}"
        cursor.execute(statement, [v for row in rows[start : start + size] for v in row])
        start += size


_multirow: dict[tuple[str, int], str] = {}
