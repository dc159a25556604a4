"""The PostgreSQL scenarios: N daemons on one fresh database behind the load generator, for
ingestion and for sustained delivery, beside PostgreSQL's own write limit from the same run.

Per figure: events/s, its ratio to the database's multi-row INSERT limit, the CPU per event
in the daemons and in the database's backends, and its growth from 1 daemon."""

from __future__ import annotations

import threading
import time
from typing import Any

from efdbench.pglimits import pg_write_limit
from efdbench.pgserver import PgCpu, PgServer
from efdbench.plan import INGEST_DELIVERY
from efdbench.processes import Daemon
from efdbench.procstats import cpu_seconds, machine_cpu_seconds
from efdbench.scenarios import Bench
from efdbench.stats import sample_at, window_fill

_DELIVER = {"timeout_seconds": 5, "retry_initial_seconds": 0.5, "retry_max_seconds": 2}
# The paced delivery's offered rate, as a share of what the first daemon count delivered
# flat out in the same run: low enough that every count keeps up with it, so the CPU per
# event of 1, 2 and 3 daemons is compared at one load rather than at saturation.
_PACED_SHARE = 0.5
# The "perdaemon" delivery offers each daemon the same load instead: the paced rate divided
# by the largest count, times the count. One load per daemon is what a host with a core per
# daemon would see as daemons are added; one total load shows instead what a daemon's
# smaller share costs (fewer events per transaction and per wake-up).
# The "single" delivery is flat out like "deliver", each daemon one process: it sends and
# parses itself (sender_processes = parse_processes = 0), the setting docs/scaling.md gives
# for more daemons than cores on one host, where helper processes only add switching.
_SINGLE = ({**_DELIVER, "sender_processes": 0}, {"parse_processes": 0})


def _limits(bench: Bench, server: PgServer) -> dict[str, Any]:
    plan = bench.plan
    out: dict[str, Any] = {}
    for method in ("insert", "copy"):
        for indexes in (True, False):
            name = f"pg_{method}{'' if indexes else '_noindex'}"
            with bench.phase(name) as info:
                limit = pg_write_limit(
                    server,
                    method=method,
                    indexes=indexes,
                    seconds=plan.sqlite_seconds,
                    max_rows=plan.sqlite_max_rows,
                )
                info.update(limit)
            out[f"limit_{method}{'' if indexes else '_noindex'}_events_per_s"] = limit[
                "events_per_s"
            ]
            if method == "insert" and indexes:
                out["limit_insert_pg_cpu_us_per_event"] = limit["pg_cpu_us_per_event"]
    return out


class _Measure:
    """CPU of the daemons, of the database's backends and of the machine over one window."""

    def __init__(self, daemons: list[Daemon], pg: PgCpu) -> None:
        self.daemons = daemons
        self.pg = pg

    def start(self) -> None:
        self.started = time.monotonic()
        self.daemon_cpu = sum(cpu_seconds(d.pid) for d in self.daemons)
        self.machine = machine_cpu_seconds()
        self.pg.start()

    def stop(self, events: int) -> dict[str, Any]:
        elapsed = time.monotonic() - self.started
        daemon_cpu = sum(cpu_seconds(d.pid) for d in self.daemons) - self.daemon_cpu
        pg = self.pg.stop()
        machine = machine_cpu_seconds()
        busy = machine["processes"] - self.machine["processes"]
        per_event = 1e6 / max(1, events)
        return {
            "daemon_cpu_us_per_event": round(daemon_cpu * per_event, 1),
            "pg_cpu_us_per_event": round(pg["backends"] * per_event, 1),
            "pg_aux_cpu_us_per_event": round(pg["aux"] * per_event, 1),
            "daemon_cpu_pct": round(daemon_cpu / elapsed * 100, 1),
            "pg_cpu_pct": round(pg["backends"] / elapsed * 100, 1),
            "machine_cpu_pct": round(busy / elapsed * 100, 1),
            "pg_backends": int(pg["backend_count"]),
            "pg_checkpoints": int(pg["checkpoints"]),
            # The database's transactions and row writes per event: how much work each
            # event's share of a batch carries as the daemons' batches shrink.
            "pg_commits_per_event": round(pg["commits"] * per_event / 1e6, 4),
            "pg_rows_updated_per_event": round(pg["updated"] * per_event / 1e6, 3),
        }


