"""The engines and the backend every part of the store shares, and the store's edge.

Writes go through one writer engine (on a single-process database, one connection whose
transactions take the write lock up front: the single writer); reads use a separate engine
where the backend gives one, so /healthz and /metrics never queue behind a large commit.

Every transaction the parts open goes through `write`, `bookkeeping` or `read`, which turn
the driver's exceptions into efd's (efd/errors.py): StoreUnavailable when the database
cannot be reached or written now, StoreDataError when it refused a value it was given,
StoreError otherwise. Nothing above the store sees SQLAlchemy's or psycopg's types.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

from sqlalchemy import Connection
from sqlalchemy import exc as sa

from efd.errors import StoreDataError, StoreError, StoreUnavailable
from efd.store.backends import Backend, backend_for

# An open transaction, as the parts hand it to steps that run inside theirs (profile
# capture in ingestion): callers outside the store only pass it back to the store.
Transaction = Connection

_UNAVAILABLE = (sa.OperationalError, sa.InterfaceError, sa.TimeoutError, sa.DisconnectionError)
_SHOWN_CHARS = 300


def wrap(error: sa.SQLAlchemyError) -> StoreError:
    """efd's exception for a driver's: StoreUnavailable for a lost connection, a locked or
    full database, a pool timeout; StoreDataError for a value the database cannot hold
    (psycopg's and sqlite3's DataError family: text with U+0000 on PostgreSQL, a number out
    of range); StoreError for anything else."""
    unavailable = isinstance(error, _UNAVAILABLE) or getattr(error, "connection_invalidated", False)
    if unavailable:
        kind: type[StoreError] = StoreUnavailable
    elif isinstance(error, sa.DataError):
        kind = StoreDataError
    else:
        kind = StoreError
    return kind(described(error))


def described(error: BaseException) -> str:
    """The driver's exception class and its message's first line, bounded: what the logs
    and /readyz show. The rest (the parameters, PostgreSQL's DETAIL and CONTEXT) can quote
    the rows' values, which are clients' data."""
    cause = error.orig if isinstance(error, sa.DBAPIError) and error.orig is not None else error
    lines = str(cause).strip().splitlines()
    kind = type(cause)
    first = f"({kind.__module__}.{kind.__qualname__}) {lines[0] if lines else ''}".rstrip()
    return first if len(first) <= _SHOWN_CHARS else first[: _SHOWN_CHARS - 1] + "…"


@contextmanager
def edge() -> Iterator[None]:
    """Raise the driver's exceptions inside as efd's (see `wrap`)."""
    try:
        yield
    except sa.SQLAlchemyError as error:
        raise wrap(error) from error


class Database:
    """Owns the engines and the dialect's backend, chosen once here from the URL; opens the
    transactions the parts of the store run in. Holds no SQL of its own beyond a ping."""

    def __init__(self, url: str, *, synchronous: str = "FULL", pool_size: int = 5) -> None:
        self.url = url
        self.backend: Backend = backend_for(url)
        self.writer, self.reader = self.backend.engines(
            synchronous=synchronous, pool_size=pool_size
        )

    @contextmanager
    def write(self) -> Iterator[Connection]:
        """A write transaction on the writer, committed on leaving."""
        with edge(), self.writer.begin() as conn:
            yield conn

    @contextmanager
    def bookkeeping(self) -> Iterator[Connection]:
        """A write transaction whose loss in a power cut costs at most a duplicate delivery
        (the backend may commit it without waiting for the disk)."""
        with edge(), self.backend.bookkeeping(self.writer) as conn:
            yield conn

    @contextmanager
    def read(self) -> Iterator[Connection]:
        """A connection on the reader."""
        with edge(), self.reader.connect() as conn:
            yield conn

    @contextmanager
    def snapshot(self) -> Iterator[Connection]:
        """A read transaction on the reader: several queries see one state."""
        with edge(), self.reader.begin() as conn:
            yield conn

    def dispose(self) -> None:
        self.writer.dispose()
        if self.reader is not self.writer:
            self.reader.dispose()
