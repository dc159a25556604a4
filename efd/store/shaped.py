"""Deliveries a destination's filters shaped at routing (docs/filters.md): a pending one with
a body of its own, or a finished `filtered` one that is never sent. Inserted beside the plain
deliveries of ingestion (efd/store/ingestion.py), in the same transaction; a configuration
without filters never comes here.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from sqlalchemy import Connection, insert

from efd.rows import DeliveryStatus, NewMessage
from efd.store.schema import deliveries

_INSERT = insert(deliveries)


def rows(ids: Sequence[int], messages: Sequence[NewMessage], now: float) -> list[dict[str, Any]]:
    """The shaped deliveries of the messages stored under `ids`."""
    out: list[dict[str, Any]] = []
    for pk, message in zip(ids, messages, strict=True):
        for destination, body, filtered in message.shaped:
            row = {
                "message_pk": pk,
                "destination": destination,
                "attempts": 0,
                "created_at": now,
                "lease_token": 0,
            }
            if filtered is None:
                row.update(status=DeliveryStatus.PENDING.value, next_attempt_at=now, body=body)
            else:
                row.update(
                    status=DeliveryStatus.FILTERED.value, finished_at=now, last_error=filtered
                )
            out.append(row)
    return out


def insert_rows(conn: Connection, shaped: list[dict[str, Any]]) -> bool:
    """Insert them; whether any is pending (to be sent)."""
    pending = [r for r in shaped if r["status"] == DeliveryStatus.PENDING.value]
    filtered = [r for r in shaped if r["status"] != DeliveryStatus.PENDING.value]
    # Each group with the same keys: an executemany takes one statement's columns.
    for group in (pending, filtered):
        if group:
            conn.execute(_INSERT, group)
    return bool(pending)