def _start_daemons(
    bench: Bench,
    server: PgServer,
    n: int,
    tag: str,
    delivery: dict[str, Any],
    hook: str,
    settings: dict[str, Any] | None = None,
) -> tuple[str, list[Daemon]]:
    db = server.create_database(tag)
    server.checkpoint()  # the phase before's writes are not this phase's to pay for
    url = server.url(db)
    daemons: list[Daemon] = []
    try:
        for i in range(n):
            daemons.append(
                Daemon(
                    f"{tag}_{i + 1}", bench.root, delivery, hook, storage_url=url, server=settings
                )
            )
    except BaseException:
        _stop_daemons(bench, daemons)
        raise
    return db, daemons


def _stop_daemons(bench: Bench, daemons: list[Daemon]) -> None:
    for daemon in daemons:
        info = daemon.stop()
        info["log_lines"] = daemon.log_counts()
        if info["log_lines"].get("ERROR") or info["log_lines"].get("Traceback"):
            info["first_error"] = daemon.first_error()
            bench.keep = True
            bench.notes.append(f"daemon {daemon.name}: {info['log_lines']} in its log")
        bench.phases[f"{daemon.name}_stop"] = info


def _ingest(bench: Bench, server: PgServer, n: int) -> dict[str, Any]:
    plan = bench.plan
    blackhole = bench.receiver.hello["blackhole_port"]
    db, daemons = _start_daemons(
        bench, server, n, f"ingest{n}", INGEST_DELIVERY, f"http://127.0.0.1:{blackhole}/hook"
    )
    ports = [d.port for d in daemons]
    try:
        bench.ingest_job(
            ports[0], ports=ports, clients=plan.batch_clients, seconds=plan.warmup_seconds,
            prefix=f"pw{n}",
        )  # fmt: skip
        measure = _Measure(daemons, PgCpu(server, db))
        with bench.phase(f"pg_ingest_{n}", daemons=[d.pid for d in daemons]) as info:
            measure.start()
            out = bench.ingest_job(
                ports[0], ports=ports, clients=plan.batch_clients, seconds=plan.ingest_seconds,
                prefix=f"pi{n}",
            )  # fmt: skip
            info.update(measure.stop(out["acked"]))
            info.update(
                events=out["acked"],
                errors=out["errors"],
                events_per_s=round(out["acked"] / out["elapsed"], 1),
            )
        return info
    finally:
        _stop_daemons(bench, daemons)
        server.drop_database(db)


def _deliver(
    bench: Bench,
    server: PgServer,
    n: int,
    rate: float | None = None,
    kind: str = "deliver",
    *,
    again: bool = False,
) -> dict[str, Any]:
    """Sustained delivery with `n` daemons: flat out (the ingesting clients held back only
    by the delivery window), or with `rate` a steady offered load of that many events/s
    (the phase named `kind`; `again`: its second pass, with names of its own). Kind
    "single": flat out, each daemon one process."""
    plan = bench.plan
    port = bench.receiver.hello["port"]
    label = f"{kind}_again" if again else kind
    prefix = f"p{kind[:2]}{n}{'b' if again else ''}"
    delivery, settings = _SINGLE if kind == "single" else (_DELIVER, None)
    db, daemons = _start_daemons(
        bench, server, n, f"{label}{n}", delivery, f"http://127.0.0.1:{port}/hook", settings
    )
    ports = [d.port for d in daemons]
    total = plan.deliver_warmup_seconds + plan.deliver_seconds
    try:
        bench.receiver.call("reset")
        measure = _Measure(daemons, PgCpu(server, db))
        with bench.phase(f"pg_{label}_{n}", daemons=[d.pid for d in daemons]) as info:
            # The CPU window starts after the warm-up, like the rate's: the sampler's
            # figures are read at the same moments.
            out: dict[str, Any] = {}
            started = time.monotonic()

            def run() -> None:
                out.update(
                    bench.ingest_job(
                        ports[0], ports=ports, clients=plan.deliver_clients, seconds=total,
                        prefix=prefix, window=plan.deliver_window, sample_every=0.25,
                        rate=rate,
                    )
                )  # fmt: skip

            worker = threading.Thread(target=run)
            worker.start()
            time.sleep(max(0.0, plan.deliver_warmup_seconds - (time.monotonic() - started)))
            measure.start()
            window_started = time.monotonic() - started
            worker.join()
            samples = out["samples"]
            first = sample_at(samples, window_started)
            last = sample_at(samples, total)
            delivered = last[2] - first[2]
            cpu = measure.stop(delivered)
            rate = delivered / max(last[0] - first[0], 1e-3)
            fill = window_fill(
                samples, out["received_before"], first[0], last[0], plan.deliver_window
            )
            acked = out["acked"]
            drained, _ = bench.wait_received(acked, plan.settle_cap_seconds)
            stats = bench.receiver.call("stats")
            info.update(cpu)
            info.update(
                delivered=delivered,
                events_acked=acked,
                events_per_s=round(rate, 1),
                window_fill=fill,
                errors=out["errors"],
                drained=drained,
                offered_per_s=rate,
                lost=acked - stats["unique"],
                duplicates=stats["duplicates"],
            )
        shares = [d.handed_over_share() for d in daemons]
        known = [share for share in shares if share is not None]
        info["handed_over_share"] = round(sum(known) / len(known), 3) if known else None
        return info
    finally:
        _stop_daemons(bench, daemons)
        server.drop_database(db)


