"""The command line: parse options, run the scenarios, write results.json."""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import io
import json
import multiprocessing as mp
import os
import platform
import shutil
import sqlite3
import subprocess
import sys
import tarfile
import tempfile
import time
import traceback
from pathlib import Path
from typing import Any

from efdbench import readme
from efdbench.brokers import BROKERS_FULL, BROKERS_QUICK, BROKERS_SMOKE, KINDS, run_brokers
from efdbench.loadgen import generator_main
from efdbench.pgscale import run_postgresql
from efdbench.pgserver import OwnCluster, PgServer, admin_url
from efdbench.plan import FULL, OPTIONAL_PHASES, PHASES, QUICK, SMOKE, Plan
from efdbench.processes import SIGNING, Daemon, Profiler, Worker, free_port
from efdbench.receiver import receiver_main
from efdbench.report import KEYS, fmt, pg_table, retention_table, table
from efdbench.retention import Retention, RetentionPlan
from efdbench.scenarios import Bench

HERE = Path(__file__).resolve().parent.parent
ROOT = HERE.parent


def main(argv: list[str] | None = None, doc: str | None = None) -> int:
    parser = argparse.ArgumentParser(description=(doc or __doc__ or "").split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="smaller phases, under 2 minutes")
    parser.add_argument(
        "--smoke",
        action="store_true",
        help="every phase once at its smallest, to check that the bench still runs (the test "
        "suite's); its figures mean nothing and are written only with --out",
    )
    parser.add_argument(
        "--profile",
        action="store_true",
        help="py-spy record the daemon during each load phase into bench/profiles/ "
        "(perturbs the figures a little)",
    )
    parser.add_argument(
        "--gil",
        action="store_true",
        help="with --profile: sample only the thread holding the GIL (py-spy --gil)",
    )
    parser.add_argument(
        "--only",
        default=",".join(PHASES),
        help=f"comma-separated subset of {','.join(PHASES)} (default: all), or "
        f"{','.join(OPTIONAL_PHASES)} (only when named)",
    )
    retention = parser.add_argument_group("the retention phase (--only retention)")
    retention.add_argument(
        "--minutes", type=float, default=5, help="the steady state's length (0: skip it)"
    )
    retention.add_argument(
        "--rate", type=int, default=2000, help="events/s offered in the steady state"
    )
    retention.add_argument(
        "--horizon-minutes", type=float, default=1, help="retention_days, in minutes"
    )
    retention.add_argument(
        "--interval",
        type=float,
        default=10,
        help="retention_interval_seconds (where the efd under test has the setting)",
    )
    retention.add_argument(
        "--prefill",
        type=int,
        default=10_000_000,
        help="finished messages in the long history (0: skip that part)",
    )
    brokers = parser.add_argument_group("the brokers phase (--only brokers)")
    brokers.add_argument(
        "--brokers",
        default=",".join(KINDS),
        help=f"comma-separated subset of {','.join(KINDS)} (default: all)",
    )
    brokers.add_argument(
        "--brokers-out",
        default=str(HERE / "brokers.json"),
        help="where the brokers phase's figures go",
    )
    parser.add_argument(
        "--pg-server",
        choices=("own", "shared"),
        help="with --store postgresql: own = a cluster the bench makes with initdb (the "
        "distribution's defaults, autovacuum on), shared = $EFD_BENCH_PG or the machine's "
        "server (default: own for the retention phase, shared for the others)",
    )
    retention.add_argument(
        "--retention-out",
        default=str(HERE / "retention.json"),
        help="where the retention phase's figures go",
    )
    parser.add_argument(
        "--rev",
        help="benchmark this git revision (git archive into the temp dir, put first on "
        "PYTHONPATH) instead of the working tree",
    )
    parser.add_argument(
        "--src",
        help="benchmark the efd source tree in this directory (put first on PYTHONPATH), "
        "e.g. a patched copy for an experiment",
    )
    parser.add_argument(
        "--store",
        choices=("sqlite", "postgresql"),
        default="sqlite",
        help="postgresql: PostgreSQL's write limit, then ingest and deliver with N daemons on "
        "one database of the local server ($EFD_BENCH_PG or scripts/ensure-postgres); "
        "writes the `postgresql` section of the results file and keeps the rest",
    )
    parser.add_argument("--daemons", type=int, default=1, help="with --store postgresql")
    parser.add_argument(
        "--scale", action="store_true", help="--store postgresql with 1, 2 and 3 daemons"
    )
    parser.add_argument(
        "--pairs",
        type=int,
        help=f"bare POST / efd delivery pairs in the deliver phase (default "
        f"{QUICK.deliver_pairs} with --quick, else {FULL.deliver_pairs}): more narrows the "
        "median where the machine's speed swings",
    )
    parser.add_argument("--out", help="results file (default bench/results.json)")
    parser.add_argument("--keep", action="store_true", help="keep the temp dir (logs, dbs)")
    parser.add_argument(
        "--signing",
        choices=sorted(SIGNING),
        default="x-signature",
        help="how the destination signs: none, x-signature (default), or both "
        "(X-Signature and Standard Webhooks with two secrets)",
    )
    parser.add_argument(
        "--readme",
        action="store_true",
        help="run nothing: rewrite the performance tables of README.md and bench/README.md "
        "from the results file",
    )
    args = parser.parse_args(argv)
    write = args.out is not None or not args.smoke
    args.out = args.out or str(HERE / "results.json")
    if args.readme:
        blocks = readme.tables(json.loads(Path(args.out).read_text()))
        for path in (ROOT / "README.md", HERE / "README.md"):
            done = readme.update(path, blocks)
            shown = path.relative_to(ROOT)
            print(f"{shown}: rewrote {', '.join(done) or 'nothing (no bench markers)'}")
        return 0
    only = {p.strip() for p in args.only.split(",") if p.strip()}
    unknown = only - set(PHASES) - set(OPTIONAL_PHASES)
    if unknown:
        parser.error(f"unknown phases: {', '.join(sorted(unknown))}")
    if "backlog" in only:
        only.add("ingest")  # the ratio needs the empty-store rate
    if args.scale:
        args.store = "postgresql"
    counts = [1, 2, 3] if args.scale else [args.daemons]
    if args.store == "postgresql" and min(counts) < 1:
        parser.error("--daemons must be at least 1")

    plan = SMOKE if args.smoke else QUICK if args.quick else FULL
    if args.pairs is not None:
        if not 1 <= args.pairs <= 50:
            parser.error("--pairs must be between 1 and 50")
        plan = dataclasses.replace(plan, deliver_pairs=args.pairs)
    Daemon.signing = args.signing
    started = time.monotonic()
    root = Path(tempfile.mkdtemp(prefix="efd-bench-"))
    efd_source = "working tree"
    if args.rev and args.src:
        parser.error("--rev and --src exclude each other")
    if args.rev:
        efd_source = snapshot(args.rev, root / "efd-src")
    elif args.src:
        efd_source = use_source(Path(args.src).resolve())
    ctx = mp.get_context("spawn")
    received = ctx.RawValue("q", 0)
    receiver = Worker(ctx, receiver_main, received, 4096)
    generator = Worker(ctx, generator_main, received)
    bench = Bench(
        plan=plan,
        quick=args.quick or args.smoke,
        only=only,
        root=root,
        profiler=Profiler(args.profile, HERE / "profiles", gil=args.gil),
        receiver=receiver,
        generator=generator,
        received=received,
    )
    kind = "smoke" if args.smoke else "quick" if args.quick else "full"
    print(f"efd bench ({kind}) in {root}")
    failure = None
    pg_section: dict[str, Any] | None = None
    server: PgServer | None = None
    own: OwnCluster | None = None
    try:
        if "retention" in only:
            run_retention(args, bench, plan)
        if "brokers" in only:
            run_brokers_phase(args, bench, ctx, write=write, source=efd_source)
        if only <= {"retention", "brokers"}:
            pass
        elif args.store == "postgresql":
            if args.pg_server == "own":
                own = OwnCluster(free_port())
                server = PgServer(own.url)
            else:
                server = PgServer(admin_url(str(ROOT)))
            pg_section = run_postgresql(bench, server, counts)
        elif "limits" in only:
            bench.limits()
        if args.store == "sqlite" and "ingest" in only:
            bench.ingest_and_backlog()
        if args.store == "sqlite" and only & {"deliver", "actions", "latency"}:
            bench.deliver_and_latency()
        if args.store == "sqlite" and "recovery" in only:
            bench.recovery()
    except Exception as error:  # any failure: report it with what was measured
        traceback.print_exc()
        failure = f"{type(error).__name__}: {error}"
        print(f"\nbench stopped: {failure}", file=sys.stderr)
    finally:
        if bench.daemon is not None:
            with contextlib.suppress(Exception):
                bench.stop_daemon()
        if server is not None:
            with contextlib.suppress(Exception):
                server.drop_all()
        if own is not None:
            own.stop()
        receiver.stop(("stop",))
        generator.stop(None)
        kept = args.keep or failure is not None or bench.keep
        if not kept:
            shutil.rmtree(root, ignore_errors=True)

    if only <= {"retention", "brokers"}:  # their own files; results.json as it was
        for note in bench.notes:
            print(f"note: {note}")
        print(f"in {time.monotonic() - started:.1f} s")
        return 1 if failure else 0
    results = bench.results
    if (
        results.get("deliver_ratio") is None
        and results.get("deliver_events_per_s")
        and results.get("bare_post_per_s")
    ):
        results["deliver_ratio"] = round(
            results["deliver_events_per_s"] / results["bare_post_per_s"], 3
        )
    context = {
        "quick": args.quick or args.smoke,
        "smoke": args.smoke,
        "date": time.strftime("%Y-%m-%d", time.gmtime()),
        "phases_run": sorted(only),
        "store": args.store,
        "signing": args.signing,
        "daemons": counts if args.store == "postgresql" else [1],
        "profile": bool(args.profile),
        "cores": os.cpu_count(),
        "cpu_model": _cpu_model(),
        "loadavg_at_end": os.getloadavg(),
        "python": platform.python_version(),
        # Which build: an optimised interpreter (a distribution's) and a plain source
        # build (pyenv's default) differ in CPU per event (bench/README.md).
        "python_prefix": os.path.realpath(sys.base_prefix),
        "platform": platform.platform(),
        "sqlite": sqlite3.sqlite_version,
        "efd_commit": _git_commit(),
        "efd_source": efd_source,
        "plan": plan.__dict__,
        "extra": {k: v for k, v in results.items() if k not in KEYS},
        "phases": bench.phases,
        "notes": bench.notes,
        "failure": failure,
        "total_seconds": round(time.monotonic() - started, 1),
        "temp_dir_kept": str(root) if kept else None,
    }
    # One results file holds both stores: each run replaces its own part and keeps the other.
    out = Path(args.out)
    previous: dict[str, Any] = {}
    with contextlib.suppress(OSError, ValueError):
        previous = json.loads(out.read_text())
    if args.store == "postgresql":
        pg_section = pg_section or {}
        report = {k: v for k, v in previous.items() if k != "postgresql"}
        report["postgresql"] = {**pg_section, "context": context}
    else:
        report = {key: results.get(key) for key in KEYS}
        report["context"] = context
        if "postgresql" in previous:
            report["postgresql"] = previous["postgresql"]
    if write:
        out.write_text(json.dumps(report, indent=2) + "\n")
    print()
    if pg_section is not None:
        print(pg_table(pg_section, counts))
    else:
        print(table(results))
    for note in bench.notes:
        print(f"note: {note}")
    extra = context["extra"]
    if extra:
        print("context: " + ", ".join(f"{k}={fmt(v)}" for k, v in extra.items()))
    print(f"{f'wrote {args.out}' if write else 'done'} in {context['total_seconds']} s")
    return 1 if failure else 0


