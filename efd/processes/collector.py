"""How efd's processes run Python's garbage collector: rarely, and never over what start-up
built (docs/decisions.md, "The garbage collector").

Almost all of the garbage a process makes is freed by reference counts as it is made; the
collector only finds cycles. Python's default runs a young collection every 700 container
allocations (2000 from 3.13), a few events' worth, and each walks every young object still
alive: a hundred times rarer costs the same per object and far less in all. What start-up
built lives as long as the process, so once serving it is frozen out of every later
collection."""

from __future__ import annotations

import gc

THRESHOLDS = (70_000, 10, 10)


def tune() -> None:
    """Before start-up: young collections a hundred times rarer than Python 3.11's default."""
    gc.set_threshold(*THRESHOLDS)


def freeze() -> None:
    """Once serving: collect what start-up left over, then keep every collection off the
    rest (a frozen object is still freed when its last reference goes)."""
    gc.collect()
    gc.freeze()