_FIGURE_KEYS = (
    "events_per_s",
    "daemon_cpu_us_per_event",
    "pg_cpu_us_per_event",
    "pg_aux_cpu_us_per_event",
    "daemon_cpu_pct",
    "pg_cpu_pct",
    "machine_cpu_pct",
    "pg_checkpoints",
    "pg_commits_per_event",
    "pg_rows_updated_per_event",
)


# Flat-out delivery (with helper processes, then without) and the load per daemon run
# twice, the counts up and then down, around the paced phases (deliver 1 2 3, single 1 2 3,
# perdaemon 1 2 3, paced 1 2 3, perdaemon 3 2 1, single 3 2 1, deliver 3 2 1): each count's
# two phases then sit, on average, at the same moment of the run, so a machine that speeds
# up or slows down as the run goes does not decide whether more daemons deliver more. Their
# figures are the mean of the two passes; each pass's rate and growth are kept beside it.
_BOTH_WAYS = ("deliver", "single", "perdaemon")
# Averaged over the passes; the lost and the duplicates are summed.
_MEAN_KEYS = (*_FIGURE_KEYS, "handed_over_share", "window_fill")


def schedule(counts: list[int]) -> list[tuple[str, int]]:
    """The phases in the order they run: (kind, daemon count)."""
    up, down = list(counts), list(reversed(counts))
    order = [("ingest", n) for n in up]
    order += [(kind, n) for kind in _BOTH_WAYS for n in up]
    order += [("paced", n) for n in up]
    if len(counts) > 1:
        order += [(kind, n) for kind in reversed(_BOTH_WAYS) for n in down]
    return order


def combined(passes: list[dict[str, Any]]) -> dict[str, Any]:
    """One phase's figures from its passes: the mean of each (the sum of losses and
    duplicates), and each pass's rate as `events_per_s_each`."""
    if len(passes) == 1:
        return passes[0]
    out: dict[str, Any] = {}
    for key in _MEAN_KEYS:
        values = [p[key] for p in passes if p.get(key) is not None]
        out[key] = round(sum(values) / len(values), 3) if values else None
    for key in ("lost", "duplicates"):
        values = [p[key] for p in passes if p.get(key) is not None]
        out[key] = sum(values) if values else None
    out["events_per_s_each"] = [p.get("events_per_s") for p in passes]
    out["daemon_cpu_us_per_event_each"] = [p.get("daemon_cpu_us_per_event") for p in passes]
    return out


def _entry(kind: str, info: dict[str, Any]) -> dict[str, Any]:
    """`info`'s figures under the keys results.json gives them, for one daemon count."""
    entry = {f"{kind}_{key}": info.get(key) for key in _FIGURE_KEYS}
    busy = (info.get("daemon_cpu_us_per_event") or 0) + (info.get("pg_cpu_us_per_event") or 0)
    # What one core buys: the basis for sizing a larger host.
    entry[f"{kind}_events_per_core_s"] = round(1e6 / busy, 1) if busy else None
    if kind != "ingest":
        for key in ("lost", "duplicates", "handed_over_share", "window_fill"):
            entry[f"{kind}_{key}"] = info.get(key)
    for key in ("events_per_s_each", "daemon_cpu_us_per_event_each"):
        if key in info:
            entry[f"{kind}_{key}"] = info[key]
    return entry


