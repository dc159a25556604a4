"""A fake clock for efd.loop's workers: time moves only when a worker waits."""

from __future__ import annotations

import asyncio
import math


class FakeClock:
    """Time moves only when a worker waits out a timeout: each wait is recorded."""

    def __init__(self, start: float = 1_000.0) -> None:
        self.time = start
        self.waits: list[float] = []

    def now(self) -> float:
        return self.time

    def monotonic(self) -> float:
        return self.time

    async def wait(self, event: asyncio.Event, timeout: float) -> bool:
        self.waits.append(timeout)
        await asyncio.sleep(0)  # whoever is about to notify gets to run first
        if event.is_set():
            return True
        if math.isinf(timeout):
            await event.wait()
            return True
        self.time += timeout
        return False
