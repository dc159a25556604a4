"""The performance tables, written from results.json (`bench/run.py --readme`): the README's
SQLite table and a short PostgreSQL one, and bench/README.md's whole PostgreSQL table."""

# ruff: noqa: RUF001  (the tables are prose: en dashes and multiplication signs)

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

_BLOCK = re.compile(
    r"(<!-- bench:(?P<name>[a-z-]+) -->\n).*?(<!-- /bench:(?P=name) -->)", re.DOTALL
)


def _n(value: Any, digits: int = 0) -> str:
    if value is None:
        return "–"
    return f"{value:,.{digits}f}"


def _x(value: Any, limit: Any) -> str:
    return f"{value / limit:.2f}" if value and limit else "–"


def _growth(entry: dict[str, Any], key: str, daemons: str) -> str:
    value = entry.get(key)
    if daemons == "1" or value is None:
        return ""
    each = entry.get(f"{key}_each") or []
    passes = ", ".join(f"× {g:.2f}" for g in each if g is not None)
    return f" (× {value:.2f}" + (f"; passes {passes}" if len(each) > 1 else "") + ")"


def _single(entry: dict[str, Any], daemons: str) -> str:
    """The one-process-each cells: events/s, its growth over 1 daemon as configured by
    default (and over 1 one-process daemon), losses; CPU per event."""
    over = entry.get("single_over_deliver")
    growth = entry.get("single_growth")
    shown = ""
    if over is not None:
        such = f"; × {growth:.2f} of 1 such daemon" if daemons != "1" and growth else ""
        shown = f" (× {over:.2f}{such})"
    return (
        f"{_n(entry.get('single_events_per_s'))}{shown}, "
        f"{_n(entry.get('single_lost'))} lost, {_n(entry.get('single_duplicates'))} "
        f"duplicates | {_n(entry.get('single_daemon_cpu_us_per_event'))} / "
        f"{_n(entry.get('single_pg_cpu_us_per_event'))} | "
    )


def _run(context: dict[str, Any], full: str) -> str:
    kind = "a quick run" if context.get("quick") else f"a full {full}run"
    date = context.get("date")
    return f"{kind} of {context.get('efd_commit') or '?'}" + (f" ({date})" if date else "")


def sqlite_table(results: dict[str, Any]) -> str:
    context = results.get("context", {})
    extra = context.get("extra", {})
    core = extra.get("sqlalchemy_core_events_per_s")
    bare = results.get("bare_post_per_s")
    # The delivery pairs' own figures are context (bench/efdbench/report.py).
    paired_bare = extra.get("deliver_bare_post_per_s") or bare
    spread = results.get("deliver_ratio_spread") or []
    cpu_spread = extra.get("deliver_cpu_us_per_event_spread") or []
    pairs = extra.get("deliver_pairs")
    recovery = results.get("recovery_events_per_s")
    steady = results.get("deliver_events_per_s")
    rows = [
        "| figure | measured | limit in the same run | target |",
        "|---|---|---|---|",
        f"| ingest_batch (100/request, 8 clients, durable) | "
        f"{_n(results.get('ingest_batch_events_per_s'))} events/s "
        f"({_x(results.get('ingest_batch_events_per_s'), core)} × Core) | "
        f"SQLAlchemy Core {_n(core)} events/s | ≥ 30,000 |",
        f"| ingest_single (64 clients) | {_n(results.get('ingest_single_events_per_s'))} "
        f"events/s ({_x(results.get('ingest_single_events_per_s'), bare)} × bare POST) | "
        f"bare POST {_n(bare)}/s | ≥ 5,000 |",
        f"| deliver (end to end, signed, attempts recorded; median of {pairs or '–'} pairs "
        f"with the bare POST) | {_n(steady)} events/s (ratio {_n(results.get('deliver_ratio'), 2)}"
        + (f", pairs {spread[0]:.2f}–{spread[1]:.2f}" if len(spread) == 2 else "")
        + f") | bare POST {_n(paired_bare)}/s | ratio ≥ 0.9 |",
        f"| CPU per delivered event (daemon + sender processes, ingestion included) | "
        f"{_n(results.get('deliver_cpu_us_per_event'))} µs"
        + (f" (pairs {cpu_spread[0]:.0f}–{cpu_spread[1]:.0f})" if len(cpu_spread) == 2 else "")
        + f", {_n(results.get('deliver_cpu_ratio_to_bare'), 2)} × bare | bare POST client "
        f"{_n(results.get('bare_cpu_us_per_post'))} µs per POST | ≤ 90 µs and ≤ 2 × bare |",
        f"| latency p50 / p99 at 1,000 events/s (single requests) | "
        f"{_n(results.get('latency_p50_ms'), 1)} / {_n(results.get('latency_p99_ms'), 1)} ms, "
        f"{_n(results.get('latency_cpu_us_per_event'))} µs CPU per event | | p99 ≤ 50 ms |",
        f"| ingest with {_n(extra.get('backlog_pending'))} deliveries pending (paired) | "
        f"ratio {_n(results.get('backlog_ingest_ratio'), 2)} | | ≥ 0.8 |",
        f"| RSS with that backlog (daemon with its sender and parser processes) | "
        f"{_n(results.get('rss_mb_backlog'))} MB | | ≤ 300 MB |",
        f"| recovery after a 503 outage ({_n(extra.get('recovery_messages'))} messages) | "
        f"{_n(recovery)} events/s ({_x(recovery, steady)} × steady), "
        f"{_n(results.get('lost'))} lost, {_n(results.get('duplicates'))} duplicates | | "
        "≥ steady |",
    ]
    head = f"SQLite, {_run(context, '')}:"
    return head + "\n\n" + "\n".join(rows) + "\n"