def _over_first(
    entry: dict[str, Any], first: dict[str, Any], key: str, name: str, base_key: str = ""
) -> None:
    """Set `entry[name]` to `entry[key]` over the first count's `first[base_key or key]`: one
    figure, or each pass's (a list) where every pass of the first count has one."""
    value, base = entry.get(key), first.get(base_key or key)
    if isinstance(base, list):
        if base and all(base) and isinstance(value, list) and len(value) == len(base):
            entry[name] = [
                round(v / b, 3) if v is not None else None for v, b in zip(value, base, strict=True)
            ]
    elif base and value is not None:
        entry[name] = round(value / base, 3)


def run_postgresql(bench: Bench, server: PgServer, counts: list[int]) -> dict[str, Any]:
    """The `postgresql` section of results.json."""
    section: dict[str, Any] = {"server": server.settings()}
    section.update(_limits(bench, server))
    passes: dict[tuple[str, int], list[dict[str, Any]]] = {}
    paced: float | None = None  # set by the first count's flat-out delivery
    each: float | None = None
    ran: list[str] = []
    for kind, n in schedule(counts):
        again = (kind, n) in passes
        if kind == "ingest" and "ingest" in bench.only:
            info = _ingest(bench, server, n)
        elif kind == "deliver" and "deliver" in bench.only:
            info = _deliver(bench, server, n, again=again)
            if paced is None and info.get("events_per_s"):
                paced = section["paced_offered_per_s"] = round(
                    _PACED_SHARE * info["events_per_s"], -2
                )
                each = section["perdaemon_offered_per_s"] = round(paced / max(counts), -2)
        elif kind == "single" and "deliver" in bench.only:
            info = _deliver(bench, server, n, None, kind, again=again)
        elif kind == "paced" and paced:
            info = _deliver(bench, server, n, paced, kind)
        elif kind == "perdaemon" and each:
            info = _deliver(bench, server, n, each * n, kind, again=again)
        else:
            continue
        passes.setdefault((kind, n), []).append(info)
        ran.append(f"{kind} {n}")
    section["order"] = ran
    runs: dict[str, Any] = {str(n): {} for n in counts if any(c == n for _, c in passes)}
    for (kind, n), infos in passes.items():
        runs[str(n)].update(_entry(kind, combined(infos)))
    # The machine's speed drifts over the minutes the daemons run: the INSERT limit is
    # measured again at the end, and the ratios divide by the mean of both.
    with bench.phase("pg_insert_again") as info:
        insert_again = pg_write_limit(
            server,
            method="insert",
            indexes=True,
            seconds=bench.plan.sqlite_seconds,
            max_rows=bench.plan.sqlite_max_rows,
        )
        info.update(insert_again)
    section["limit_insert_events_per_s_each"] = [
        section["limit_insert_events_per_s"],
        insert_again["events_per_s"],
    ]
    limit = round((section["limit_insert_events_per_s"] + insert_again["events_per_s"]) / 2, 1)
    section["limit_insert_events_per_s"] = limit
    for count, entry in runs.items():
        for kind in ("ingest", "deliver", "single"):
            rate = entry.get(f"{kind}_events_per_s")
            if rate is not None and limit:
                entry[f"{kind}_ratio_to_limit"] = round(rate / limit, 3)
                entry[f"{kind}_per_daemon_ratio_to_limit"] = round(rate / int(count) / limit, 3)
    first = runs.get(str(counts[0]), {}) if counts else {}
    for entry in runs.values():
        for kind in ("ingest", "deliver", "single", "perdaemon"):
            _over_first(entry, first, f"{kind}_events_per_s", f"{kind}_growth")
        # One-process daemons against the first count's daemon as configured by default.
        _over_first(
            entry, first, "single_events_per_s", "single_over_deliver", "deliver_events_per_s"
        )
        for kind in _BOTH_WAYS:
            _over_first(entry, first, f"{kind}_events_per_s_each", f"{kind}_growth_each")
        # The goal for the daemons' CPU per event: flat as daemons are added.
        for kind in ("deliver", "paced", "perdaemon"):
            _over_first(
                entry, first, f"{kind}_daemon_cpu_us_per_event", f"{kind}_daemon_cpu_growth"
            )
    section["daemons"] = runs
    return section
