"""Deliveries a destination's filters or actions shaped at routing (docs/filters.md,
docs/actions.md): a pending one with a body of its own (and, an action's, the URL rendered
for its message), a finished `filtered` one that is never sent, or an action's `failed` one
whose mapping or request could not be made for its message. Inserted beside the plain
deliveries of ingestion (efd/store/ingestion.py), in the same transaction; a configuration
without filters or actions never comes here.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from sqlalchemy import Connection

from efd.records import DeliveryStatus, NewMessage
from efd.store.backends.base import SHAPED_COLUMNS, Backend


def rows(ids: Sequence[int], messages: Sequence[NewMessage], now: float) -> list[dict[str, Any]]:
    """The shaped and mapped deliveries of the messages stored under `ids`."""
    out: list[dict[str, Any]] = []
    for pk, message in zip(ids, messages, strict=True):
        for destination, body, filtered in message.shaped:
            row = _row(pk, destination, now)
            if filtered is None:
                row.update(status=DeliveryStatus.PENDING.value, next_attempt_at=now, body=body)
            else:
                row.update(
                    status=DeliveryStatus.FILTERED.value, finished_at=now, last_error=filtered
                )
            out.append(row)
        for route, body, url, error in message.mapped:
            row = _row(pk, route, now)
            if error is None:
                row.update(
                    status=DeliveryStatus.PENDING.value, next_attempt_at=now, body=body, url=url
                )
            else:
                row.update(status=DeliveryStatus.FAILED.value, finished_at=now, last_error=error)
            out.append(row)
    return out


def _row(pk: int, destination: str, now: float) -> dict[str, Any]:
    return {
        "message_pk": pk,
        "destination": destination,
        "attempts": 0,
        "created_at": now,
        "lease_token": 0,
    }


def join_lanes(
    shaped: list[dict[str, Any]],
    messages: dict[int, NewMessage],
    lane_of: Callable[[NewMessage, str], str | None],
) -> bool:
    """Put each pending one of an ordered destination in its lane, queued (efd/store/
    lanes.py admits the heads); whether any joined a lane."""
    joined = False
    for row in shaped:
        if row["status"] != DeliveryStatus.PENDING.value:
            continue
        lane = lane_of(messages[row["message_pk"]], row["destination"])
        if lane is not None:
            row.update(status=DeliveryStatus.QUEUED.value, next_attempt_at=None, lane=lane)
            joined = True
    return joined


def insert_rows(conn: Connection, backend: Backend, shaped: list[dict[str, Any]]) -> bool:
    """Insert them; whether any is to be sent (pending, or waiting in a lane)."""
    backend.insert_shaped(conn, [tuple(row.get(c) for c in SHAPED_COLUMNS) for row in shaped])
    sent = (DeliveryStatus.PENDING.value, DeliveryStatus.QUEUED.value)
    return any(r["status"] in sent for r in shaped)
