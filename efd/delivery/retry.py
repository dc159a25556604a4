"""Outcome classification and retry policy (pure: no I/O, no clock, injected randomness)."""

from __future__ import annotations

import random
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from email.utils import parsedate_to_datetime
from enum import StrEnum

from efd.records import DeliveryStatus
from efd.segment.webhooks import redact_url


class Verdict(StrEnum):
    SUCCESS = "success"
    RETRY = "retry"
    FAIL = "fail"


# Transport failures. A request that never reached the receiver (TLS refused, address
# blocked, bad URL, a request that cannot be built) is final for that hook; the others
# (timeout, connect, dns, reset, protocol; `interrupted`: the sender process died
# mid-round; `internal`: a bug in efd's sending code; `client_cert`: the hook's client
# certificate files no longer load, until they are fixed and reloaded; `token`: an action's
# token endpoint gave no token) may succeed on a later try.
FINAL_ERRORS = frozenset({"tls", "blocked", "invalid_url", "invalid_request"})


def classify_status(status: int) -> Verdict:
    """2xx wins; 408, 429 and 5xx are worth another try; 3xx and other 4xx are final.

    Redirects are not followed: a receiver that moved must be reconfigured, and following
    one could lead a signed body somewhere the operator never approved.
    """
    if 200 <= status < 300:
        return Verdict.SUCCESS
    if status in (408, 429) or status >= 500:
        return Verdict.RETRY
    return Verdict.FAIL


def classify_error(error_class: str) -> Verdict:
    return Verdict.FAIL if error_class in FINAL_ERRORS else Verdict.RETRY


@dataclass(slots=True)  # not frozen: built on the hot path, where frozen __init__ costs
class AttemptResult:
    """What one POST to one hook URL did. Becomes one row of the attempts table."""

    hook_url: str
    started_at: float
    duration: float
    verdict: Verdict
    status_code: int | None = None
    error_class: str | None = None
    error: str | None = None
    response_head: str | None = None
    retry_after: float | None = None

    def describe(self, label: str) -> str:
        """What happened, the hook named by `label` (webhooks.hook_labels), never its URL."""
        if self.status_code is not None:
            return f"{label}: HTTP {self.status_code}"
        return f"{label}: {self.error_class}: {self.error}"


@dataclass(frozen=True, slots=True)
class RetryPolicy:
    initial: float
    maximum: float
    window: float

    def backoff(self, attempt: int, rng: random.Random) -> float:
        """Delay after the `attempt`-th failed round: exponential, randomised in [d/2, d].

        The jitter spreads retries of a burst that failed together, so a recovering
        receiver is not hit by all of them in the same second.
        """
        ceiling = min(self.maximum, self.initial * 2.0 ** min(max(0, attempt - 1), 1023))
        return rng.uniform(ceiling / 2, ceiling)

    def next_attempt_at(
        self,
        *,
        attempt: int,
        first_attempt_at: float,
        now: float,
        retry_after: float | None,
        rng: random.Random,
    ) -> float | None:
        """When to try again after a retryable round, or None when the window is spent.

        Never past first attempt + window: a backoff that would overshoot is pulled in to
        the window's close, so one last try happens there. A Retry-After the window cannot
        honour ends the delivery instead, since trying earlier would defy the receiver.
        """
        deadline = first_attempt_at + self.window
        if now >= deadline:
            return None
        delay = self.backoff(attempt, rng)
        if retry_after is not None:
            if now + retry_after > deadline:
                return None
            delay = max(delay, retry_after)
        return min(now + delay, deadline)


def parse_retry_after(value: str | None, now: float) -> float | None:
    """Seconds to wait from a Retry-After header (delta-seconds or an HTTP date)."""
    if not value:
        return None
    value = value.strip()
    if value.isascii() and value.isdigit():
        return float(value)
    try:
        when = parsedate_to_datetime(value)
    except (TypeError, ValueError):
        return None
    return max(0.0, when.timestamp() - now)


@dataclass(slots=True)  # not frozen: built on the hot path, where frozen __init__ costs
class Decision:
    """The new state of a delivery after one round of attempts."""

    status: DeliveryStatus
    next_attempt_at: float | None
    failed_hooks: frozenset[str]
    last_error: str | None


def decide(
    results: Sequence[AttemptResult],
    *,
    hooks: Mapping[str, str],
    failed_hooks: frozenset[str],
    attempt: int,
    first_attempt_at: float,
    now: float,
    policy: RetryPolicy,
    rng: random.Random,
) -> Decision:
    """First success wins; hooks that failed for good drop out; the rest retry or expire.

    `hooks` maps each of the destination's hook URLs to its label (webhooks.hook_labels):
    `failed_hooks` and `last_error` name hooks by label, so they hold no credentials."""
    for r in results:  # a loop, not any() over a generator: this runs once a round
        if r.verdict is Verdict.SUCCESS:
            return Decision(DeliveryStatus.DELIVERED, None, failed_hooks, None)

    def label(url: str) -> str:
        return hooks.get(url) or redact_url(url)

    failed = failed_hooks | {label(r.hook_url) for r in results if r.verdict is Verdict.FAIL}
    last_error = "; ".join(r.describe(label(r.hook_url)) for r in results) or "no hook to send to"
    if not [h for h in hooks.values() if h not in failed]:
        return Decision(DeliveryStatus.FAILED, None, frozenset(failed), last_error)
    retry_after = max((r.retry_after for r in results if r.retry_after is not None), default=None)
    at = policy.next_attempt_at(
        attempt=attempt,
        first_attempt_at=first_attempt_at,
        now=now,
        retry_after=retry_after,
        rng=rng,
    )
    if at is None:
        return Decision(DeliveryStatus.EXPIRED, None, frozenset(failed), last_error)
    return Decision(DeliveryStatus.PENDING, at, frozenset(failed), last_error)
