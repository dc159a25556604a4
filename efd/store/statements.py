"""Statement helpers the feature stores share: bounded IN lists, stored JSON, leases given
back."""

from __future__ import annotations

import json
from collections.abc import Callable, Collection, Iterator
from typing import Any

from sqlalchemy import Connection, Table, bindparam, update

from efd.records import DeliveryStatus

CHUNK = 500  # bound IN lists well below the databases' variable limits


def chunks(items: Collection[str], size: int = CHUNK) -> Iterator[list[str]]:
    ordered = sorted(items)
    for start in range(0, len(ordered), size):
        yield ordered[start : start + size]


def dumps(value: Any) -> str:
    # ASCII escapes: a lone surrogate from a client must not break a UTF-8 database.
    return json.dumps(value, separators=(",", ":"))


def hooks_json(hooks: Collection[str]) -> str | None:
    """A delivery's failed_hooks as stored: a sorted JSON list, or NULL for none."""
    return json.dumps(sorted(hooks)) if hooks else None


_scan: Callable[[str, int], tuple[Any, int]] = json.JSONDecoder().scan_once  # type: ignore[attr-defined]


def loads(text: str) -> Any:
    """json.loads for the compact JSON efd itself stored: the C scanner without the
    whitespace handling around it, about twice as fast on small objects."""
    try:
        return _scan(text, 0)[0]
    except StopIteration:
        return json.loads(text)


def release_leases(
    conn: Connection, table: Table, leases: Collection[tuple[int, int]], now: float
) -> None:
    """Give back leased rows of `table` (deliveries, batches) never sent: (id, token) where
    the token still matches and the row is pending, due again at `now`."""
    if not leases:
        return
    conn.execute(
        update(table)
        .where(
            table.c.id == bindparam("b_id"),
            table.c.lease_token == bindparam("b_token"),
            table.c.status == DeliveryStatus.PENDING.value,
        )
        .values(next_attempt_at=now, lease_owner=None),
        [{"b_id": pk, "b_token": token} for pk, token in leases],
    )
