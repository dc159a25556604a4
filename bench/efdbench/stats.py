"""Percentiles and rate samples."""

from __future__ import annotations

from typing import Any


def p99_by_second(acks: dict[str, float], receipts: dict[str, float]) -> list[float | None]:
    """The ack-to-receipt p99 of the messages acknowledged in each second: shows whether the
    tail is spread out or comes in bursts (a checkpoint, a pause, another tenant)."""
    if not acks:
        return []
    start = min(acks.values())
    seconds: dict[int, list[float]] = {}
    for mid, acked in acks.items():
        if mid in receipts:
            seconds.setdefault(int(acked - start), []).append(receipts[mid] - acked)
    return [rounded(pct(sorted(seconds.get(i, [0.0])), 99) * 1000) for i in range(max(seconds) + 1)]


def pct(sorted_values: list[float], p: float) -> float:
    if not sorted_values:
        return float("nan")
    k = (len(sorted_values) - 1) * p / 100
    lo = int(k)
    hi = min(lo + 1, len(sorted_values) - 1)
    return sorted_values[lo] + (sorted_values[hi] - sorted_values[lo]) * (k - lo)


def rounded(value: float | None, digits: int = 2) -> float | None:
    if value is None or value != value:
        return None
    return round(value, digits)


def sample_at(samples: list[tuple[float, int, int]], t: float) -> tuple[float, int, int]:
    """The last sample taken at or before t (samples are (elapsed, acked, received))."""
    best = samples[0]
    for sample in samples:
        if sample[0] <= t:
            best = sample
    return best


def window_fill(
    samples: list[tuple[float, int, int]],
    received_before: int,
    start: float,
    stop: float,
    window: int,
) -> float | None:
    """The median, over the samples from start to stop, of the acknowledged messages not yet
    received, as a share of the window. Near 1, the window held the clients back and delivery
    ran at its own limit; well below 1, the clients' ingestion set the rate, not delivery."""
    backlog = sorted(a - (r - received_before) for t, a, r in samples if start <= t <= stop)
    if not backlog or not window:
        return None
    return round(backlog[len(backlog) // 2] / window, 3)


def median_spread(values: list[float]) -> tuple[float | None, list[float] | None]:
    """The median of paired figures and their spread [smallest, largest]."""
    if not values:
        return None, None
    ordered = sorted(values)
    middle = len(ordered) // 2
    median = ordered[middle] if len(ordered) % 2 else (ordered[middle - 1] + ordered[middle]) / 2
    return round(median, 3), [ordered[0], ordered[-1]]


def medians(
    rows: list[dict[str, Any]], keys: tuple[str, ...]
) -> dict[str, tuple[float | None, list[float] | None]]:
    """median_spread of each key over the rows (pairs or triples) that have it."""
    return {key: median_spread([r[key] for r in rows if r.get(key) is not None]) for key in keys}
