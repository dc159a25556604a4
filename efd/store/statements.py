"""Statement helpers the feature stores share: bounded IN lists, upserts, stored JSON."""

from __future__ import annotations

import json
from collections.abc import Callable, Collection, Iterator
from typing import Any

from sqlalchemy import Table
from sqlalchemy.dialects.postgresql import insert as pg_insert
from sqlalchemy.dialects.sqlite import insert as sqlite_insert

CHUNK = 500  # bound IN lists well below SQLite's variable limit


def chunks(items: Collection[str], size: int = CHUNK) -> Iterator[list[str]]:
    ordered = sorted(items)
    for start in range(0, len(ordered), size):
        yield ordered[start : start + size]


def insert_for(sqlite: bool) -> Callable[[Table], Any]:
    """The dialect's INSERT, which has ON CONFLICT on both."""
    return sqlite_insert if sqlite else pg_insert


def upsert(sqlite: bool, table: Table, keys: list[str], only: list[str] | None = None) -> Any:
    """INSERT that, on a conflict over `keys`, overwrites the row's other columns (or just
    `only`) with the new values."""
    statement = insert_for(sqlite)(table)
    columns = only or [c.name for c in table.columns if c.name not in keys]
    return statement.on_conflict_do_update(
        index_elements=keys, set_={c: statement.excluded[c] for c in columns}
    )


def dumps(value: Any) -> str:
    # ASCII escapes: a lone surrogate from a client must not break a UTF-8 database.
    return json.dumps(value, separators=(",", ":"))


_scan: Callable[[str, int], tuple[Any, int]] = json.JSONDecoder().scan_once  # type: ignore[attr-defined]


def loads(text: str) -> Any:
    """json.loads for the compact JSON efd itself stored: the C scanner without the
    whitespace handling around it, about twice as fast on small objects."""
    try:
        return _scan(text, 0)[0]
    except StopIteration:
        return json.loads(text)
