"""Ordered delivery's lanes (pure: no I/O): which lane a message joins, and what a lane
is doing, as operators see it.

A destination with `ordering = "per_user"` sends one message of a lane at a time, in the
order efd acknowledged them: a later one waits until the one before it has an outcome
(delivered, failed for good, expired, or discarded). Lanes are apart from each other: a
lane whose head is retrying holds only itself. docs/delivery.md, "Ordered delivery".
"""

from __future__ import annotations

from collections.abc import Iterable
from enum import StrEnum

from efd.records import NewMessage


class Ordering(StrEnum):
    NONE = "none"  # each message on its own (no lane)
    PER_USER = "per_user"  # one lane per user of the destination


ORDERINGS = tuple(o.value for o in Ordering)


def lane_key(user_id: str | None, anonymous_id: str | None) -> str | None:
    """The lane a message joins: its userId, else its anonymousId.

    Every type reads the same two fields: an `alias` joins the lane of its userId (the id
    the user is known by from now on, not the previousId it retires), a `group` that of
    its userId, else its anonymousId. A message with neither (validation lets none through;
    only messages efd makes itself could lack both) joins no lane: it is sent on its own,
    as on a destination without ordering."""
    if user_id is not None:
        return user_id
    return anonymous_id


def lane_for(ordering: Ordering | str, user_id: str | None, anonymous_id: str | None) -> str | None:
    """The lane of a message to a destination with `ordering`; None: no lane."""
    if ordering != Ordering.PER_USER:
        return None
    return lane_key(user_id, anonymous_id)


class Lanes:
    """The lanes of the ordered destinations of a configuration: the store asks it, for each
    delivery it inserts, which lane the delivery joins (efd/store/queue.py)."""

    def __init__(self, ordered: Iterable[str]) -> None:
        self.ordered = frozenset(ordered)  # the destinations with ordering = "per_user"

    def lane(self, row: NewMessage, destination: str) -> str | None:
        if destination not in self.ordered:
            return None
        return lane_key(row.user_id, row.anonymous_id)


def waiting_note(head_message_id: str | None) -> str:
    """What a waiting message of a lane waits for, in words."""
    if head_message_id is None:
        return "waits for its lane's earlier message to be stored (moments)"
    return f"waits for message {head_message_id}, ahead of it in its lane, to have an outcome"
