"""How retention paces its transactions (pure: no I/O, no clock).

Every write goes through one writer per process, so a purge step holds up ingestion for as
long as it runs, and takes a share of the CPU ingestion would use. A step yields to the other
writes: it starts only when no other write waits for the writer and none has ended for as
long as the last step took (a writer that ingestion keeps busy has short gaps between its
writes while the event loop reads the next requests, and a client waiting for its answer
sends the next request only after it), and else defers and looks again a little later. So retention
takes what the writer has left over, all of it when nothing else writes, and delays another
write by at most one step. Only so long, though: a step that has deferred long enough for the
steps to fall below `FLOOR_SHARE` of the writer's time runs whatever waits, so that retention
keeps that share of a writer the others saturate and the database never grows without bound
(docs/decisions.md#retention-pacing). While steps come back full the walk is behind, and it
takes larger steps, which cost less per message; but a step that ran while other writes
wanted the writer, or that one queued behind, is followed by a short one, since a write
queued behind a step waits for all of it.
"""

from __future__ import annotations

FLOOR_SHARE = 0.1  # of the writer's time retention keeps however busy the others keep it
SMALL_STEP = 1000  # messages a step: the first of a run, and after a step that was not full
LARGE_STEP = 5000  # messages a step while the one before came back full
# Messages a step after one that other writes wanted the writer during: short, so that a
# write queued behind one waits little.
CONTENDED_STEP = 500
LOOK_AGAIN_MIN = 0.001  # seconds: the shortest wait before a deferred step looks again
LOOK_AGAIN_MAX = 0.02  # seconds: the longest, so an idle writer is taken up soon


def pause_after(seconds: float, share: float) -> float:
    """The pause after a step that held the writer `seconds`, so that steps take at most
    `share` of the time (0 < share <= 1; a share of 1 does not pause)."""
    if not 0.0 < share <= 1.0:
        raise ValueError(f"share must be in (0, 1], not {share}")
    return max(0.0, seconds) * (1.0 - share) / share


def contended(waiting: int, quiet: float, last: float) -> bool:
    """Whether other writes want the writer: some wait for it (`waiting` queued), or one
    ended less than `quiet` seconds ago, sooner than the last step took (`last` seconds)."""
    return waiting > 0 or quiet < last


def may_step(
    waiting: int, quiet: float, since_last: float, last: float, floor: float = FLOOR_SHARE
) -> bool:
    """Whether a step may start now: when the writer is not contended (no other write waits
    and none has ended for as long as the last step held the writer); or when `since_last`
    seconds since that step ended are enough for steps to keep `floor` of the writer's time."""
    return not contended(waiting, quiet, last) or since_last >= pause_after(last, floor)


def look_again(last: float) -> float:
    """How long a deferred step waits before it looks at the writer again: a fraction of the
    last step, so that looking costs little beside stepping, within bounds."""
    return min(LOOK_AGAIN_MAX, max(LOOK_AGAIN_MIN, max(0.0, last) / 4))


def next_step(looked_at: int, limit: int, forced: bool = False) -> int:
    """The size of the next step after one of `limit` that looked at `looked_at` messages:
    large while steps come back full (more waits beyond them), small otherwise, and shorter
    still after a step `forced`: one that other writes wanted the writer during."""
    if forced:
        return CONTENDED_STEP
    return LARGE_STEP if looked_at >= limit else SMALL_STEP
