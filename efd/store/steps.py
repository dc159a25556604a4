"""The steps of the store's transactions that depend on the configuration.

Ingestion checks suppressions, captures profiles while an audience or computed trait is
configured, and puts the deliveries of ordered destinations in lanes; the delivery queue
hands a lane on when its head finishes. Which of these run is the daemon's to decide
(efd/daemon/components.py derives them from the settings); the store asks for them through
the function it was built with, once per transaction, so a reload takes effect at the next
one and a transaction never sees half of a change.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Protocol

from sqlalchemy import Connection

from efd.records import NewMessage


class Suppressed(Protocol):
    def suppressed(self, conn: Connection, ids: set[str]) -> set[str]:
        """Which of these userIds/anonymousIds are suppressed."""
        ...


# Profile capture (efd/personas/capture.py): the stored rows folded into profiles.
Capture = Callable[[Connection, Sequence[NewMessage]], None]


class Lanes(Protocol):
    def lane(self, row: NewMessage, destination: str) -> str | None:
        """The lane a delivery of `row` to `destination` joins; None: no lane (unordered)."""
        ...


@dataclass(frozen=True, slots=True)
class Steps:
    """None: the step is not taken."""

    suppressions: Suppressed | None = None  # efd/store/suppressions.py
    capture: Capture | None = None  # efd/personas/capture.py
    lanes: Lanes | None = None  # efd/delivery/lanes.py, while a destination is ordered

    @property
    def ordered(self) -> bool:
        """Recorded outcomes hand lanes on (efd/store/lanes.py)."""
        return self.lanes is not None


NO_STEPS = Steps()

# What the store calls for the steps of the transaction it is about to run.
StepsSource = Callable[[], Steps]


def no_steps() -> Steps:
    return NO_STEPS
