"""Circuit breakers, one per hook URL (pure: no I/O; the caller passes the clock).

A hook is open once attempts of `threshold` different messages have failed, in a way worth
retrying, with no answer between them that is not: rounds leave it out, except one probe
every `probe_seconds`. The first answer that is not worth retrying (a 2xx, or a final 4xx:
the receiver is up and answering) closes it again. Messages, not attempts, are counted: one
message retried again and again (an ordered lane's head the receiver keeps refusing) shows
only that the receiver refuses that message, and must not hold up every other.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import StrEnum

from efd.delivery.retry import AttemptResult, Verdict

# Failures that say nothing about the receiver: efd's own sender process died, a bug, the
# hook's client certificate files no longer load, or an action's OAuth2 token (its endpoint
# gave none, or the receiver refused a cached one and the request went again with a new one),
# or the egress proxy's own refusal.
_NOT_THE_RECEIVER = frozenset({"interrupted", "internal", "client_cert", "token", "proxy"})


def tells_of_receiver(result: AttemptResult) -> bool:
    """Whether the attempt's result says something about the receiver: the circuits, and
    [delivery] disable_after_hours's runs of failures, count only those."""
    return result.error_class not in _NOT_THE_RECEIVER


class Change(StrEnum):
    OPENED = "opened"
    CLOSED = "closed"


@dataclass(slots=True)
class _Hook:
    # The deliveries with a retryable failure since the last answer that was not one.
    failing: set[int] = field(default_factory=set)
    open: bool = False
    next_probe_at: float = 0.0
    probing: bool = False  # a probe is in flight


class Circuits:
    def __init__(self, *, threshold: int, probe_seconds: float) -> None:
        self.threshold = threshold
        self.probe_seconds = probe_seconds
        self._hooks: dict[str, _Hook] = {}

    def is_open(self, url: str) -> bool:
        hook = self._hooks.get(url)
        return hook is not None and hook.open

    def open_hooks(self) -> list[str]:
        return [url for url, hook in self._hooks.items() if hook.open]

    def may_probe(self, url: str, now: float) -> bool:
        """Whether an open hook's probe may go now (without taking it)."""
        hook = self._hooks.get(url)
        return hook is not None and hook.open and not hook.probing and now >= hook.next_probe_at

    def take_probe(self, url: str, now: float) -> bool:
        """Reserve the open hook's next probe for a round starting now; False when not due
        or one is in flight. The round's result must be passed to `record`."""
        if not self.may_probe(url, now):
            return False
        self._hooks[url].probing = True
        return True

    def release_probe(self, url: str) -> None:
        """Give back a probe whose round sent nothing to the hook."""
        hook = self._hooks.get(url)
        if hook is not None:
            hook.probing = False

    def next_probe_at(self, url: str) -> float | None:
        """When an open hook may be probed next; None when closed or a probe is in flight."""
        hook = self._hooks.get(url)
        if hook is None or not hook.open or hook.probing:
            return None
        return hook.next_probe_at

    def blocked(self, urls: list[str], now: float) -> bool:
        """True when none of `urls` can be sent to now: all open, none may probe."""
        return bool(urls) and all(
            self.is_open(url) and not self.may_probe(url, now) for url in urls
        )

    def record(self, result: AttemptResult, now: float, delivery: int) -> Change | None:
        """Count one attempt's result, an attempt of the delivery (the message to one
        destination) `delivery`; return the change it made to the hook's circuit."""
        if result.error_class in _NOT_THE_RECEIVER:
            hook = self._hooks.get(result.hook_url)
            if hook is not None and hook.probing:
                hook.probing = False  # the probe told nothing: try again when due
            return None
        hook = self._hooks.get(result.hook_url)
        if hook is None:  # not setdefault: it would build a _Hook on every attempt
            hook = self._hooks[result.hook_url] = _Hook()
        hook.probing = False
        if result.verdict is not Verdict.RETRY:
            if hook.failing:
                hook.failing.clear()
            if hook.open:
                hook.open = False
                return Change.CLOSED
            return None
        if hook.open:
            hook.next_probe_at = now + self.probe_seconds
            return None
        failing = hook.failing
        failing.add(delivery)
        if len(failing) >= self.threshold:
            failing.clear()  # an open hook counts nothing until it closes
            hook.open = True
            hook.next_probe_at = now + self.probe_seconds
            return Change.OPENED
        return None