def run_retention(args: argparse.Namespace, bench: Bench, plan: Plan) -> None:
    """The retention phase, on SQLite or on PostgreSQL (by default a cluster of the bench's
    own, with the distribution's defaults); its figures go to --retention-out."""
    own: OwnCluster | None = None
    server: PgServer | None = None
    try:
        if args.store == "postgresql":
            if args.pg_server == "shared":
                server = PgServer(admin_url(str(ROOT)))
            else:
                own = OwnCluster(free_port())
                server = PgServer(own.url)
        figures = Retention(
            bench,
            RetentionPlan(
                minutes=args.minutes,
                rate=args.rate,
                horizon_minutes=args.horizon_minutes,
                interval=args.interval,
                prefill=args.prefill,
                small_share=0.05,
                purge_cap_seconds=60,
                pairs=3 if args.quick else 4,
                slice_seconds=plan.ingest_seconds / 2,
                drain_cap_seconds=60,
            ),
            server,
        ).run()
        figures["store"] = args.store
        figures["server"] = server.settings() if server is not None else None
        figures["context"] = {
            "date": time.strftime("%Y-%m-%d", time.gmtime()),
            "efd_commit": _git_commit(),
            "loadavg_at_end": os.getloadavg(),
            "notes": bench.notes,
        }
        Path(args.retention_out).write_text(json.dumps(figures, indent=2) + "\n")
        print()
        print(retention_table(figures))
        print(f"wrote {args.retention_out}")
    finally:
        if server is not None:
            with contextlib.suppress(Exception):
                server.drop_all()
        if own is not None:
            own.stop()


