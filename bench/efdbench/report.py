"""The printed table: each figure beside its limit and its target."""

from __future__ import annotations

from typing import Any

from efdbench.plan import TARGETS

KEYS = (
    "bare_post_per_s",
    "sqlite_raw_rows_per_s",
    "ingest_batch_events_per_s",
    "ingest_single_events_per_s",
    "deliver_events_per_s",
    "deliver_ratio",
    "deliver_ratio_spread",
    "deliver_cpu_us_per_event",
    "bare_cpu_us_per_post",
    "deliver_cpu_ratio_to_bare",
    "actions_events_per_s",
    "actions_cpu_us_per_event",
    "actions_cpu_ratio_to_classic",
    "actions_lost",
    "actions_duplicates",
    "latency_p50_ms",
    "latency_p99_ms",
    "latency_cpu_us_per_event",
    "backlog_ingest_ratio",
    "rss_mb_backlog",
    "recovery_events_per_s",
    "lost",
    "duplicates",
)

LIMIT_OF = {
    "ingest_batch_events_per_s": "sqlite_raw_rows_per_s",
    "ingest_single_events_per_s": "sqlite_raw_rows_per_s",
    "deliver_events_per_s": "deliver_bare_post_per_s",
    "deliver_cpu_us_per_event": "bare_cpu_us_per_post",
    "actions_events_per_s": "actions_bare_post_per_s",
    "recovery_events_per_s": "deliver_events_per_s",
}


def _check(key: str, value: Any, results: dict[str, Any]) -> str:
    if value is None:
        return ""
    if key == "recovery_events_per_s":
        steady = results.get("deliver_events_per_s")
        if steady is None:
            return ""
        return "ok" if value >= steady else "MISS"
    if key not in TARGETS:
        return ""
    op, target = TARGETS[key]
    ok = {">=": value >= target, "<=": value <= target, "==": value == target}[op]
    return "ok" if ok else "MISS"


def _target_text(key: str) -> str:
    if key == "recovery_events_per_s":
        return ">= deliver"
    if key in TARGETS:
        op, target = TARGETS[key]
        return f"{op} {target:,}" if isinstance(target, int) else f"{op} {target}"
    return "(limit)" if key in ("bare_post_per_s", "sqlite_raw_rows_per_s") else ""


def fmt(value: Any) -> str:
    if value is None:
        return "-"
    if isinstance(value, float):
        return f"{value:,.1f}" if abs(value) >= 100 else f"{value:,.3g}"
    if isinstance(value, int):
        return f"{value:,}"
    return str(value)


def table(results: dict[str, Any]) -> str:
    rows = [("figure", "value", "limit (same run)", "% of limit", "target", "")]
    for key in KEYS:
        value = results.get(key)
        limit_key = LIMIT_OF.get(key)
        limit = results.get(limit_key) if limit_key else None
        share = f"{100 * value / limit:.1f}%" if value is not None and limit else ""
        rows.append(
            (
                key,
                fmt(value),
                f"{fmt(limit)} ({limit_key})" if limit_key else "",
                share,
                _target_text(key),
                _check(key, value, results),
            )
        )
    for key, limit_key in (
        ("sqlite_raw_efd_schema_rows_per_s", "sqlite_raw_rows_per_s"),
        ("sqlalchemy_core_events_per_s", "sqlite_raw_rows_per_s"),
    ):
        value, limit = results.get(key), results.get(limit_key)
        if value is not None:
            share = f"{100 * value / limit:.1f}%" if limit else ""
            rows.append(
                ("  " + key, fmt(value), f"{fmt(limit)} ({limit_key})", share, "(context)", "")
            )
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    lines = []
    for n, row in enumerate(rows):
        lines.append(
            "  ".join(
                cell.rjust(widths[i]) if 0 < i < 4 else cell.ljust(widths[i])
                for i, cell in enumerate(row)
            ).rstrip()
        )
        if n == 0:
            lines.append("  ".join("-" * w for w in widths))
    return "\n".join(lines)


