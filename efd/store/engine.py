"""Engines: SQLite with the pragmas durability needs, or PostgreSQL through psycopg."""

from __future__ import annotations

import fcntl
import sqlite3
import time
from collections.abc import Callable
from pathlib import Path
from typing import IO, Any

from sqlalchemy import Engine, create_engine, event
from sqlalchemy import exc as sa
from sqlalchemy.engine import URL, make_url

# A pooled PostgreSQL connection idle this long is pinged before it is handed out.
PING_AFTER_IDLE = 1.0  # seconds


def normalise_url(url: str) -> URL:
    """Accept the URL forms operators write; pick the psycopg driver for PostgreSQL."""
    parsed = make_url(url)
    if parsed.drivername in ("postgres", "postgresql"):
        parsed = parsed.set(drivername="postgresql+psycopg")
    return parsed


def is_sqlite(url: URL) -> bool:
    return url.get_backend_name() == "sqlite"


def sqlite_path(url: URL) -> Path | None:
    if not is_sqlite(url) or not url.database or url.database == ":memory:":
        return None
    return Path(url.database)


def safe_url(url: str) -> str:
    """The URL with any password masked, fit for logs."""
    return normalise_url(url).render_as_string(hide_password=True)


def _bind_none_directly() -> None:
    """Have the sqlite3 module bind None as NULL without its adaptation lookup.

    The module adapts every parameter that is not exactly an int, float, str or bytearray.
    For None, with no adapter registered, that lookup fails through the protocol's and the
    object's attributes, and one of the two builds an AttributeError only to drop it: the
    writer binds several None values for each message, outcome and attempt. An adapter
    registered for None is found at once. `{}.get` returns None for any key and is a C
    function, so no Python frame runs per value either. Process-wide and idempotent."""
    empty: dict[None, None] = {}
    sqlite3.register_adapter(type(None), empty.get)


def make_engine(
    url: str,
    *,
    writer: bool,
    synchronous: str = "FULL",
    pool_size: int = 5,
    on_connect: Callable[[Any], None] | None = None,
) -> Engine:
    """An engine. On SQLite, a `writer` engine opens every transaction with BEGIN IMMEDIATE,
    and `on_connect` prepares each new writer connection.

    A deferred SQLite transaction that reads and then writes fails with "database is
    locked" when another connection wrote in between, whatever busy_timeout says; taking the
    write lock up front makes writers queue instead.

    Parameters are kept out of the driver's errors (hide_parameters): they are the rows'
    values, clients' data, and an error's text reaches logs and tracebacks.
    """
    parsed = normalise_url(url)
    if not is_sqlite(parsed):
        engine = create_engine(
            parsed, pool_size=pool_size, max_overflow=pool_size, hide_parameters=True
        )
        _ping_when_idle(engine)
        return engine
    _bind_none_directly()
    path = sqlite_path(parsed)
    if path is not None:
        path.parent.mkdir(parents=True, exist_ok=True)
    engine = create_engine(
        parsed, pool_size=1 if writer else pool_size, max_overflow=0, hide_parameters=True
    )

    @event.listens_for(engine, "connect")
    def _pragmas(dbapi_connection: Any, _record: Any) -> None:
        # Let SQLAlchemy's "begin" event, not the driver, open transactions.
        dbapi_connection.isolation_level = None
        cursor = dbapi_connection.cursor()
        cursor.execute("PRAGMA journal_mode=WAL")
        cursor.execute(f"PRAGMA synchronous={synchronous}")
        cursor.execute("PRAGMA busy_timeout=10000")
        cursor.execute("PRAGMA foreign_keys=ON")
        # Checkpoint ten times more rarely than SQLite's default. A checkpoint copies each
        # page once however often it changed since the last one, and ingestion rewrites the
        # same index pages many times over (docs/decisions.md, "Figures behind the code").
        cursor.execute("PRAGMA wal_autocheckpoint=10000")
        if writer and on_connect is not None:
            on_connect(dbapi_connection)
        cursor.close()

    @event.listens_for(engine, "begin")
    def _begin(connection: Any) -> None:
        connection.exec_driver_sql("BEGIN IMMEDIATE" if writer else "BEGIN")

    return engine


def _ping_when_idle(engine: Engine) -> None:
    """Ping a connection that sat in the pool, so one the server dropped meanwhile (a
    restart, an idle timeout) is replaced before a transaction fails on it. One in steady
    use is not pinged: a ping per checkout is a round trip per transaction, and a failure
    while busy fails the statement in flight anyway, which invalidates the pool."""

    @event.listens_for(engine, "checkin")
    def _idle_from(_dbapi_connection: Any, record: Any) -> None:
        record.info["efd_idle_since"] = time.monotonic()

    @event.listens_for(engine, "checkout")
    def _ping(dbapi_connection: Any, record: Any, _proxy: Any) -> None:
        since = record.info.get("efd_idle_since")
        if since is None or time.monotonic() - since < PING_AFTER_IDLE:
            return
        try:
            dbapi_connection.execute("SELECT 1")
            dbapi_connection.rollback()
        except Exception as error:  # the pool discards it and connects anew
            raise sa.DisconnectionError(str(error)) from error


class DatabaseInUse(Exception):
    """Another efd process holds the SQLite file."""


class SqliteLock:
    """One efd process per SQLite file: leases there are released at start-up, which is
    only safe when no other process can be delivering from the same file."""

    def __init__(self, database: Path) -> None:
        self.path = database.with_name(database.name + ".lock")
        self._handle: IO[str] | None = None

    def acquire(self) -> None:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        handle = self.path.open("a+")
        try:
            fcntl.flock(handle.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            handle.close()
            raise DatabaseInUse(
                f"another efd process is using {self.path.with_suffix('')}; "
                "SQLite serves one process (use PostgreSQL to run several)"
            ) from None
        self._handle = handle

    def release(self) -> None:
        if self._handle is not None:
            fcntl.flock(self._handle.fileno(), fcntl.LOCK_UN)
            self._handle.close()
            self._handle = None
