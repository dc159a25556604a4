"""Deliveries a destination's filters shaped at routing (docs/filters.md): a pending one with
a body of its own, or a finished `filtered` one that is never sent. Inserted beside the plain
deliveries of ingestion (efd/store/queue.py), in the same transaction; a configuration
without filters never comes here.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from sqlalchemy import Connection

from efd.rows import DeliveryStatus, NewMessage
from efd.store import fastpath, pgpath
from efd.store.schema import deliveries

_FIELDS = (
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
)
_PG_INSERT = pgpath.unnest_insert("deliveries", _FIELDS, returning=False)


def rows(ids: Sequence[int], messages: Sequence[NewMessage], now: float) -> list[tuple[Any, ...]]:
    """The shaped deliveries of the messages stored under `ids`, as rows in _FIELDS order."""
    out: list[tuple[Any, ...]] = []
    for pk, message in zip(ids, messages, strict=True):
        for destination, body, filtered in message.shaped:
            if filtered is None:
                out.append(
                    (pk, destination, DeliveryStatus.PENDING, 0, now, now, None, None, 0, body)
                )
            else:
                out.append(
                    (pk, destination, DeliveryStatus.FILTERED, 0, now, None, now, filtered, 0, None)
                )
    return out


def insert(conn: Connection, sqlite: bool, shaped: list[tuple[Any, ...]]) -> None:
    if sqlite:
        with fastpath.driver_cursor(conn) as cursor:
            fastpath.insert_many(cursor, deliveries, _FIELDS, shaped)
    else:
        conn.execute(_PG_INSERT, pgpath.arrays(_FIELDS, shaped))