_PG_COLUMNS = (
    ("events/s", "events_per_s"),
    ("x limit", "ratio_to_limit"),
    ("per daemon", "per_daemon_ratio_to_limit"),
    ("growth", "growth"),
    ("daemon us/ev", "daemon_cpu_us_per_event"),
    ("pg us/ev", "pg_cpu_us_per_event"),
    ("machine cpu%", "machine_cpu_pct"),
    ("commits/ev", "pg_commits_per_event"),
    ("updates/ev", "pg_rows_updated_per_event"),
)


# The PostgreSQL phases, in the order the console lists them.
_PG_KINDS = ("ingest", "deliver", "single", "paced", "perdaemon")


def _by_count(runs: dict[str, Any], counts: list[int], key: str) -> str:
    """'1 daemons x, 2 daemons y, …': one figure of each daemon count that ran."""
    return ", ".join(f"{n} daemons {fmt(runs[str(n)].get(key))}" for n in counts if str(n) in runs)


def _passes(n: int, entry: dict[str, Any], kind: str) -> str:
    """'2 daemons 9,100 / 9,500 (x 1.10 / x 1.20)': one count's rate in each pass, and its
    growth over the first count's in the same pass."""
    rates = " / ".join(fmt(v) for v in entry[f"{kind}_events_per_s_each"])
    growth = entry.get(f"{kind}_growth_each")
    shown = f" (x {' / x '.join(fmt(g) for g in growth)})" if growth and n != 1 else ""
    return f"{n} daemons {rates}{shown}"


def pg_table(section: dict[str, Any], counts: list[int]) -> str:
    """The PostgreSQL figures: the database's own limits, then one row per figure and
    number of daemons."""
    lines = ["PostgreSQL's own write limit (one client, 100 events a transaction):"]
    for key in (
        "limit_insert_events_per_s",
        "limit_insert_noindex_events_per_s",
        "limit_copy_events_per_s",
        "limit_copy_noindex_events_per_s",
    ):
        lines.append(f"  {key:36} {fmt(section.get(key)):>10}")
    lines.append(
        f"  {'limit_insert_pg_cpu_us_per_event':36} "
        f"{fmt(section.get('limit_insert_pg_cpu_us_per_event')):>10}"
    )
    rows = [("figure", "daemons", *(title for title, _ in _PG_COLUMNS))]
    runs = section.get("daemons", {})
    for kind in _PG_KINDS:
        for n in counts:
            entry = runs.get(str(n), {})
            if entry.get(f"{kind}_events_per_s") is None:
                continue
            rows.append(
                (kind, str(n), *(fmt(entry.get(f"{kind}_{key}")) for _, key in _PG_COLUMNS))
            )
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    for n, row in enumerate(rows):
        lines.append(
            "  ".join(
                c.ljust(widths[i]) if i == 0 else c.rjust(widths[i]) for i, c in enumerate(row)
            )
        )
        if n == 0:
            lines.append("  ".join("-" * w for w in widths))
    fills = [
        f"{n} daemons {fmt(runs[str(n)].get('deliver_window_fill'))}"
        for n in counts
        if str(n) in runs and runs[str(n)].get("deliver_window_fill") is not None
    ]
    if fills:
        # Near 1: delivery set the rate; well below: the ingesting clients did.
        lines.append("deliver window fill (median undelivered / window): " + ", ".join(fills))
    for kind in ("deliver", "single", "perdaemon"):
        passes = [
            _passes(n, runs[str(n)], kind)
            for n in counts
            if runs.get(str(n), {}).get(f"{kind}_events_per_s_each")
        ]
        if passes:
            # Counts up, then down: the mean of a count's two passes is what the rows show.
            lines.append(
                f"{kind} events/s in each pass (counts up, then down): " + ", ".join(passes)
            )
    if any(runs[str(n)].get("single_over_deliver") for n in counts if str(n) in runs):
        # Each daemon one process (no sender or parser processes), against one daemon as
        # configured by default.
        lines.append(
            "single (one process each) ÷ deliver with the first count: "
            + _by_count(runs, counts, "single_over_deliver")
        )
    offered = section.get("paced_offered_per_s")
    if offered:
        # The same load for every daemon count: CPU per event without saturation's effects.
        lines.append(
            f"paced: {fmt(offered)} events/s offered to every daemon count; handed over "
            + _by_count(runs, counts, "paced_handed_over_share")
        )
    each = section.get("perdaemon_offered_per_s")
    if each:
        # One load per daemon: a host with a core for each daemon, as daemons are added.
        lines.append(
            f"perdaemon: {fmt(each)} events/s offered per daemon ("
            + ", ".join(f"{n} daemons {fmt(each * n)}" for n in counts if str(n) in runs)
            + "); handed over "
            + _by_count(runs, counts, "perdaemon_handed_over_share")
        )
    growth = [
        f"{kind} " + _by_count(runs, counts, f"{kind}_daemon_cpu_growth")
        for kind in ("deliver", "paced", "perdaemon")
        if any(runs[str(n)].get(f"{kind}_daemon_cpu_growth") for n in counts if str(n) in runs)
    ]
    if growth:
        lines.append("daemon CPU per event ÷ the first count's: " + "; ".join(growth))
    during = [
        f"{kind} {n}: {runs[str(n)][f'{kind}_pg_checkpoints']}"
        for kind in _PG_KINDS
        for n in counts
        if runs.get(str(n), {}).get(f"{kind}_pg_checkpoints")
    ]
    if during:
        # A checkpoint inside a window makes its backends write whole pages into the WAL.
        lines.append("checkpoints during a measured window: " + ", ".join(during))
    return "\n".join(lines)


