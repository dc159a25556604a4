"""The leases a dispatcher holds: which deliveries it claimed (id → fencing token) until their
outcome is written, kept alive by renewal, and how long after a database outage it leaves
lapsed leases to their holders.

Leases held (claimed, in flight, or waiting for their outcome to be written) are renewed
every quarter lease, so a slow outcome write never lets one lapse while the process is alive
and reaches the database. After a database error, leases that lapsed since are left alone
for half a lease once it answers again: time for their holder, whose renewals retry at once,
to take them back.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Awaitable, Callable, Sequence

from efd.errors import StoreError
from efd.loop import Clock

log = logging.getLogger(__name__)

Renew = Callable[[Sequence[tuple[int, int]], float], Awaitable[list[int]]]


class Leases:
    """Owns the held leases and their renewal; knows the store only by its `renew` call."""

    def __init__(self, lease: float, renew: Renew, clock: Clock) -> None:
        self.held: dict[int, int] = {}  # delivery id -> token, until its outcome is recorded
        self.renewed_until = 0.0  # every lease held at the last renewal runs until then
        self._lease = lease
        self._renew = renew
        self._clock = clock
        self._every = lease / 4
        self._retry = min(0.5, self._every / 2)
        self._trouble_since: float | None = None  # the first database error of an outage
        self._recovered_at: float | None = None  # its first success after
        self._task: asyncio.Task[None] | None = None

    def start(self) -> None:
        self._task = asyncio.create_task(self._run(), name="efd-lease-renewal")

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task

    def holds(self, delivery_id: int, token: int) -> bool:
        return self.held.get(delivery_id) == token

    def database_failed(self) -> None:
        if self._trouble_since is None or self._recovered_at is not None:
            self._trouble_since = self._clock.now()
            self._recovered_at = None

    def database_answered(self) -> None:
        if self._trouble_since is not None and self._recovered_at is None:
            self._recovered_at = self._clock.now()

    def lapsed_before(self, now: float) -> float:
        """Claims take a lapsed lease only if it ended before this: now, or, until half a
        lease after the database answered again, when the outage began."""
        if self._trouble_since is None:
            return now
        if self._recovered_at is not None and now - self._recovered_at >= self._lease / 2:
            self._trouble_since = self._recovered_at = None
            return now
        return self._trouble_since

    async def _run(self) -> None:
        while True:
            await asyncio.sleep(self._every)
            while self.held:
                held = list(self.held.items())
                now = self._clock.now()
                try:
                    taken = set(await self._renew(held, now + self._lease))
                except StoreError as error:
                    if self._trouble_since is None or self._recovered_at is not None:
                        # Once an outage: the renewal retries every half second.
                        log.error("cannot renew %d leases: %s; retrying", len(held), error)
                    self.database_failed()
                    await asyncio.sleep(self._retry)
                    continue
                self.database_answered()
                self.renewed_until = now + self._lease
                lost = 0
                for delivery_id, token in held:
                    if delivery_id in taken and self.held.get(delivery_id) == token:
                        del self.held[delivery_id]  # its outcome, if any, is stale
                        lost += 1
                if lost:
                    log.warning(
                        "%d claimed deliveries were taken by another claim before their "
                        "lease was renewed",
                        lost,
                    )
                break