def run_brokers_phase(
    args: argparse.Namespace, bench: Bench, ctx: Any, *, write: bool, source: str
) -> None:
    """The brokers phase against the machine's servers; its figures go to --brokers-out."""
    kinds = tuple(k.strip() for k in args.brokers.split(",") if k.strip())
    unknown = set(kinds) - set(KINDS)
    if unknown:
        raise SystemExit(f"unknown brokers: {', '.join(sorted(unknown))}")
    plan = BROKERS_SMOKE if args.smoke else BROKERS_QUICK if args.quick else BROKERS_FULL
    figures = run_brokers(bench, ctx, plan, kinds)
    figures["context"] = {
        "date": time.strftime("%Y-%m-%d", time.gmtime()),
        "efd_commit": _git_commit(),
        "efd_source": source,
        "cores": os.cpu_count(),
        "cpu_model": _cpu_model(),
        "python": platform.python_version(),
        "loadavg_at_end": os.getloadavg(),
        "notes": bench.notes,
    }
    if write:
        Path(args.brokers_out).write_text(json.dumps(figures, indent=2) + "\n")
    print()
    for kind in kinds:
        f = figures[kind]
        print(
            f"  {kind:14} efd {fmt(f['efd_per_s'])}/s {fmt(f['efd_cpu_us_per_event'])} us/event"
            f"  raw {fmt(f['raw_per_s'])}/s {fmt(f['raw_cpu_us_per_event'])} us/event"
            f"  ratio {fmt(f['ratio'])} {f['ratio_spread']}"
        )
    print(f"wrote {args.brokers_out}" if write else "done")


