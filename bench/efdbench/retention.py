"""Retention at the speed of ingestion: a steady state, and a long history.

* steady: a fresh database, `retention_days` set to minutes, ingestion and delivery at a
  fixed rate for long enough that retention runs many times. Per tenth of the run: the
  rates, the request p99 and the undelivered backlog; the database's size and the age of
  its oldest message sampled throughout.
* history: a database pre-filled with SQL (efd/prefill.py) with finished messages older
  than the horizon, and a small one beside it, each under its own daemon. First their
  purges alone, side by side; then ingestion in turns (A B B A …): closed-loop /v1/batch,
  then the drain of the backlog it left (claims), while the large one's retention purges.

Everything is a ratio to a figure of the same run: the last tenth to the first, the full
database to the small one, the purge rate to the highest ingestion rate measured.
"""

from __future__ import annotations

import contextlib
import sqlite3
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import psycopg

from efdbench.pgserver import PgServer
from efdbench.prefill import fill_postgresql, fill_sqlite
from efdbench.processes import Daemon, db_bytes
from efdbench.procstats import cpu_seconds
from efdbench.scenarios import Bench
from efdbench.stats import pct, rounded, sample_at

_DELIVER = {"timeout_seconds": 5, "retry_initial_seconds": 0.5, "retry_max_seconds": 2}
_DAY = 86400.0


@dataclass
class RetentionPlan:
    minutes: float  # the steady state's length
    rate: int  # events/s offered in the steady state
    horizon_minutes: float  # retention_days, in minutes
    interval: float  # retention_interval_seconds asked of the daemon (where it has one)
    prefill: int  # messages in the long history (0: no history part)
    small_share: float  # the small history, as a share of the long one
    purge_cap_seconds: float  # the side-by-side purge, at most
    pairs: int
    slice_seconds: float
    drain_cap_seconds: float


def retention_code() -> dict[str, Any]:
    """What the efd under test offers: whether its interval can be set, and its default."""
    from efd.config.models import StorageConfig

    fields = StorageConfig.model_fields
    if "retention_interval_seconds" in fields:
        return {
            "interval_setting": True,
            "default_interval": fields["retention_interval_seconds"].default,
        }
    from efd.services import periodic

    every = getattr(periodic, "RETENTION_EVERY", None)
    return {"interval_setting": False, "default_interval": every}


class _Db:
    """One database of the phase: a SQLite file, or a database of the PostgreSQL server."""

    def __init__(self, bench: Bench, server: PgServer | None, tag: str) -> None:
        from efd.store import migrate

        self.server = server
        if server is None:
            self.path: Path | None = bench.root / f"{tag}.db"
            self.url: str | None = None
            migrate.upgrade(f"sqlite:///{self.path}")
        else:
            self.path = None
            self.name = server.create_database(tag)
            self.url = server.url(self.name)
            server.migrate(self.name)

    def value(self, query: str) -> Any:
        """The first column of the first row of a read-only query."""
        if self.url is not None:
            with psycopg.connect(self.url, autocommit=True) as pg:
                row = pg.execute(query).fetchone()
                return row[0] if row else None
        with contextlib.closing(sqlite3.connect(f"file:{self.path}?mode=ro", uri=True)) as db:
            db.execute("PRAGMA busy_timeout=10000")
            row = db.execute(query).fetchone()
            return row[0] if row else None

    def size_bytes(self) -> int:
        if self.url is not None:
            return int(self.value("SELECT pg_database_size(current_database())"))
        assert self.path is not None
        return db_bytes(self.path)

    def fill(self, n: int, *, oldest: float, span: float) -> dict[str, Any]:
        if self.url is not None:
            return fill_postgresql(self.url, n, oldest=oldest, span=span)
        return fill_sqlite(str(self.path), n, oldest=oldest, span=span)

    def daemon(self, bench: Bench, name: str, storage: dict[str, Any]) -> Daemon:
        port = bench.receiver.hello["port"]
        return Daemon(
            name,
            bench.root,
            _DELIVER,
            f"http://127.0.0.1:{port}/hook",
            storage_url=self.url,
            storage=storage,
            db=self.path,
        )


def _tenths(values: list[tuple[float, float]], seconds: float) -> list[list[float]]:
    """Split (t, value) pairs into the run's ten tenths by t."""
    parts: list[list[float]] = [[] for _ in range(10)]
    for t, v in values:
        parts[min(9, max(0, int(t * 10 / seconds)))].append(v)
    return parts


def _ratio(a: float | None, b: float | None) -> float | None:
    return round(a / b, 3) if a is not None and b else None


