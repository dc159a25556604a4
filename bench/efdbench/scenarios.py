"""The scenarios: one daemon (or a pair) per scenario, each phase measured with the CPU of
every process beside it."""

from __future__ import annotations

import contextlib
import os
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from efdbench.bodies import action_destination, sample_webhook_body
from efdbench.limits import sqlalchemy_core, sqlite_raw
from efdbench.plan import INGEST_DELIVERY, Plan
from efdbench.processes import Daemon, Profiler, Worker, db_bytes
from efdbench.procstats import cpu_seconds, machine_cpu_seconds, memory_mb, own_cpu_seconds
from efdbench.stats import medians, p99_by_second, pct, rounded, sample_at, window_fill

# The delivering daemons' settings: short retries, so a slow start costs a slice little.
_DELIVER = {"timeout_seconds": 5, "retry_initial_seconds": 0.5, "retry_max_seconds": 2}


@dataclass
class Bench:
    plan: Plan
    quick: bool
    only: set[str]
    root: Path
    profiler: Profiler
    receiver: Worker
    generator: Worker
    received: Any
    results: dict[str, Any] = field(default_factory=dict)
    phases: dict[str, Any] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)
    daemon: Daemon | None = None
    keep: bool = False  # keep the temp dir (a daemon logged errors)

    # -- helpers -----------------------------------------------------------------------------

    @contextlib.contextmanager
    def phase(
        self, name: str, *, second_daemon: int | None = None, daemons: list[int] | None = None
    ) -> Iterator[dict[str, Any]]:
        pids = {
            "orchestrator": os.getpid(),
            "receiver": self.receiver.pid,
            "generator": self.generator.pid,
        }
        if self.daemon is not None:
            pids["daemon"] = self.daemon.pid
        if second_daemon is not None:
            pids["daemon2"] = second_daemon
        for i, pid in enumerate(daemons or []):
            pids[f"daemon{i + 1}"] = pid

        # A daemon's figure includes its sender processes; the others are single processes
        # (the orchestrator's children are the receiver, generator and daemons themselves).
        def cpu(key: str, pid: int) -> float:
            return cpu_seconds(pid) if key.startswith("daemon") else own_cpu_seconds(pid)

        before = {k: cpu(k, p) for k, p in pids.items()}
        machine_before = machine_cpu_seconds()
        info: dict[str, Any] = {}
        started = time.monotonic()
        print(f"  {name} ...", end="", flush=True)
        yield info
        elapsed = time.monotonic() - started
        info["seconds"] = round(elapsed, 2)
        used = {k: (cpu(k, p) - before[k]) / elapsed * 100 for k, p in pids.items()}
        machine = {
            k: (v - machine_before[k]) / elapsed * 100 for k, v in machine_cpu_seconds().items()
        }
        # Everything else on the machine (other users' jobs, py-spy): a noisy-run flag.
        used["other"] = max(0.0, machine["processes"] - sum(used.values()))
        used["irq"] = machine["irq"]
        used["steal"] = machine["steal"]
        info["cpu_pct"] = {k: round(v, 1) for k, v in used.items()}
        # The daemon's CPU per event: steadier than a rate when other jobs share the machine.
        events = info.get("events") or info.get("delivered")
        if "daemon" in used and events:
            info["daemon_cpu_us_per_event"] = round(
                used["daemon"] / 100 * elapsed / events * 1e6, 1
            )
        self.phases[name] = info
        if used["other"] + used["steal"] > 25:
            self.notes.append(
                f"{name}: other processes used {used['other']:.0f}% CPU and the hypervisor "
                f"stole {used['steal']:.0f}%: this figure is perturbed"
            )
        if info.get("errors"):
            self.notes.append(f"{name}: request errors {info['errors']}")
        shown = " ".join(f"{k}={v:.0f}" for k, v in used.items())
        print(f" {elapsed:.1f} s  cpu% {shown}")

    def wait_received(self, target: int, cap: float) -> tuple[bool, float]:
        started = time.monotonic()
        while self.received.value < target:
            if time.monotonic() - started > cap:
                return False, time.monotonic() - started
            time.sleep(0.02)
        return True, time.monotonic() - started

    def ingest_job(
        self, port: int, *, clients: int, seconds: float, path: str = "/v1/batch", **extra: Any
    ) -> dict[str, Any]:
        """The generator's closed-loop ingestion (job_ingest) against `port`, 100 a batch."""
        return self.generator.job(
            "ingest",
            seconds + 120,
            port=port,
            path=path,
            clients=clients,
            batch=self.plan.batch_size,
            duration=seconds,
            **extra,
        )

    def start_daemon(self, name: str, delivery: dict[str, Any], hook_url: str) -> Daemon:
        self.daemon = Daemon(name, self.root, delivery, hook_url)
        self.phases[f"{name}_startup"] = {"seconds": round(self.daemon.startup_seconds, 2)}
        return self.daemon

    def stop_daemon(self, other: Daemon | None = None) -> None:
        """Stop the scenario's daemon, or `other` started beside it."""
        daemon = other or self.daemon
        assert daemon is not None
        info = daemon.stop()
        info["log_lines"] = daemon.log_counts()
        if info["log_lines"].get("ERROR") or info["log_lines"].get("Traceback"):
            info["first_error"] = daemon.first_error()
            self.keep = True
            self.notes.append(
                f"daemon {daemon.name}: {info['log_lines']} in its log ({daemon.log_path}, "
                "kept; the first is in context.phases)"
            )
        info["log_tail"] = daemon.log_tail(5).splitlines()
        self.phases[f"{daemon.name}_stop"] = info
        if other is None:
            self.daemon = None

    # -- phases ------------------------------------------------------------------------------

    def limits(self) -> None:
        plan = self.plan
        with self.phase("sqlite_raw") as info:
            raw = sqlite_raw(
                self.root / "raw.db", plan.sqlite_seconds, plan.sqlite_max_rows, indexes=False
            )
            info.update(raw)
        self.results["sqlite_raw_rows_per_s"] = raw["events_per_s"]
        with self.phase("sqlite_raw_efd_schema") as info:
            raw = sqlite_raw(
                self.root / "raw-idx.db", plan.sqlite_seconds, plan.sqlite_max_rows, indexes=True
            )
            info.update(raw)
        self.results["sqlite_raw_efd_schema_rows_per_s"] = raw["events_per_s"]
        with self.phase("sqlalchemy_core") as info:
            core = sqlalchemy_core(self.root / "core.db", plan.sqlite_seconds, plan.sqlite_max_rows)
            info.update(core)
        self.results["sqlalchemy_core_events_per_s"] = core["events_per_s"]
        port = self.receiver.hello["port"]
        with self.phase("bare_post") as info:
            bare = self.generator.job(
                "bare",
                plan.bare_seconds + 60,
                url=f"http://127.0.0.1:{port}/bare",
                duration=plan.bare_seconds,
                concurrency=plan.bare_concurrency,
                body=sample_webhook_body(),
            )
            info.update({k: bare[k] for k in ("count", "errors")})
        self.results["bare_post_per_s"] = round(bare["count"] / bare["elapsed"], 1)

    def ingest_rate(self, name: str, path: str, clients: int, prefix: str) -> dict[str, Any]:
        assert self.daemon is not None
        plan = self.plan
        with (
            self.phase(name) as info,
            self.profiler.record(name, self.daemon.pid, plan.ingest_seconds),
        ):
            out = self.ingest_job(
                self.daemon.port,
                clients=clients,
                seconds=plan.ingest_seconds,
                path=path,
                prefix=prefix,
            )
            rate = out["acked"] / out["elapsed"]
            info.update(
                events=out["acked"],
                requests=out["requests"],
                errors=out["errors"],
                request_p50_ms=rounded(out["request_p50_ms"]),
                request_p99_ms=rounded(out["request_p99_ms"]),
                events_per_s=round(rate, 1),
            )
        return info

    def ingest_and_backlog(self) -> None:
        plan = self.plan
        blackhole = self.receiver.hello["blackhole_port"]
        daemon = self.start_daemon("ingest", INGEST_DELIVERY, f"http://127.0.0.1:{blackhole}/hook")
        try:
            # A short warm-up first (the daemon's first requests are slower: caches, the
            # first WAL growth, allocator): not counted, reported in context.phases.
            with self.phase("ingest_warmup") as info:
                out = self.ingest_job(
                    daemon.port,
                    clients=plan.batch_clients,
                    seconds=plan.warmup_seconds,
                    prefix="iw",
                )
                info.update(events=out["acked"], errors=out["errors"])
            batch = self.ingest_rate("ingest_batch", "/v1/batch", plan.batch_clients, "ib")
            self.results["ingest_batch_events_per_s"] = batch["events_per_s"]
            single = self.ingest_rate("ingest_single", "/v1/track", plan.single_clients, "is")
            self.results["ingest_single_events_per_s"] = single["events_per_s"]
            if "backlog" not in self.only:
                return
            with self.phase("backlog_fill") as info:
                have = daemon.pending()
                need = max(0, plan.backlog_target - have)
                out = self.ingest_job(
                    daemon.port,
                    clients=plan.fill_clients,
                    seconds=plan.backlog_fill_cap_seconds,
                    max_events=need,
                    prefix="fill",
                )
                pending = daemon.pending()
                info.update(
                    events=out["acked"],
                    errors=out["errors"],
                    events_per_s=round(out["acked"] / out["elapsed"], 1),
                    pending_after=pending,
                    db_mb=round(db_bytes(daemon.db) / 2**20, 1),
                    rss=memory_mb(daemon.pid),
                )
            if pending < plan.backlog_target:
                self.notes.append(
                    f"backlog: reached {pending:,} pending deliveries, not "
                    f"{plan.backlog_target:,}: the fill is capped at "
                    f"{plan.backlog_fill_cap_seconds:g} s"
                )
            if self.quick:
                self.notes.append(
                    f"--quick: backlog of {pending:,} pending deliveries, not 1,000,000"
                )
            backlog = self.paired_backlog_rate(daemon, blackhole)
            memory = memory_mb(daemon.pid)
            self.phases["ingest_batch_backlog"]["rss"] = memory
            self.phases["ingest_batch_backlog"]["pending_before"] = pending
            self.results["backlog_pending"] = pending
            self.results["backlog_ingest_ratio"] = backlog["ratio"]
            if batch["events_per_s"]:
                # The unpaired figure, for comparison: minutes apart, so machine drift shows.
                self.results["backlog_ingest_ratio_sequential"] = round(
                    backlog["events_per_s"] / batch["events_per_s"], 3
                )
            self.results["rss_mb_backlog"] = memory.get("VmRSS")
            self.results["rss_mb_backlog_peak"] = memory.get("VmHWM")
        finally:
            self.receiver.call("close_blackhole")  # the hung request fails fast at stop
            self.stop_daemon()

    def paired_backlog_rate(self, daemon: Daemon, blackhole: int) -> dict[str, Any]:
        """The /v1/batch rate of `daemon` (its backlog filled) and of a second daemon on an
        empty store, measured in alternating slices: the ratio of the two.

        This machine's speed drifts by 20 % or more over a minute (other tenants), and the
        empty-store figure is taken minutes before the backlog is full. Slices a few seconds
        long, in the order ABBA ABBA…, cancel that drift: both daemons see the same machine.
        """
        plan = self.plan
        fresh = Daemon(
            "ingest_fresh", self.root, INGEST_DELIVERY, f"http://127.0.0.1:{blackhole}/hook"
        )
        self.phases["ingest_fresh_startup"] = {"seconds": round(fresh.startup_seconds, 2)}
        sides = {"backlog": daemon, "fresh": fresh}
        totals = {side: {"events": 0, "seconds": 0.0, "cpu": 0.0} for side in sides}

        def ingest(side: str, seconds: float, prefix: str) -> dict[str, Any]:
            target = sides[side]
            cpu_before = cpu_seconds(target.pid)
            out = self.ingest_job(
                target.port,
                clients=plan.batch_clients,
                seconds=seconds,
                prefix=prefix,
            )
            out["cpu"] = cpu_seconds(target.pid) - cpu_before
            return out

        try:
            ingest("fresh", plan.warmup_seconds, "ibw")  # not counted, as for ingest_batch
            with (
                self.phase("ingest_batch_backlog", second_daemon=fresh.pid) as info,
                self.profiler.record(
                    "ingest_batch_backlog", daemon.pid, 2 * plan.pair_seconds * plan.pairs
                ),
            ):
                for i in range(plan.pairs):
                    order = ("fresh", "backlog") if i % 2 == 0 else ("backlog", "fresh")
                    for side in order:
                        out = ingest(side, plan.pair_seconds, f"ib{side[0]}{i}-")
                        totals[side]["events"] += out["acked"]
                        totals[side]["seconds"] += out["elapsed"]
                        totals[side]["cpu"] += out["cpu"]
                        if out["errors"]:
                            info.setdefault("errors", {}).update(out["errors"])
                rates = {
                    side: t["events"] / t["seconds"] if t["seconds"] else 0.0
                    for side, t in totals.items()
                }
                info.update(
                    events=totals["backlog"]["events"],
                    events_per_s=round(rates["backlog"], 1),
                    fresh_events_per_s=round(rates["fresh"], 1),
                    pairs=plan.pairs,
                    pair_seconds=plan.pair_seconds,
                    daemon_cpu_us_per_event_fresh=round(
                        totals["fresh"]["cpu"] / max(1, totals["fresh"]["events"]) * 1e6, 1
                    ),
                )
            info["daemon_cpu_us_per_event"] = round(
                totals["backlog"]["cpu"] / max(1, totals["backlog"]["events"]) * 1e6, 1
            )
        finally:
            stopped = fresh.stop()
            stopped["log_lines"] = fresh.log_counts()
            self.phases["ingest_fresh_stop"] = stopped
        ratio = round(rates["backlog"] / rates["fresh"], 3) if rates["fresh"] else 0.0
        return {"events_per_s": rates["backlog"], "ratio": ratio}

    def deliver_and_latency(self) -> None:
        port = self.receiver.hello["port"]
        daemon = self.start_daemon("deliver", _DELIVER, f"http://127.0.0.1:{port}/hook")
        try:
            if "deliver" in self.only:
                self.deliver(daemon)
            if "actions" in self.only:
                self.actions(daemon)
            if "latency" in self.only:
                self.latency(daemon)
            self.results["rss_mb_after_delivery"] = memory_mb(daemon.pid).get("VmRSS")
        finally:
            self.stop_daemon()

    def deliver(self, daemon: Daemon) -> None:
        """Delivery beside its limit, in pairs: the bare aiohttp POST (A), then efd's delivery
        of the same kind of signed body to the same receiver (B), A B A B …, so that the
        machine's drift falls on both. Per pair: each side's rate, the bare client's own CPU
        per POST and the daemon's (with its sender processes) per delivered event; the
        figures are the medians, the spread the smallest and largest pair."""
        plan = self.plan
        port = self.receiver.hello["port"]
        self.receiver.call("reset")
        pairs: list[dict[str, Any]] = []
        warm = self.deliver_slice(daemon, -1)  # the daemon's first rounds: not counted
        acked_total = warm["acked"]
        with self.phase("deliver") as info:
            for i in range(plan.deliver_pairs):
                bare = self.bare_slice(port)
                efd = self.deliver_slice(daemon, i)
                acked_total += efd["acked"]
                pair = {
                    "bare_per_s": bare["per_s"],
                    "bare_cpu_us_per_post": bare["cpu_us_per_post"],
                    "deliver_per_s": efd["per_s"],
                    "daemon_cpu_us_per_event": efd["cpu_us_per_event"],
                    "generator_cpu_us_per_event": efd["generator_cpu_us_per_event"],
                    "receiver_cpu_us_per_event": efd["receiver_cpu_us_per_event"],
                    "machine_cpu_pct": [bare["machine_cpu_pct"], efd["machine_cpu_pct"]],
                    "loadavg": [bare["loadavg"], efd["loadavg"]],
                    "window_fill": efd["window_fill"],
                }
                if bare["per_s"]:
                    pair["ratio"] = round(efd["per_s"] / bare["per_s"], 3)
                if bare["cpu_us_per_post"]:
                    pair["cpu_ratio"] = round(efd["cpu_us_per_event"] / bare["cpu_us_per_post"], 2)
                pairs.append(pair)
                print(
                    f" [{i + 1}] bare {bare['per_s']:,.0f}/s {bare['cpu_us_per_post']:.0f} us,"
                    f" efd {efd['per_s']:,.0f}/s {efd['cpu_us_per_event']:.0f} us"
                    f" (generator {efd['generator_cpu_us_per_event']:.0f},"
                    f" receiver {efd['receiver_cpu_us_per_event']:.0f})",
                    end="",
                    flush=True,
                )
            time.sleep(0.5)  # late duplicates
            stats = self.receiver.call("stats")
            info.update(
                delivered=stats["unique"],
                events_acked=acked_total,
                pairs=pairs,
                receiver=stats,
            )
        figures = medians(
            pairs,
            (
                "ratio",
                "deliver_per_s",
                "bare_per_s",
                "daemon_cpu_us_per_event",
                "bare_cpu_us_per_post",
                "cpu_ratio",
                "window_fill",
            ),
        )
        info["medians"] = figures
        self.results["deliver_events_per_s"] = figures["deliver_per_s"][0]
        self.results["deliver_ratio"] = figures["ratio"][0]
        self.results["deliver_ratio_spread"] = figures["ratio"][1]
        self.results["deliver_bare_post_per_s"] = figures["bare_per_s"][0]
        self.results["deliver_cpu_us_per_event"] = figures["daemon_cpu_us_per_event"][0]
        self.results["deliver_cpu_us_per_event_spread"] = figures["daemon_cpu_us_per_event"][1]
        self.results["bare_cpu_us_per_post"] = figures["bare_cpu_us_per_post"][0]
        self.results["deliver_cpu_ratio_to_bare"] = figures["cpu_ratio"][0]
        self.results["deliver_window_fill"] = figures["window_fill"][0]
        self.results["deliver_pairs"] = len(pairs)
        self.results["deliver_lost"] = acked_total - stats["unique"]
        self.results["deliver_duplicates"] = stats["duplicates"]
        self.results["deliver_handed_over_share"] = daemon.handed_over_share()
        if stats["bad_signatures"]:
            self.notes.append(f"deliver: {stats['bad_signatures']} sampled signatures were wrong")

    def actions(self, classic: Daemon) -> None:
        """An Actions destination (one action, a ten-field mapping: bodies.ACTION_DATA) beside
        the classic body, in triples: the bare POST, the classic daemon's delivery, the
        Actions daemon's, so the machine's drift falls on all three. The figure is the
        Actions daemon's CPU per delivered event over the classic one's, pair by pair."""
        plan = self.plan
        port = self.receiver.hello["port"]
        url = f"http://127.0.0.1:{port}/hook"
        mapped = Daemon("actions", self.root, _DELIVER, url, destination=action_destination(url))
        self.phases["actions_startup"] = {"seconds": round(mapped.startup_seconds, 2)}
        try:
            self.receiver.call("reset")
            acked = self.deliver_slice(classic, "cw")["acked"]  # warm-ups: not counted
            acked += self.deliver_slice(mapped, "aw")["acked"]
            triples: list[dict[str, Any]] = []
            with self.phase("actions", second_daemon=mapped.pid) as info:
                for i in range(plan.deliver_pairs):
                    bare = self.bare_slice(port)
                    plain = self.deliver_slice(classic, f"c{i}")
                    actions = self.deliver_slice(mapped, f"a{i}")
                    acked += plain["acked"] + actions["acked"]
                    triple = {
                        "bare_per_s": bare["per_s"],
                        "bare_cpu_us_per_post": bare["cpu_us_per_post"],
                        "classic_per_s": plain["per_s"],
                        "classic_cpu_us_per_event": plain["cpu_us_per_event"],
                        "actions_per_s": actions["per_s"],
                        "actions_cpu_us_per_event": actions["cpu_us_per_event"],
                    }
                    if plain["cpu_us_per_event"]:
                        triple["cpu_ratio"] = round(
                            actions["cpu_us_per_event"] / plain["cpu_us_per_event"], 3
                        )
                    triples.append(triple)
                    print(
                        f" [{i + 1}] classic {plain['cpu_us_per_event']:.0f} us,"
                        f" actions {actions['cpu_us_per_event']:.0f} us",
                        end="",
                        flush=True,
                    )
                time.sleep(0.5)  # late duplicates
                stats = self.receiver.call("stats")
                info.update(delivered=stats["unique"], events_acked=acked, triples=triples)
            figures = medians(
                triples,
                (
                    "cpu_ratio",
                    "actions_cpu_us_per_event",
                    "classic_cpu_us_per_event",
                    "actions_per_s",
                    "bare_per_s",
                ),
            )
            info["medians"] = figures
            self.results["actions_cpu_ratio_to_classic"] = figures["cpu_ratio"][0]
            self.results["actions_cpu_ratio_spread"] = figures["cpu_ratio"][1]
            self.results["actions_cpu_us_per_event"] = figures["actions_cpu_us_per_event"][0]
            self.results["actions_events_per_s"] = figures["actions_per_s"][0]
            self.results["actions_bare_post_per_s"] = figures["bare_per_s"][0]
            self.results["actions_lost"] = acked - stats["unique"]
            self.results["actions_duplicates"] = stats["duplicates"]
            if stats["bad_signatures"]:
                self.notes.append(f"actions: {stats['bad_signatures']} sampled signatures wrong")
        finally:
            self.stop_daemon(mapped)

    def bare_slice(self, port: int) -> dict[str, Any]:
        """The delivery stack's limit for one pair: the generator's aiohttp client alone,
        with the generator's own CPU per POST."""
        plan = self.plan
        generator = self.generator.pid
        cpu_before = own_cpu_seconds(generator)
        machine_before = machine_cpu_seconds()["processes"]
        loadavg = os.getloadavg()[0]
        bare = self.generator.job(
            "bare",
            plan.deliver_pair_seconds + 60,
            url=f"http://127.0.0.1:{port}/bare",
            duration=plan.deliver_pair_seconds,
            concurrency=plan.bare_concurrency,
            body=sample_webhook_body(),
        )
        cpu = own_cpu_seconds(generator) - cpu_before
        machine = machine_cpu_seconds()["processes"] - machine_before
        count = bare["count"]
        return {
            "per_s": round(count / bare["elapsed"], 1),
            "cpu_us_per_post": round(cpu / max(count, 1) * 1e6, 1),
            "machine_cpu_pct": round(machine / bare["elapsed"] * 100, 1),
            "loadavg": round(loadavg, 2),
        }

    def deliver_slice(self, daemon: Daemon, index: int | str) -> dict[str, Any]:
        """efd's side of one pair: /v1/batch clients ingest while at most `deliver_window`
        acknowledged messages are undelivered; the receipt rate after the warm-up, and the
        daemon's CPU from the slice's start until all it acknowledged were delivered, per
        delivered event (so ingestion's share of each event is in it, as in production)."""
        plan = self.plan
        total = plan.deliver_pair_warmup_seconds + plan.deliver_pair_seconds
        received_before = self.received.value
        cpu_before = cpu_seconds(daemon.pid)
        harness = (self.generator.pid, self.receiver.pid)
        harness_before = [own_cpu_seconds(pid) for pid in harness]
        machine_before = machine_cpu_seconds()["processes"]
        loadavg = os.getloadavg()[0]
        started = time.monotonic()
        with self.profiler.record(f"deliver_{index}", daemon.pid, total):
            out = self.ingest_job(
                daemon.port,
                clients=plan.deliver_clients,
                seconds=total,
                prefix=f"dl{index}-",
                window=plan.deliver_window,
                sample_every=0.25,
            )
        samples = out["samples"]
        start = sample_at(samples, plan.deliver_pair_warmup_seconds)
        stop = sample_at(samples, total)
        rate = (stop[2] - start[2]) / max(stop[0] - start[0], 1e-3)
        fill = window_fill(samples, out["received_before"], start[0], stop[0], plan.deliver_window)
        drained, _ = self.wait_received(received_before + out["acked"], plan.settle_cap_seconds)
        cpu = cpu_seconds(daemon.pid) - cpu_before
        elapsed = time.monotonic() - started
        machine = machine_cpu_seconds()["processes"] - machine_before
        # The harness shares the machine with efd in this slice and not in the bare one
        # (where the generator is the client measured): what it costs per delivered event.
        generator, receiver = (
            own_cpu_seconds(pid) - before
            for pid, before in zip(harness, harness_before, strict=True)
        )
        delivered = self.received.value - received_before
        if not drained:
            self.notes.append(f"deliver pair {index}: not drained in time")
        if out["errors"]:
            self.notes.append(f"deliver pair {index}: request errors {out['errors']}")
        return {
            "per_s": round(rate, 1),
            "window_fill": fill,
            "acked": out["acked"],
            "cpu_us_per_event": round(cpu / max(delivered, 1) * 1e6, 1),
            "generator_cpu_us_per_event": round(generator / max(delivered, 1) * 1e6, 1),
            "receiver_cpu_us_per_event": round(receiver / max(delivered, 1) * 1e6, 1),
            "machine_cpu_pct": round(machine / elapsed * 100, 1),
            "loadavg": round(loadavg, 2),
        }

    def latency(self, daemon: Daemon) -> None:
        plan = self.plan
        before = daemon.handed_over()
        with (
            self.phase("latency") as info,
            self.profiler.record("latency", daemon.pid, plan.latency_seconds),
        ):
            out = self.generator.job(
                "paced",
                plan.latency_seconds + 120,
                port=daemon.port,
                rate=plan.latency_rate,
                duration=plan.latency_seconds,
                prefix="lat",
            )
            acks: dict[str, float] = out["acks"]
            deadline = time.monotonic() + plan.settle_cap_seconds
            receipts: dict[str, float] = {}
            while time.monotonic() < deadline:
                receipts = self.receiver.call("receipts", "lat-")
                if len(receipts) >= len(acks):
                    break
                time.sleep(0.2)
            from_ack = sorted(receipts[m] - t for m, t in acks.items() if m in receipts)
            from_send = sorted(receipts[m] - out["sends"][m] for m in acks if m in receipts)
            info.update(
                offered=out["offered"],
                acked=len(acks),
                received=sum(1 for m in acks if m in receipts),
                # per delivered event, the daemon's CPU at this rate (phase())
                delivered=len(receipts),
                errors=out["errors"],
                late_sends=out["late_sends"],
                achieved_rate=round(out["offered"] / out["elapsed"], 1),
                ack_to_receipt_ms={
                    p: rounded(pct(from_ack, p) * 1000) for p in (0, 50, 90, 99, 99.9, 100)
                },
                send_to_receipt_ms={p: rounded(pct(from_send, p) * 1000) for p in (50, 99)},
                receipt_before_ack=sum(1 for v in from_ack if v < 0),
                ack_to_receipt_p99_ms_by_second=p99_by_second(acks, receipts),
            )
        # A receipt can precede the ack reaching the client (efd wakes the dispatcher
        # before the response is written); such latencies count as 0.
        clipped = [max(0.0, v) for v in from_ack]
        self.results["latency_p50_ms"] = rounded(pct(clipped, 50) * 1000)
        self.results["latency_p99_ms"] = rounded(pct(clipped, 99) * 1000)
        self.results["latency_missing"] = len(acks) - len(from_ack)
        # CPU per event at a rate the daemon keeps up with, as in production below its limit.
        self.results["latency_cpu_us_per_event"] = info.get("daemon_cpu_us_per_event")
        self.results["latency_handed_over_share"] = daemon.handed_over_share(before)

    def recovery(self) -> None:
        plan = self.plan
        port = self.receiver.hello["port"]
        # The hook's circuit opens during the outage; probed every 0.5 s (the first retry's
        # interval), the drain measures how fast the backlog goes once the receiver is back,
        # not how long the default 30 s probe interval makes it wait.
        daemon = self.start_daemon(
            "recovery",
            {
                "timeout_seconds": 5,
                "retry_initial_seconds": 0.5,
                "retry_max_seconds": 2,
                "circuit_probe_seconds": 0.5,
            },
            f"http://127.0.0.1:{port}/hook",
        )
        try:
            self.receiver.call("reset")
            self.receiver.call("status", 503)
            n = plan.recovery_messages
            with (
                self.phase("recovery_accept") as info,
                self.profiler.record(
                    "recovery_accept", daemon.pid, min(plan.recovery_accept_cap_seconds, 15)
                ),
            ):
                out = self.ingest_job(
                    daemon.port,
                    clients=plan.batch_clients,
                    seconds=plan.recovery_accept_cap_seconds,
                    max_events=n,
                    prefix="rec",
                    keep_ids=True,
                )
                acked_ids: list[str] = out["ids"]
                info.update(
                    accepted=len(acked_ids),
                    events_per_s=round(len(acked_ids) / out["elapsed"], 1),
                    errors=out["errors"],
                    answered_503_at_accepted=self.receiver.call("stats")["hook_503"],
                )
                # Stay down until every accepted message has met a 503 or the hook's circuit
                # opened (then only probes reach it), so the drain is a drain of retries.
                deadline = time.monotonic() + plan.recovery_attempt_cap_seconds
                while time.monotonic() < deadline:
                    stats = self.receiver.call("stats")
                    if stats["hook_503"] >= len(acked_ids) or daemon.circuit_open():
                        break
                    time.sleep(0.1)
                info.update(answered_503=stats["hook_503"], pending=daemon.pending())
            if len(acked_ids) < n:
                self.notes.append(
                    f"recovery: only {len(acked_ids):,} of {n:,} messages accepted in "
                    f"{plan.recovery_accept_cap_seconds:g} s"
                )
            if self.quick:
                self.notes.append(f"--quick: recovery with {n:,} messages, not 50,000")
            with (
                self.phase("recovery_drain") as info,
                self.profiler.record(
                    "recovery_drain", daemon.pid, min(plan.recovery_drain_cap_seconds, 20)
                ),
            ):
                self.receiver.call("status", 200)
                drained, seconds = self.wait_received(
                    len(acked_ids), plan.recovery_drain_cap_seconds
                )
                time.sleep(plan.late_receipt_seconds)  # retries in flight (duplicates) arrive
                stats = self.receiver.call("stats")
                missing = self.receiver.call("missing", acked_ids, timeout=120)
                info.update(
                    drained=drained,
                    drain_seconds=round(seconds, 2),
                    receiver=stats,
                    pending_after=daemon.pending(),
                    missing_sample=missing[:5],
                )
            if acked_ids:
                self.results["recovery_events_per_s"] = round(
                    (len(acked_ids) - len(missing)) / max(seconds, 1e-3), 1
                )
            self.results["recovery_messages"] = len(acked_ids)
            self.results["lost"] = len(missing)
            self.results["duplicates"] = stats["duplicates"]
        finally:
            self.receiver.call("status", 200)
            self.stop_daemon()