def snapshot(rev: str, dest: Path) -> str:
    """Extract `rev` of the repository into dest (read-only for the repository) and make
    the daemons and this process import efd from there."""
    commit = subprocess.run(
        ["git", "-C", str(ROOT), "rev-parse", "--verify", f"{rev}^{{commit}}"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.strip()
    archive = subprocess.run(
        ["git", "-C", str(ROOT), "archive", "--format=tar", commit],
        capture_output=True,
        check=True,
    ).stdout
    dest.mkdir(parents=True)
    with tarfile.open(fileobj=io.BytesIO(archive)) as tar:
        tar.extractall(dest, filter="data")
    use_source(dest)
    return f"git {rev} = {commit}"


def use_source(path: Path) -> str:
    if not (path / "efd" / "__init__.py").is_file():
        raise SystemExit(f"{path} holds no efd package")
    old = os.environ.get("PYTHONPATH")
    os.environ["PYTHONPATH"] = str(path) + (os.pathsep + old if old else "")
    sys.path.insert(0, str(path))
    return f"source tree {path}"


def _cpu_model() -> str | None:
    with contextlib.suppress(OSError), open("/proc/cpuinfo") as handle:
        for line in handle:
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    return None


def _git_commit() -> str | None:
    """The checkout's commit, "-dirty" when the code a run executes differs from it: the
    results file a run writes (a PostgreSQL run after a SQLite one runs the same code) and
    the Markdown documents do not count."""
    with contextlib.suppress(OSError, subprocess.SubprocessError):

        def git(*args: str) -> str:
            done = subprocess.run(
                ["git", "-C", str(ROOT), *args], capture_output=True, text=True, timeout=5
            )
            return done.stdout.strip()

        commit = git("describe", "--always")
        if not commit:
            return None
        changed = git(
            "status", "--porcelain", "--", ".", ":(exclude)bench/results.json", ":(exclude)*.md"
        )
        return f"{commit}-dirty" if changed else commit
    return None


if __name__ == "__main__":
    sys.exit(main())