def pg_table(section: dict[str, Any]) -> str:
    context = section.get("context", {})
    limit = section.get("limit_insert_events_per_s")
    single = any("single_events_per_s" in e for e in section.get("daemons", {}).values())
    head = (
        f"PostgreSQL {str(section.get('server', {}).get('server_version', '')).split()[0]}, "
        f"N daemons on one fresh database, {_run(context, '`--scale` ')}; limit: one client's "
        f"multi-row INSERT of efd's rows, {_n(limit)} events/s (COPY "
        f"{_n(section.get('limit_copy_events_per_s'))}); targets: ingest ≥ 0.5 × limit a "
        "daemon, deliver ≥ 0.5 × limit with 1 daemon and more with 2–3. µs/event: CPU in the "
        "daemons / in PostgreSQL's backends; paced: delivering a steady "
        f"{_n(section.get('paced_offered_per_s'))} events/s (half of one daemon's flat-out "
        "rate), the same load for every count; per daemon: "
        f"{_n(section.get('perdaemon_offered_per_s'))} events/s for each daemon, the load "
        "growing with the count."
        + (
            " Deliver and per daemon: the mean of two passes, the counts up and then down "
            "(growth in each pass beside it)."
            if any("deliver_events_per_s_each" in e for e in section.get("daemons", {}).values())
            else ""
        )
        + (
            " One process each: deliver again, each daemon without sender and parser processes "
            "(`sender_processes = 0`, `parse_processes = 0`; growth over 1 daemon of the "
            "deliver column)."
            if single
            else ""
        )
    )
    rows = [
        "| daemons | ingest events/s | × limit (per daemon) | µs/event | deliver events/s "
        "| × limit | µs/event | "
        + ("one process each: deliver events/s | µs/event | " if single else "")
        + "paced µs/event | per daemon µs/event |",
        "|---|---|---|---|---|---|---|" + ("---|---|" if single else "") + "---|---|",
    ]
    for n, entry in sorted(section.get("daemons", {}).items(), key=lambda kv: int(kv[0])):
        ingest, deliver = entry.get("ingest_events_per_s"), entry.get("deliver_events_per_s")
        rows.append(
            f"| {n} | {_n(ingest)}{_growth(entry, 'ingest_growth', n)} | "
            f"{_n(entry.get('ingest_ratio_to_limit'), 2)} "
            f"({_n(entry.get('ingest_per_daemon_ratio_to_limit'), 2)}) | "
            f"{_n(entry.get('ingest_daemon_cpu_us_per_event'))} / "
            f"{_n(entry.get('ingest_pg_cpu_us_per_event'))} | "
            f"{_n(deliver)}{_growth(entry, 'deliver_growth', n)}, "
            f"{_n(entry.get('deliver_lost'))} lost, "
            f"{_n(entry.get('deliver_duplicates'))} duplicates | "
            f"{_n(entry.get('deliver_ratio_to_limit'), 2)} | "
            f"{_n(entry.get('deliver_daemon_cpu_us_per_event'))} / "
            f"{_n(entry.get('deliver_pg_cpu_us_per_event'))} | "
            + (_single(entry, n) if single else "")
            + f"{_n(entry.get('paced_daemon_cpu_us_per_event'))} / "
            f"{_n(entry.get('paced_pg_cpu_us_per_event'))} | "
            f"{_n(entry.get('perdaemon_daemon_cpu_us_per_event'))} / "
            f"{_n(entry.get('perdaemon_pg_cpu_us_per_event'))} |"
        )
    return head + "\n\n" + "\n".join(rows) + "\n"


def pg_summary(section: dict[str, Any]) -> str:
    """A few columns of the PostgreSQL table, for the project's front page."""
    context = section.get("context", {})
    limit = section.get("limit_insert_events_per_s")
    version = str(section.get("server", {}).get("server_version", "")).split()[0]
    head = (
        f"PostgreSQL {version}, N daemons on one database, {_run(context, '`--scale` ')}; "
        f"limit: one client's multi-row INSERT of efd's rows, {_n(limit)} events/s:"
    )
    rows = [
        "| daemons | ingest events/s (× limit) | deliver events/s (× limit) | lost, duplicates |",
        "|---|---|---|---|",
    ]
    for n, entry in sorted(section.get("daemons", {}).items(), key=lambda kv: int(kv[0])):
        rows.append(
            f"| {n} | {_n(entry.get('ingest_events_per_s'))} "
            f"({_n(entry.get('ingest_ratio_to_limit'), 2)}) | "
            f"{_n(entry.get('deliver_events_per_s'))} "
            f"({_n(entry.get('deliver_ratio_to_limit'), 2)}) | "
            f"{_n(entry.get('deliver_lost'))}, {_n(entry.get('deliver_duplicates'))} |"
        )
    return head + "\n\n" + "\n".join(rows) + "\n"


def tables(results: dict[str, Any]) -> dict[str, str]:
    """Every marked block's text, by marker name: `sqlite` and `postgresql-summary` in the
    README, `postgresql` in bench/README.md."""
    out = {"sqlite": sqlite_table(results)}
    if "postgresql" in results:
        out["postgresql"] = pg_table(results["postgresql"])
        out["postgresql-summary"] = pg_summary(results["postgresql"])
    return out


def update(path: Path, blocks: dict[str, str]) -> list[str]:
    """Rewrite the marked blocks of the file at `path` that `blocks` has; return their names."""
    done: list[str] = []

    def replace(match: re.Match[str]) -> str:
        name = match.group("name")
        if name not in blocks:
            return match.group(0)
        done.append(name)
        return match.group(1) + blocks[name] + match.group(3)

    text = _BLOCK.sub(replace, path.read_text())
    path.write_text(text)
    return done
