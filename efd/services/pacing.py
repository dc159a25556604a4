"""How retention paces its transactions (pure: no I/O, no clock).

Every write goes through one writer per process, so a purge step holds up ingestion for as
long as it runs. After each step retention pauses in proportion to the step's own duration:
it holds at most `SHARE` of the writer's time whatever the backend or load, and a slower
writer slows it by as much. While steps come back full the walk is behind, and it takes
larger steps, which cost less per message (docs/decisions.md#retention-pacing).
"""

from __future__ import annotations

SHARE = 0.4  # of the writer's time retention may hold while it is behind
SMALL_STEP = 1000  # messages a step: the first of a run, and after a step that was not full
LARGE_STEP = 5000  # messages a step while the one before came back full


def pause_after(seconds: float, share: float = SHARE) -> float:
    """The pause after a step that held the writer `seconds`, so that steps take at most
    `share` of the time (0 < share <= 1; a share of 1 does not pause)."""
    if not 0.0 < share <= 1.0:
        raise ValueError(f"share must be in (0, 1], not {share}")
    return max(0.0, seconds) * (1.0 - share) / share


def next_step(looked_at: int, limit: int) -> int:
    """The size of the next step after one of `limit` that looked at `looked_at` messages:
    large while steps come back full (more waits beyond them), small otherwise."""
    return LARGE_STEP if looked_at >= limit else SMALL_STEP