class Retention:
    def __init__(self, bench: Bench, plan: RetentionPlan, server: PgServer | None) -> None:
        self.bench = bench
        self.plan = plan
        self.server = server
        self.code = retention_code()
        self.storage: dict[str, Any] = {"retention_days": plan.horizon_minutes / 1440}
        if self.code["interval_setting"]:
            self.storage["retention_interval_seconds"] = plan.interval
        self.results: dict[str, Any] = {"code": self.code, "storage": self.storage}

    def run(self) -> dict[str, Any]:
        if self.plan.minutes > 0:
            self.results["steady"] = self.steady()
        if self.plan.prefill > 0:
            self.results["history"] = self.history()
        return self.results

    def _stop(self, daemon: Daemon) -> dict[str, Any]:
        info = daemon.stop()
        counts = daemon.log_counts()
        info["log_lines"] = counts
        if counts.get("ERROR") or counts.get("Traceback"):
            info["first_error"] = daemon.first_error()
            self.bench.keep = True
            self.bench.notes.append(f"daemon {daemon.name}: {counts} in {daemon.log_path}")
        purged = runs = 0
        with contextlib.suppress(OSError), daemon.log_path.open(errors="replace") as handle:
            for line in handle:
                if "retention: purged " in line:
                    runs += 1
                    purged += int(line.split("retention: purged ", 1)[1].split()[0])
        info["retention_log"] = {"runs_that_purged": runs, "purged": purged}
        return info

    # -- the steady state -------------------------------------------------------------------

    def steady(self) -> dict[str, Any]:
        bench, plan = self.bench, self.plan
        seconds = plan.minutes * 60
        horizon = plan.horizon_minutes * 60
        db = _Db(bench, self.server, "ret_steady")
        daemon = db.daemon(bench, "ret_steady", self.storage)
        samples: list[dict[str, float]] = []
        stop = threading.Event()

        def sample() -> None:
            t0 = time.monotonic()
            while not stop.is_set():
                with contextlib.suppress(Exception):  # a busy database: the next sample
                    oldest = db.value("SELECT min(received_at) FROM messages")
                    samples.append(
                        {
                            "t": time.monotonic() - t0,
                            "bytes": db.size_bytes(),
                            "messages": int(db.value("SELECT count(*) FROM messages")),
                            "oldest_age": time.time() - oldest if oldest is not None else 0.0,
                        }
                    )
                stop.wait(2.0)

        sampler = threading.Thread(target=sample, daemon=True)
        try:
            bench.receiver.call("reset")
            cpu_before = cpu_seconds(daemon.pid)
            with bench.phase("retention_steady", daemons=[daemon.pid]) as info:
                sampler.start()
                out = bench.generator.job(
                    "ingest",
                    seconds + 180,
                    port=daemon.port,
                    path="/v1/batch",
                    clients=16,
                    batch=bench.plan.batch_size,
                    duration=seconds,
                    prefix="rs",
                    rate=plan.rate,
                    sample_every=1.0,
                    timed=True,
                )
                stop.set()
                sampler.join(30)
                bench.wait_received(out["received_before"] + out["acked"], 30)
                info.update(events=out["acked"], errors=out["errors"])
            cpu = cpu_seconds(daemon.pid) - cpu_before
        finally:
            stop.set()
            stopped = self._stop(daemon)
            if self.server is not None:
                self.server.drop_database(db.name)
        return self._steady_figures(out, samples, seconds, horizon, cpu, stopped)

    def _steady_figures(
        self,
        out: dict[str, Any],
        samples: list[dict[str, float]],
        seconds: float,
        horizon: float,
        cpu: float,
        stopped: dict[str, Any],
    ) -> dict[str, Any]:
        plan = self.plan
        tenth = seconds / 10
        rates = []
        for i in range(10):
            a, b = sample_at(out["samples"], i * tenth), sample_at(out["samples"], (i + 1) * tenth)
            span = max(b[0] - a[0], 1e-3)
            backlog = [
                s[1] - (s[2] - out["received_before"])
                for s in out["samples"]
                if a[0] <= s[0] <= b[0]
            ]
            rates.append(
                {
                    "acked_per_s": round((b[1] - a[1]) / span, 1),
                    "delivered_per_s": round((b[2] - a[2]) / span, 1),
                    "backlog_mean": round(sum(backlog) / len(backlog), 1) if backlog else None,
                }
            )
        p99 = [
            rounded(pct(sorted(part), 99) * 1000) if part else None
            for part in _tenths(out["timed"], seconds)
        ]
        # Equilibrium: the horizon passed, and retention had two turns to catch up with it.
        interval = plan.interval if self.code["interval_setting"] else self.code["default_interval"]
        t_eq = horizon + 2 * plan.interval
        eq = next((s for s in samples if s["t"] >= t_eq), None)
        end = samples[-1] if samples else None
        lags = [max(0.0, s["oldest_age"] - horizon) for s in samples if s["t"] >= t_eq]
        figures: dict[str, Any] = {
            "seconds": seconds,
            "offered_per_s": plan.rate,
            "horizon_seconds": horizon,
            "interval_seconds_in_effect": interval,
            "rate_last_over_first": _ratio(
                rates[-1]["delivered_per_s"], rates[0]["delivered_per_s"]
            ),
            "acked_last_over_first": _ratio(rates[-1]["acked_per_s"], rates[0]["acked_per_s"]),
            "request_p99_ms_first": p99[0],
            "request_p99_ms_last": p99[-1],
            "backlog_mean_first": rates[0]["backlog_mean"],
            "backlog_mean_last": rates[-1]["backlog_mean"],
            "equilibrium_at_s": round(t_eq, 1),
            "db_mb_equilibrium": round(eq["bytes"] / 2**20, 1) if eq else None,
            "db_mb_end": round(end["bytes"] / 2**20, 1) if end else None,
            "db_end_over_equilibrium": _ratio(end["bytes"], eq["bytes"]) if eq and end else None,
            "messages_equilibrium": int(eq["messages"]) if eq else None,
            "messages_end": int(end["messages"]) if end else None,
            "retention_lag_max_s": round(max(lags), 1) if lags else None,
            "retention_lag_end_s": round(lags[-1], 1) if lags else None,
            "daemon_cpu_us_per_event": round(cpu / max(1, out["acked"]) * 1e6, 1),
            "errors": out["errors"],
            "tenths": rates,
            "request_p99_ms_by_tenth": p99,
            "retention_log": stopped["retention_log"],
            # (seconds, MB, messages, age of the oldest in seconds)
            "samples": [
                [
                    round(s["t"], 1),
                    round(s["bytes"] / 2**20, 1),
                    int(s["messages"]),
                    round(s["oldest_age"], 1),
                ]
                for s in samples
            ],
        }
        if eq is None:
            self.bench.notes.append(
                f"retention steady: the run ({seconds:g} s) ended before equilibrium ({t_eq:g} s)"
            )
        return figures

    # -- the long history -------------------------------------------------------------------

    def history(self) -> dict[str, Any]:
        bench, plan = self.bench, self.plan
        n = plan.prefill
        small_n = max(1, int(n * plan.small_share))
        # Received three to two days ago: older than the horizon and the dedupe window.
        now = time.time()
        dbs: dict[str, _Db] = {}
        fills: dict[str, Any] = {}
        daemons: dict[str, Daemon] = {}
        figures: dict[str, Any] = {"messages": {"full": n, "small": small_n}}
        try:
            for side, count in (("small", small_n), ("full", n)):
                dbs[side] = _Db(bench, self.server, f"ret_{side}")
                with bench.phase(f"retention_fill_{side}") as info:
                    fills[side] = dbs[side].fill(count, oldest=now - 3 * _DAY, span=_DAY)
                    fills[side]["db_mb"] = round(dbs[side].size_bytes() / 2**20, 1)
                    info.update(fills[side])
                print(f"   filled {count:,} in {fills[side]['seconds']:g} s", end="")
            figures["fill"] = fills
            for side in ("small", "full"):
                daemons[side] = dbs[side].daemon(bench, f"ret_{side}", self.storage)
            figures["purge_alone"] = self._purge_alone(dbs, daemons, small_n)
            figures.update(self._turns(dbs, daemons))
            figures["db_mb_end"] = {s: round(d.size_bytes() / 2**20, 1) for s, d in dbs.items()}
        finally:
            for side, daemon in daemons.items():
                figures.setdefault("stopped", {})[side] = self._stop(daemon)
            if self.server is not None:
                for d in dbs.values():
                    self.server.drop_database(d.name)
        purge = figures["purge_alone"]
        top = figures.get("ingest_per_s_highest")
        figures["purge_over_highest_ingest"] = _ratio(purge.get("full_per_s"), top)
        figures["purge_full_over_small"] = _ratio(purge.get("full_per_s"), purge.get("small_per_s"))
        return figures

    def _first_left(self, db: _Db, n: int) -> int:
        """How many of the first n (pre-filled) messages retention has purged: retention
        deletes the oldest first, and the fill numbered them oldest first."""
        low = db.value("SELECT min(id) FROM messages")
        return n if low is None or low > n else int(low) - 1

    def _purge_alone(self, dbs: dict[str, _Db], daemons: dict[str, Daemon], small_n: int) -> Any:
        """Both daemons idle but for retention: the purge rate of each while both purge, until
        the small history is gone or the cap."""
        plan = self.plan
        sizes = {"small": small_n, "full": plan.prefill}
        series: dict[str, list[tuple[float, int]]] = {s: [] for s in dbs}
        with self.bench.phase("retention_purge_alone", daemons=[d.pid for d in daemons.values()]):
            t0 = time.monotonic()
            while time.monotonic() - t0 < plan.purge_cap_seconds + plan.interval:
                for side, db in dbs.items():
                    series[side].append((time.monotonic() - t0, self._first_left(db, sizes[side])))
                if series["small"][-1][1] >= small_n and series["full"][-1][1] > 0:
                    break
                time.sleep(0.5)
        out: dict[str, Any] = {"series": {s: v[:: max(1, len(v) // 60)] for s, v in series.items()}}
        # The window: from the last sample before the later of the two made progress to the
        # small one's end (or the last sample), when both were purging.
        starts = [_started(v) for v in series.values()]
        if any(t is None for t in starts):
            out["note"] = "retention did not run on both within the window"
            self.bench.notes.append(f"retention purge: {out['note']}")
            return out
        start = max(t for t in starts if t is not None)
        small_done = next((t for t, done in series["small"] if done >= small_n), None)
        end = small_done if small_done is not None else series["small"][-1][0]
        if end - start < 2:  # the small one was gone before the full one began
            out["note"] = "the two purges did not overlap: each over its own span"
            for side, values in series.items():
                first = _started(values) or 0.0
                last = next((t for t, done in values if done >= sizes[side]), values[-1][0])
                done = _value_at(values, last) - _value_at(values, first)
                out[f"{side}_per_s"] = round(done / max(last - first, 1e-3), 1)
        else:
            out["window_seconds"] = round(end - start, 1)
            for side, values in series.items():
                done = _value_at(values, end) - _value_at(values, start)
                out[f"{side}_per_s"] = round(done / (end - start), 1)
        out["small_finished"] = small_done is not None
        return out

    def _turns(self, dbs: dict[str, _Db], daemons: dict[str, Daemon]) -> dict[str, Any]:
        """Ingestion and the drain of what it left, on each side in turns (small, full, full,
        small, …); the full side's retention purges meanwhile."""
        bench, plan = self.bench, self.plan
        rows: dict[str, list[dict[str, Any]]] = {"small": [], "full": []}
        left_before = self._first_left(dbs["full"], plan.prefill)
        t0 = time.monotonic()
        with bench.phase("retention_turns", daemons=[d.pid for d in daemons.values()]):
            for i in range(plan.pairs):
                for side in ("small", "full") if i % 2 == 0 else ("full", "small"):
                    rows[side].append(self._turn(daemons[side], f"rt{side[0]}{i}-"))
        seconds = time.monotonic() - t0
        purged = self._first_left(dbs["full"], plan.prefill) - left_before
        figures: dict[str, Any] = {"turns": rows}
        for key in ("ingest_per_s", "claim_per_s"):
            for side in rows:
                values = [r[key] for r in rows[side] if r[key] is not None]
                figures[f"{side}_{key}"] = round(sum(values) / len(values), 1) if values else None
            figures[f"{key}_full_over_small"] = _ratio(
                figures[f"full_{key}"], figures[f"small_{key}"]
            )
        figures["full_purge_per_s_during_turns"] = round(purged / seconds, 1)
        left = self._first_left(dbs["full"], plan.prefill)
        figures["full_purging_to_the_end"] = left < plan.prefill
        figures["ingest_per_s_highest"] = max(
            (r["ingest_per_s"] for side in rows for r in rows[side]), default=None
        )
        return figures

    def _turn(self, daemon: Daemon, prefix: str) -> dict[str, Any]:
        bench, plan = self.bench, self.plan
        received_before = bench.received.value
        cpu_before = cpu_seconds(daemon.pid)
        out = bench.ingest_job(
            daemon.port, clients=bench.plan.batch_clients, seconds=plan.slice_seconds, prefix=prefix
        )
        ingest = out["acked"] / out["elapsed"]
        at_end = bench.received.value - received_before
        backlog = out["acked"] - at_end
        drained, drain = bench.wait_received(received_before + out["acked"], plan.drain_cap_seconds)
        return {
            "ingest_per_s": round(ingest, 1),
            "errors": out["errors"],
            "backlog": backlog,
            "drain_seconds": round(drain, 2),
            "claim_per_s": round(backlog / drain, 1) if drained and drain > 0.5 else None,
            "daemon_cpu_s": round(cpu_seconds(daemon.pid) - cpu_before, 2),
        }


def _started(values: list[tuple[float, int]]) -> float | None:
    """The time of the last sample before the first progress."""
    before = values[0][0]
    for at, done in values:
        if done > 0:
            return before
        before = at
    return None


def _value_at(values: list[tuple[float, int]], t: float) -> int:
    best = values[0][1]
    for at, value in values:
        if at <= t:
            best = value
    return best
