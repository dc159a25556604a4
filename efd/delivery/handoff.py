"""Fresh deliveries handed from ingestion's insert straight to the dispatcher.

A delivery stored while its destination has a free slot in this process is inserted leased
to the process, and handed to the dispatcher after the commit with the body ingestion
already holds: no claim reads it back from the table a moment later. Only where a claim
would have taken it at once anyway: a destination with nothing older waiting (its last
claim was short), not ordered (lanes decide the order), not rate-limited (a claim takes
the tokens), no hook's circuit open. What is handed over is an ordinary lease: renewed,
released at a stop, and due again for any process when it lapses after a crash.
"""

from __future__ import annotations

import threading

from efd.records import Claimed


class Room:
    """Free slots per destination: offered by the dispatcher (on the event loop), taken by
    ingestion's inserts (on the writer thread). A slot taken stays counted as taken until
    the insert's grant is settled, so an offer made meanwhile does not give it out twice."""

    def __init__(self, owner: str, lease_seconds: float) -> None:
        self.owner = owner
        self.lease_seconds = lease_seconds
        self._lock = threading.Lock()
        self._free: dict[str, int] = {}
        self._taken: dict[str, int] = {}  # by inserts whose grant is not settled yet
        self._closed = False

    def offer(self, destination: str, free: int) -> None:
        """`free` slots of `destination` may take fresh deliveries now (0: none)."""
        with self._lock:
            if self._closed:
                return
            self._free[destination] = max(0, free - self._taken.get(destination, 0))

    def withdraw(self, destination: str) -> int:
        """Offer no more slots of `destination` (until the next offer); how many inserts
        took and have not handed over yet."""
        with self._lock:
            self._free[destination] = 0
            return self._taken.get(destination, 0)

    def close(self) -> None:
        """No more fresh deliveries: the dispatcher is stopping."""
        with self._lock:
            self._closed = True
            self._free.clear()

    def grant(self) -> Grant:
        """A grant for one insert (one ingestion flush)."""
        return Grant(self)

    def take(self, destination: str, wanted: int) -> int:
        with self._lock:
            free = self._free.get(destination, 0)
            if free <= 0:
                return 0
            got = min(free, wanted)
            self._free[destination] = free - got
            self._taken[destination] = self._taken.get(destination, 0) + got
            return got

    def settle(self, taken: dict[str, int]) -> None:
        with self._lock:
            for destination, count in taken.items():
                left = self._taken.get(destination, 0) - count
                if left > 0:
                    self._taken[destination] = left
                else:
                    self._taken.pop(destination, None)


class Grant:
    """One insert's share of the room (efd.store.ingestion.Handoff): the slots it took, the
    deliveries it inserted leased to this process, and whether it left any pending one for
    a claim to find."""

    def __init__(self, room: Room) -> None:
        self.owner = room.owner
        self.lease_seconds = room.lease_seconds
        self.claimed: list[Claimed] = []  # set by the insert, used once it committed
        self.lease_until = 0.0
        self.left_pending = False
        self.short: set[str] = set()  # destinations with pending deliveries left to a claim
        self._room = room
        self._taken: dict[str, int] = {}
        self._settled = False

    def take(self, destination: str, wanted: int) -> int:
        """How many of `wanted` fresh deliveries to `destination` this insert may lease."""
        got = self._room.take(destination, wanted)
        if got:
            self._taken[destination] = self._taken.get(destination, 0) + got
        return got

    def settle(self) -> None:
        """The insert ended (committed or not): its slots are no longer counted as taken."""
        if not self._settled:
            self._settled = True
            self._room.settle(self._taken)
