"""How many deliveries a dispatcher holds ready per destination, beyond its free slots.

A freed slot starts the next round from what is held ready. The next claim starts when half
of it is left and waits its turn on the writer, behind ingestion's commits: half must outlast
that wait at the destination's rate, so a fast destination holds up to CEILING_PER_SLOT
rounds per slot of its hooks. A slow one holds FLOOR_PER_SLOT: with several processes on one
database, a small backlog to a slow receiver is then shared among them instead of sitting
with the first process to claim it.
"""

from __future__ import annotations

from collections.abc import Callable

FLOOR_PER_SLOT = 4
CEILING_PER_SLOT = 16
HORIZON = 0.25  # seconds of the destination's rounds held ready
WINDOW = 0.5  # seconds over which a destination's rate is counted


class Ahead:
    """Per destination: rounds answered, counted over WINDOW, give the size held ready.
    `monotonic` is the caller's clock (seconds that never go back)."""

    def __init__(
        self, max_per_hook: int, max_in_flight: int, monotonic: Callable[[], float]
    ) -> None:
        self._monotonic = monotonic
        self.floor = min(max_in_flight, FLOOR_PER_SLOT * max_per_hook)
        self.ceiling = min(max_in_flight, CEILING_PER_SLOT * max_per_hook)
        self._counted: dict[str, tuple[float, int]] = {}  # destination -> (since, answered)
        self._size: dict[str, int] = {}

    def answered(self, destination: str) -> None:
        """A round to `destination` ended."""
        now = self._monotonic()
        since, count = self._counted.get(destination, (now, 0))
        if now - since >= WINDOW:
            rate = (count + 1) / (now - since)
            self._size[destination] = max(self.floor, min(self.ceiling, int(rate * HORIZON)))
            self._counted[destination] = (now, 0)
        else:
            self._counted[destination] = (since, count + 1)

    def size(self, destination: str) -> int:
        """How many to hold ready for `destination`: the floor once no round to it has
        ended for a window, since its last rate no longer says anything."""
        now = self._monotonic()
        since, _ = self._counted.get(destination, (now, 0))
        if now - since >= 2 * WINDOW:
            return self.floor
        return self._size.get(destination, self.floor)
