"""Process metrics in Prometheus' text format. Counters live in memory, per process."""

from __future__ import annotations

import bisect
from collections import Counter
from collections.abc import Mapping

LATENCY_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0)


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


class Metrics:
    def __init__(self) -> None:
        self.received: Counter[str] = Counter()  # by source
        self.duplicates: Counter[str] = Counter()  # by source
        self.suppressed: Counter[str] = Counter()  # by source
        self.personas_sent: Counter[str] = Counter()  # by computation key
        self.regulations_finished: Counter[str] = Counter()  # by final status
        self.rejected: Counter[str] = Counter()  # by reason
        self.delivered: Counter[str] = Counter()  # by destination
        self.retried: Counter[str] = Counter()
        self.failed: Counter[str] = Counter()
        self.expired: Counter[str] = Counter()
        self.attempts: Counter[tuple[str, str]] = Counter()  # by (destination, outcome)
        self.stale_outcomes = 0
        self.telemetry_discarded = 0  # analytics.js telemetry requests (/v1/m)
        self.latency: dict[str, Histogram] = {}
        self.backlog: dict[str, int] = {}

    def observe_attempt(self, destination: str, outcome: str, seconds: float) -> None:
        self.attempts[(destination, outcome)] += 1
        histogram = self.latency.get(destination)
        if histogram is None:
            histogram = self.latency[destination] = Histogram(LATENCY_BUCKETS)
        histogram.observe(seconds)

    def render(self) -> str:
        lines: list[str] = []

        def counter(name: str, help_: str, label: str, values: Mapping[str, int]) -> None:
            lines.append(f"# HELP {name} {help_}")
            lines.append(f"# TYPE {name} counter")
            for key, value in sorted(values.items()):
                lines.append(f'{name}{{{label}="{_escape(key)}"}} {value}')

        counter(
            "efd_messages_received_total", "Messages accepted and stored.", "source", self.received
        )
        counter(
            "efd_messages_duplicate_total",
            "Messages acknowledged but not stored: messageId seen within 24 hours.",
            "source",
            self.duplicates,
        )
        counter(
            "efd_messages_suppressed_total",
            "Messages acknowledged and dropped: their user is suppressed by a regulation.",
            "source",
            self.suppressed,
        )
        counter(
            "efd_messages_rejected_total", "Messages refused, by reason.", "reason", self.rejected
        )
        counter(
            "efd_personas_identifies_total",
            "Identify messages sent by audience and computed trait syncs.",
            "computation",
            self.personas_sent,
        )
        counter(
            "efd_regulations_total",
            "Regulations this process brought to an end, by final status.",
            "status",
            self.regulations_finished,
        )
        counter(
            "efd_deliveries_delivered_total",
            "Deliveries a hook accepted.",
            "destination",
            self.delivered,
        )
        counter(
            "efd_deliveries_retried_total",
            "Rounds that will be retried.",
            "destination",
            self.retried,
        )
        counter(
            "efd_deliveries_failed_total", "Deliveries failed for good.", "destination", self.failed
        )
        counter(
            "efd_deliveries_expired_total",
            "Deliveries whose retry window closed.",
            "destination",
            self.expired,
        )
        lines.append("# HELP efd_attempts_total POSTs to hook URLs, by outcome.")
        lines.append("# TYPE efd_attempts_total counter")
        for (destination, outcome), value in sorted(self.attempts.items()):
            labels = f'destination="{_escape(destination)}",outcome="{outcome}"'
            lines.append(f"efd_attempts_total{{{labels}}} {value}")
        lines.append(
            "# HELP efd_stale_outcomes_total Outcomes dropped because the lease had moved on."
        )
        lines.append("# TYPE efd_stale_outcomes_total counter")
        lines.append(f"efd_stale_outcomes_total {self.stale_outcomes}")
        lines.append(
            "# HELP efd_telemetry_discarded_total analytics.js telemetry requests "
            "(POST /v1/m), accepted and dropped."
        )
        lines.append("# TYPE efd_telemetry_discarded_total counter")
        lines.append(f"efd_telemetry_discarded_total {self.telemetry_discarded}")
        lines.append(
            "# HELP efd_backlog_pending Pending deliveries per destination, in flight included."
        )
        lines.append("# TYPE efd_backlog_pending gauge")
        for destination, value in sorted(self.backlog.items()):
            lines.append(f'efd_backlog_pending{{destination="{_escape(destination)}"}} {value}')
        lines.append(
            "# HELP efd_attempt_duration_seconds Time from request start to complete answer."
        )
        lines.append("# TYPE efd_attempt_duration_seconds histogram")
        for destination, histogram in sorted(self.latency.items()):
            label = f'destination="{_escape(destination)}"'
            cumulative = 0
            for bound, count in zip(histogram.buckets, histogram.counts, strict=False):
                cumulative += count
                lines.append(
                    f'efd_attempt_duration_seconds_bucket{{{label},le="{bound}"}} {cumulative}'
                )
            lines.append(
                f'efd_attempt_duration_seconds_bucket{{{label},le="+Inf"}} {histogram.count}'
            )
            lines.append(f"efd_attempt_duration_seconds_sum{{{label}}} {histogram.total}")
            lines.append(f"efd_attempt_duration_seconds_count{{{label}}} {histogram.count}")
        return "\n".join(lines) + "\n"


def _escape(value: str) -> str:
    return value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")
