"""Rate limits per hook (pure: no I/O): which token buckets a destination's rounds take from,
and when a destination held back by its limits is worth claiming for again.

Each limited hook has one token bucket in the store (efd/store/ratelimit.py), shared by every
daemon on it: `rate` tokens a second accrue up to `burst`; a claim of n deliveries takes n
tokens from every limited hook of the destination, since a round goes to all of its hooks at
once (docs/delivery.md#rate-limits).
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable
from dataclasses import dataclass

# How much of a second a held-back destination lets tokens accrue before claiming again: a
# claim a token at high rates would be a transaction a token.
QUANTUM = 0.05
# The time a request may take from its token to the receiver, whose clock it meets: a bucket
# keeps this much of its rate in reserve (within its burst), so that a receiver counting the
# same limit by arrival still has the tokens for requests that the network delayed unevenly.
JITTER = 0.1


@dataclass(frozen=True, slots=True)
class Bucket:
    """One limited hook's bucket: its key in the store, and its limit."""

    key: str
    rate: float  # tokens a second
    burst: float  # the most tokens it holds
    url: str  # the hook, as configured (never stored)
    reserve: float = 0.0  # tokens never handed out (JITTER)

    @property
    def row(self) -> tuple[str, float, float, float]:
        """What the store takes from: (key, rate, burst, reserve)."""
        return self.key, self.rate, self.burst, self.reserve


def bucket_key(destination: str, url: str) -> str:
    """The store's name for a hook's bucket: a hash, so no URL (nor its credentials) is
    written. Per destination: two destinations sending to one URL have their own limits."""
    digest = hashlib.sha256(f"{destination}\x00{url}".encode("utf-8", "surrogatepass"))
    return digest.hexdigest()[:40]


def buckets(
    destination: str, limits: Iterable[tuple[str, tuple[float, float] | None]]
) -> tuple[Bucket, ...]:
    """The buckets of a destination's limited hooks, from (url, (rate, burst) or None)."""
    return tuple(
        Bucket(bucket_key(destination, url), rate, burst, url, min(burst - 1.0, rate * JITTER))
        for url, (rate, burst) in ((u, limit) for u, limit in limits if limit is not None)
    )


def next_claim_in(found: Iterable[Bucket], left: float) -> float:
    """Seconds until a claim held back by its tokens is worth making again: until the
    slowest bucket has accrued a quantum's worth (at least one token, at most its burst),
    `left` being the fewest tokens any of them kept beyond its reserve."""
    wait = 0.0
    for bucket in found:
        want = min(bucket.burst - bucket.reserve, max(1.0, bucket.rate * QUANTUM))
        wait = max(wait, (want - left) / bucket.rate)
    return max(0.0, wait)
