"""Process metrics, exposed in Prometheus' text format by prometheus-client.

Counting stays in plain dicts, read by a custom collector at scrape time: the library's own
labelled counters cost about ten times a dict's increment (docs/decisions.md, "Figures behind
the code"), and the delivery path counts several times per round. Counters live in memory, per
process; the child processes count nothing.
"""

from __future__ import annotations

import bisect
from collections import Counter
from collections.abc import Iterator

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
    Metric,
)
from prometheus_client.registry import Collector

LATENCY_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0)
CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"


class Histogram:
    def __init__(self, buckets: tuple[float, ...]) -> None:
        self.buckets = buckets
        self.counts = [0] * (len(buckets) + 1)
        self.total = 0.0
        self.count = 0

    def observe(self, value: float) -> None:
        self.counts[bisect.bisect_left(self.buckets, value)] += 1
        self.total += value
        self.count += 1

    def cumulative(self) -> list[tuple[str, float]]:
        running, out = 0, []
        for bound, count in zip(self.buckets, self.counts, strict=False):
            running += count
            out.append((repr(bound), float(running)))
        out.append(("+Inf", float(self.count)))
        return out


class Metrics:
    def __init__(self) -> None:
        self.received: Counter[str] = Counter()  # by source
        self.duplicates: Counter[str] = Counter()  # by source
        self.suppressed: Counter[str] = Counter()  # by source
        self.personas_sent: Counter[str] = Counter()  # by computation key
        self.regulations_finished: Counter[str] = Counter()  # by final status
        self.operations_events: Counter[str] = Counter()  # by event name: stored to be sent
        self.operations_dropped: Counter[str] = Counter()  # by event name: over the cap
        self.rejected: Counter[str] = Counter()  # by reason
        self.telemetry_discarded = 0  # analytics.js telemetry requests (/v1/m), dropped
        self.delivered: Counter[str] = Counter()  # by destination
        self.retried: Counter[str] = Counter()
        self.failed: Counter[str] = Counter()
        self.expired: Counter[str] = Counter()
        self.filtered: Counter[str] = Counter()  # by destination: stopped by its filters
        self.handed_over: Counter[str] = Counter()  # by destination: started without a claim
        # by (destination, hook label): rounds sent later than due because of the hook's limit
        self.held_back: Counter[tuple[str, str]] = Counter()
        self.attempts: Counter[tuple[str, str]] = Counter()  # by (destination, outcome)
        self.stale_outcomes = 0
        self.connections_refused = 0  # over [server] max_connections
        self.requests_timed_out = 0  # answered 408
        self.responses_timed_out = 0  # connections closed: their answer was not taken in time
        self.latency: dict[str, Histogram] = {}
        self.backlog: dict[tuple[str, bool], int] = {}  # (destination, configured) -> pending
        # (destination, redacted hook URL) -> 1 while the hook's circuit is open, else 0
        self.circuit_open: dict[tuple[str, str], int] = {}
        # ordered destination -> lanes whose head failed and has no outcome yet
        self.lanes_blocked: dict[str, int] = {}
        self.retention_purged = 0  # messages this process's retention runs purged
        # At the last look (a retention run, a scrape): how far behind retention is, in
        # seconds past the horizon, and the messages it keeps for work still pending.
        self.retention_behind = 0.0
        self.retention_kept = 0
        self.registry = CollectorRegistry(auto_describe=False)
        self.registry.register(_Collector(self))

    def observe_attempt(self, destination: str, outcome: str, seconds: float) -> None:
        self.attempts[(destination, outcome)] += 1
        histogram = self.latency.get(destination)
        if histogram is None:
            histogram = self.latency[destination] = Histogram(LATENCY_BUCKETS)
        histogram.observe(seconds)

    def render(self) -> bytes:
        return generate_latest(self.registry)


# name, help, label, attribute
_COUNTERS = (
    ("efd_messages_received", "Messages accepted and stored.", "source", "received"),
    (
        "efd_messages_duplicate",
        "Messages acknowledged but not stored: messageId seen within 24 hours.",
        "source",
        "duplicates",
    ),
    (
        "efd_messages_suppressed",
        "Messages acknowledged and dropped: their user is suppressed by a regulation.",
        "source",
        "suppressed",
    ),
    ("efd_messages_rejected", "Messages refused, by reason.", "reason", "rejected"),
    (
        "efd_personas_identifies",
        "Identify messages sent by audience and computed trait syncs.",
        "computation",
        "personas_sent",
    ),
    (
        "efd_regulations",
        "Regulations this process brought to an end, by final status.",
        "status",
        "regulations_finished",
    ),
    (
        "efd_operations_events",
        "Operational events stored for the [operations] destination, by name.",
        "event",
        "operations_events",
    ),
    (
        "efd_operations_events_dropped",
        "Operational events over max_events_per_minute, counted in a summary instead.",
        "event",
        "operations_dropped",
    ),
    ("efd_deliveries_delivered", "Deliveries a hook accepted.", "destination", "delivered"),
    ("efd_deliveries_retried", "Rounds that will be retried.", "destination", "retried"),
    ("efd_deliveries_failed", "Deliveries failed for good.", "destination", "failed"),
    ("efd_deliveries_expired", "Deliveries whose retry window closed.", "destination", "expired"),
    (
        "efd_deliveries_filtered",
        "Deliveries a destination's filters stopped at routing (drop, sample): never sent.",
        "destination",
        "filtered",
    ),
    (
        "efd_deliveries_handed_over",
        "Deliveries leased at ingestion and started without a claim.",
        "destination",
        "handed_over",
    ),
)