# The retention phase's figures: (label, section, key, goal).
_RETENTION_ROWS = (
    ("steady: delivered/s, last tenth ÷ first", "steady", "rate_last_over_first", ">= 0.9"),
    ("steady: acknowledged/s, last ÷ first", "steady", "acked_last_over_first", ""),
    ("steady: request p99 ms, first tenth", "steady", "request_p99_ms_first", ""),
    ("steady: request p99 ms, last tenth", "steady", "request_p99_ms_last", ""),
    ("steady: undelivered, first tenth (mean)", "steady", "backlog_mean_first", ""),
    ("steady: undelivered, last tenth (mean)", "steady", "backlog_mean_last", ""),
    ("steady: database MB at equilibrium", "steady", "db_mb_equilibrium", ""),
    ("steady: database MB at the end", "steady", "db_mb_end", ""),
    ("steady: end ÷ equilibrium", "steady", "db_end_over_equilibrium", "<= 1.2"),
    ("steady: retention lag, max s", "steady", "retention_lag_max_s", ""),
    ("steady: retention lag at the end, s", "steady", "retention_lag_end_s", ""),
    ("history: ingest/s, full ÷ small", "history", "ingest_per_s_full_over_small", ">= 0.9"),
    ("history: claim/s, full ÷ small", "history", "claim_per_s_full_over_small", ">= 0.9"),
    ("history: purge/s, full ÷ small", "history", "purge_full_over_small", ">= 0.9"),
    ("history: highest ingest/s measured", "history", "ingest_per_s_highest", ""),
    ("history: purge/s ÷ that", "history", "purge_over_highest_ingest", ">= 2"),
    ("history: full's purge/s during ingestion", "history", "full_purge_per_s_during_turns", ""),
)


def retention_table(figures: dict[str, Any]) -> str:
    """The retention phase's figures, each a ratio of the same run, beside its goal."""
    lines = []
    purge = figures.get("history", {}).get("purge_alone", {})
    for label, section, key, goal in _RETENTION_ROWS:
        value = figures.get(section, {}).get(key)
        if section in figures:
            lines.append(f"  {label:44} {fmt(value):>12}  {goal}")
    if purge:
        lines.append(
            f"  purge alone: small {fmt(purge.get('small_per_s'))}/s, full "
            f"{fmt(purge.get('full_per_s'))}/s over {fmt(purge.get('window_seconds'))} s"
        )
    code = figures.get("code", {})
    lines.append(f"  efd's retention: {code}; asked {figures.get('storage')}")
    return "\n".join(lines)
