"""What a run measures: its phases, their sizes and durations, and the targets."""

from __future__ import annotations

from dataclasses import dataclass

TARGETS = {
    "ingest_batch_events_per_s": (">=", 30000),
    "ingest_single_events_per_s": (">=", 5000),
    "deliver_ratio": (">=", 0.9),
    "deliver_cpu_us_per_event": ("<=", 90),
    "deliver_cpu_ratio_to_bare": ("<=", 2),
    "actions_cpu_ratio_to_classic": ("<=", 1.15),
    "actions_lost": ("==", 0),
    "actions_duplicates": ("==", 0),
    "latency_p99_ms": ("<=", 50),
    "backlog_ingest_ratio": (">=", 0.8),
    "rss_mb_backlog": ("<=", 300),
    "lost": ("==", 0),
    "duplicates": ("==", 0),
}

PHASES = ("limits", "ingest", "backlog", "deliver", "actions", "latency", "recovery")
# Run only when named in --only: too long for the full run's ten minutes (bench/README.md).
OPTIONAL_PHASES = ("retention", "brokers")


@dataclass
class Plan:
    """Sizes and durations of every phase; every loop is bounded by one of these."""

    sqlite_seconds: float
    sqlite_max_rows: int
    bare_seconds: float
    bare_concurrency: int
    ingest_seconds: float
    warmup_seconds: float
    batch_size: int
    batch_clients: int
    single_clients: int
    backlog_target: int
    backlog_fill_cap_seconds: float
    fill_clients: int
    pairs: int  # backlog_ingest_ratio: alternating slices on the full and an empty store
    pair_seconds: float
    deliver_warmup_seconds: float
    deliver_seconds: float  # PostgreSQL's delivery phase
    deliver_pair_warmup_seconds: float  # SQLite's, in pairs: each efd slice's warm-up
    deliver_pairs: int  # bare POST and efd's delivery, A B A B …
    deliver_pair_seconds: float
    deliver_window: int
    deliver_clients: int
    latency_rate: int
    latency_seconds: float
    recovery_messages: int
    recovery_accept_cap_seconds: float
    recovery_drain_cap_seconds: float
    recovery_attempt_cap_seconds: float
    settle_cap_seconds: float
    late_receipt_seconds: float = 2.5  # after a drain: retries already in flight arrive


# The ingestion daemons' delivery settings. Deliveries cannot go out: one is in flight to a
# receiver that never answers (max_in_flight = 1, a one-hour timeout), so every other one
# stays pending and the dispatcher does no work: the ingest figures are ingestion alone.
INGEST_DELIVERY = {
    "timeout_seconds": 3600,
    "lease_seconds": 7300,
    "retry_initial_seconds": 3600,
    "retry_max_seconds": 3600,
    "max_in_flight": 1,
    "max_per_hook": 1,
}

QUICK = Plan(
    sqlite_seconds=2,
    sqlite_max_rows=400_000,
    bare_seconds=3,
    bare_concurrency=64,
    ingest_seconds=4,
    warmup_seconds=1,
    batch_size=100,
    batch_clients=8,
    single_clients=64,
    backlog_target=300_000,
    backlog_fill_cap_seconds=25,
    fill_clients=8,
    pairs=3,
    pair_seconds=1.5,
    deliver_warmup_seconds=2,
    deliver_seconds=6,
    deliver_pair_warmup_seconds=1,
    deliver_pairs=3,
    deliver_pair_seconds=3,
    deliver_window=5000,
    deliver_clients=16,
    latency_rate=1000,
    latency_seconds=5,
    recovery_messages=20_000,
    recovery_accept_cap_seconds=20,
    recovery_drain_cap_seconds=25,
    recovery_attempt_cap_seconds=20,
    settle_cap_seconds=15,
)

FULL = Plan(
    sqlite_seconds=5,
    sqlite_max_rows=1_500_000,
    bare_seconds=8,
    bare_concurrency=64,
    ingest_seconds=10,
    warmup_seconds=2,
    batch_size=100,
    batch_clients=8,
    single_clients=64,
    backlog_target=1_000_000,
    backlog_fill_cap_seconds=240,
    fill_clients=8,
    pairs=5,
    pair_seconds=2,
    deliver_warmup_seconds=3,
    deliver_seconds=15,
    deliver_pair_warmup_seconds=1.5,
    deliver_pairs=5,
    deliver_pair_seconds=5,
    deliver_window=5000,
    deliver_clients=16,
    latency_rate=1000,
    latency_seconds=15,
    recovery_messages=50_000,
    recovery_accept_cap_seconds=60,
    recovery_drain_cap_seconds=90,
    recovery_attempt_cap_seconds=45,
    settle_cap_seconds=30,
)

# `--smoke`: every phase once, as small as it can be while still doing its work: a check that
# the bench still runs against the code (the test suite runs it), not a measurement.
SMOKE = Plan(
    sqlite_seconds=0.2,
    sqlite_max_rows=2_000,
    bare_seconds=0.3,
    bare_concurrency=8,
    ingest_seconds=0.3,
    warmup_seconds=0.1,
    batch_size=100,
    batch_clients=2,
    single_clients=4,
    backlog_target=2_000,
    backlog_fill_cap_seconds=3,
    fill_clients=2,
    pairs=1,
    pair_seconds=0.2,
    deliver_warmup_seconds=0.2,
    deliver_seconds=0.5,
    deliver_pair_warmup_seconds=0.2,
    deliver_pairs=1,
    deliver_pair_seconds=0.3,
    deliver_window=500,
    deliver_clients=2,
    latency_rate=100,
    latency_seconds=0.5,
    recovery_messages=300,
    recovery_accept_cap_seconds=5,
    recovery_drain_cap_seconds=10,
    recovery_attempt_cap_seconds=5,
    settle_cap_seconds=5,
    late_receipt_seconds=0.3,
)
