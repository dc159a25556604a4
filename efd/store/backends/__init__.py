"""One backend object per dialect, chosen once from the URL when the store is built."""

from efd.store.backends.base import Backend
from efd.store.backends.postgresql import PostgresBackend
from efd.store.backends.sqlite import SqliteBackend
from efd.store.engine import is_sqlite, normalise_url


def backend_for(url: str) -> Backend:
    """The backend for the database at `url`."""
    if is_sqlite(normalise_url(url)):
        return SqliteBackend(url)
    return PostgresBackend(url)


__all__ = ["Backend", "backend_for"]
