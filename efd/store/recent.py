"""The newest stored messages with each destination's delivery state, for the console's
feed when it opens. Synchronous; the daemon runs it in a reader thread. Reads at most
`limit` messages (by ix_messages_received_at) and their deliveries (by
ix_deliveries_message_pk): its cost does not grow with the tables."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from sqlalchemy import select

from efd.store.schema import deliveries, messages

if TYPE_CHECKING:
    from efd.store import Store


@dataclass(frozen=True, slots=True)
class RecentMessage:
    source: str
    message_id: str
    type: str
    user_id: str | None
    event: str | None
    received_at: float
    # destination -> its delivery's state (the latest one's, when replays were made): the
    # status, but "failing" for a pending delivery that has been tried, as the live feed says
    states: dict[str, str]


def _state(status: str, attempts: int) -> str:
    # A retry is due: the console shows it as the live stream does after a failed attempt.
    return "failing" if status == "pending" and attempts > 0 else status


class RecentMessages:
    """Reads the newest messages; writes nothing."""

    def __init__(self, store: Store) -> None:
        self._db = store.database

    def newest(self, limit: int) -> list[RecentMessage]:
        """The newest `limit` messages, newest first."""
        with self._db.read() as conn:
            rows = conn.execute(
                select(
                    messages.c.id,
                    messages.c.source,
                    messages.c.message_id,
                    messages.c.type,
                    messages.c.user_id,
                    messages.c.event,
                    messages.c.received_at,
                )
                .order_by(messages.c.received_at.desc(), messages.c.id.desc())
                .limit(limit)
            ).all()
            states: dict[int, dict[str, str]] = {row.id: {} for row in rows}
            if rows:
                found = conn.execute(
                    select(
                        deliveries.c.message_pk,
                        deliveries.c.destination,
                        deliveries.c.status,
                        deliveries.c.attempts,
                    )
                    .where(deliveries.c.message_pk.in_(list(states)))
                    .order_by(deliveries.c.id)
                )
                # Ordered by id: a replay, made later, overrides its original.
                for pk, destination, status, attempts in found:
                    states[pk][destination] = _state(status, attempts)
        return [
            RecentMessage(
                row.source,
                row.message_id,
                row.type,
                row.user_id,
                row.event,
                float(row.received_at),
                dict(sorted(states[row.id].items())),
            )
            for row in rows
        ]