class _Collector(Collector):
    def __init__(self, metrics: Metrics) -> None:
        self._m = metrics

    def collect(self) -> Iterator[Metric]:
        m = self._m
        for name, help_, label, attribute in _COUNTERS:
            family = CounterMetricFamily(name, help_, labels=[label])
            for key, value in sorted(getattr(m, attribute).items()):
                family.add_metric([key], value)
            yield family
        yield CounterMetricFamily(
            "efd_telemetry_discarded",
            "analytics.js telemetry requests (/v1/m) accepted and dropped.",
            value=m.telemetry_discarded,
        )
        attempts = CounterMetricFamily(
            "efd_attempts", "POSTs to hook URLs, by outcome.", labels=["destination", "outcome"]
        )
        for (destination, outcome), value in sorted(m.attempts.items()):
            attempts.add_metric([destination, outcome], value)
        yield attempts
        held_back = CounterMetricFamily(
            "efd_requests_held_back",
            "Requests to a rate-limited hook sent later than due, held back by its max_per_second.",
            labels=["destination", "hook"],
        )
        for (destination, hook), value in sorted(m.held_back.items()):
            held_back.add_metric([destination, hook], value)
        yield held_back
        yield CounterMetricFamily(
            "efd_connections_refused",
            "Connections answered 503 and closed: [server] max_connections were open, or "
            "max_connections_per_address from that address.",
            value=m.connections_refused,
        )
        yield CounterMetricFamily(
            "efd_responses_timed_out",
            "Connections closed because the client left its answer untaken for "
            "request_timeout_seconds.",
            value=m.responses_timed_out,
        )
        yield CounterMetricFamily(
            "efd_requests_timed_out",
            "Requests answered 408: not arrived in full within request_timeout_seconds.",
            value=m.requests_timed_out,
        )
        yield CounterMetricFamily(
            "efd_stale_outcomes",
            "Outcomes dropped because the lease had moved on.",
            value=m.stale_outcomes,
        )
        backlog = GaugeMetricFamily(
            "efd_backlog_pending",
            "Pending deliveries per destination, in flight included; configured=false: a "
            "destination no longer configured, whose deliveries are never sent.",
            labels=["destination", "configured"],
        )
        for (destination, configured), value in sorted(m.backlog.items()):
            backlog.add_metric([destination, "true" if configured else "false"], value)
        yield backlog
        circuits = GaugeMetricFamily(
            "efd_circuit_open",
            "1 while the hook's circuit is open (only probes are sent to it), else 0.",
            labels=["destination", "hook"],
        )
        for (destination, hook), value in sorted(m.circuit_open.items()):
            circuits.add_metric([destination, hook], value)
        yield circuits
        blocked = GaugeMetricFamily(
            "efd_lanes_blocked",
            "Lanes of an ordered destination whose head failed at least once and has no "
            "outcome yet: each holds that user's later messages back.",
            labels=["destination"],
        )
        for destination, value in sorted(m.lanes_blocked.items()):
            blocked.add_metric([destination], value)
        yield blocked
        yield CounterMetricFamily(
            "efd_retention_purged",
            "Messages retention purged (with their deliveries and attempts) in this process.",
            value=m.retention_purged,
        )
        yield GaugeMetricFamily(
            "efd_retention_behind_seconds",
            "How long before the retention horizon the oldest message retention has not "
            "reached yet was received; 0 when it has caught up.",
            value=m.retention_behind,
        )
        yield GaugeMetricFamily(
            "efd_retention_kept_messages",
            "Messages older than the horizon that retention keeps because a delivery of "
            "theirs is pending, queued or finished after the horizon; looked at every run.",
            value=m.retention_kept,
        )
        durations = HistogramMetricFamily(
            "efd_attempt_duration_seconds",
            "Time from request start to complete answer.",
            labels=["destination"],
        )
        for destination, histogram in sorted(m.latency.items()):
            durations.add_metric([destination], histogram.cumulative(), histogram.total)
        yield durations
