"""What a delivery round tells operators: its counts in the metrics, its lines in the log,
its operational events (efd/operations/events.py) to the sink and, once recorded, its
attempts on the live stream."""

from __future__ import annotations

import logging
from collections.abc import Iterable

from efd.delivery import retry
from efd.delivery.circuit import Change, Circuits
from efd.delivery.retry import AttemptResult, Verdict
from efd.observe.metrics import Metrics
from efd.observe.stream import Hub
from efd.operations import events
from efd.operations.events import Sink
from efd.records import AttemptRow, Claimed, DeliveryStatus
from efd.segment import webhooks
from efd.segment.webhooks import Route

log = logging.getLogger("efd.delivery.dispatcher")


def circuit_changed(
    metrics: Metrics,
    circuits: Circuits,
    routes: list[Route],
    url: str,
    change: Change,
    sink: Sink | None,
    result: AttemptResult,
    now: float,
) -> None:
    """Expose and log that the circuit of hook `url` (in `routes`) opened or closed, and
    tell `sink` for each route (`result`: the attempt that changed it, at `now`)."""
    hook = routes[0].labels[url] if routes else webhooks.redact_url(url)
    names = ", ".join(r.name for r in routes)
    for r in routes:
        metrics.circuit_open[(r.name, r.labels[url])] = int(change is Change.OPENED)
        if sink is None:
            continue
        if change is Change.OPENED:
            sink.emit(
                events.hook_failing(
                    r.name,
                    r.labels[url],
                    failures=circuits.threshold,
                    probe_seconds=circuits.probe_seconds,
                    status_code=result.status_code,
                    error=_answer(result),
                    at=now,
                )
            )
        else:
            sink.emit(events.hook_recovered(r.name, r.labels[url], at=now))
    if change is Change.OPENED:
        log.warning(
            "circuit of %s (%s) opened: %d messages failed in a row; probing every %g s",
            hook,
            names,
            circuits.threshold,
            circuits.probe_seconds,
        )
    else:
        log.info("circuit of %s (%s) closed: the probe got an answer", hook, names)


def report(
    metrics: Metrics,
    now: float,
    route: Route,
    item: Claimed,
    results: list[AttemptResult],
    decision: retry.Decision,
    note: str | None,
    sink: Sink | None = None,
) -> None:
    """Count a round in the metrics and say what happened in the log; a delivery that failed
    for good or expired is a delivery.exhausted event to `sink`."""
    destination = route.name
    for result in results:
        metrics.observe_attempt(destination, result.verdict.value, result.duration)
        if result.verdict is not Verdict.SUCCESS:
            log.warning(
                "message %s to %s: attempt %d at %s failed (%s): %s",
                item.message_id,
                destination,
                item.attempts + 1,
                route.labels.get(result.hook_url) or webhooks.redact_url(result.hook_url),
                result.error_class or f"HTTP {result.status_code}",
                result.error or (result.response_head or "")[:120],
            )
    if decision.status is DeliveryStatus.DELIVERED:
        metrics.delivered[destination] += 1
        log.debug("message %s delivered to %s", item.message_id, destination)
    elif decision.status is DeliveryStatus.PENDING:
        metrics.retried[destination] += 1
        assert decision.next_attempt_at is not None
        log.info(
            "message %s to %s: retry in %.1f s",
            item.message_id,
            destination,
            decision.next_attempt_at - now,
        )
    elif decision.status is DeliveryStatus.FAILED:
        metrics.failed[destination] += 1
        log.error(
            "message %s to %s failed for good: %s",
            item.message_id,
            destination,
            note or decision.last_error,
        )
    else:
        metrics.expired[destination] += 1
        log.error(
            "message %s to %s expired: retry window closed after %d attempts: %s",
            item.message_id,
            destination,
            item.attempts + 1,
            decision.last_error,
        )
    if sink is not None and decision.status in (DeliveryStatus.FAILED, DeliveryStatus.EXPIRED):
        last = next((r for r in reversed(results) if r.verdict is not Verdict.SUCCESS), None)
        sink.emit(
            events.delivery_exhausted(
                destination,
                source=item.source,
                message_id=item.message_id,
                delivery_id=item.delivery_id,
                status=decision.status.value,
                attempts=item.attempts + 1,
                first_attempt_at=item.first_attempt_at
                or (min(r.started_at for r in results) if results else None),
                hook=None if last is None else route.labels.get(last.hook_url),
                status_code=None if last is None else last.status_code,
                error=(note or decision.last_error) if last is None else _answer(last),
                at=now,
            )
        )


def hook_disabled(sink: Sink | None, destination: str, hook: int, reason: str, at: float) -> None:
    """Log that [delivery] disable_after_hours disabled a hook, and tell `sink`."""
    log.warning(
        "hook %d of %s is disabled: %s; nothing is sent to it until `efd resume %s --hook %d`",
        hook,
        destination,
        reason,
        destination,
        hook,
    )
    if sink is not None:
        sink.emit(events.hook_disabled(destination, hook, reason=reason, at=at))


def _answer(result: AttemptResult) -> str | None:
    """What the receiver answered, or the error, in a few words (never the URL)."""
    if result.error_class is not None:
        return f"{result.error_class}: {webhooks.scrub(result.error or '', result.hook_url)}"
    return (
        None
        if result.response_head is None
        else webhooks.scrub(result.response_head, result.hook_url)
    )


def publish_attempts(hub: Hub, recorded: Iterable[tuple[str, str, list[AttemptRow]]]) -> None:
    """Tell the live stream of recorded attempts: (destination, messageId, attempt rows)."""
    for destination, message_id, rows in recorded:
        for row in rows:
            hub.publish(
                "attempt",
                {
                    "destination": destination,
                    "url": row.hook_url,
                    "messageId": message_id,
                    "statusCode": row.status_code,
                    "error": None if row.error_class is None else f"{row.error_class}: {row.error}",
                    "durationMs": row.duration_ms,
                    "delivered": row.outcome == "success",
                },
            )
