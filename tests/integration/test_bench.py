"""bench/ imports efd's internals and drives its daemons: every module of it imports, and
`bench/run.py --smoke` runs its cheapest phases (the limits, delivery and latency: one
daemon) at their smallest, so that a renamed internal, metric or configuration key fails
here rather than at the next benchmark."""

from __future__ import annotations

import importlib
import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

BENCH = Path(__file__).resolve().parents[2] / "bench"

MODULES = sorted(p.stem for p in (BENCH / "efdbench").glob("*.py") if p.stem != "__init__")
SCRIPTS = sorted(
    str(p.relative_to(BENCH)) for p in [*BENCH.glob("*.py"), *BENCH.glob("experiments/*.py")]
)


def test_the_lists_are_not_empty() -> None:
    assert "cli" in MODULES
    assert "scenarios" in MODULES
    assert "run.py" in SCRIPTS
    assert "experiments/senders.py" in SCRIPTS


@pytest.mark.parametrize("name", MODULES)
def test_every_efdbench_module_imports(name: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.syspath_prepend(str(BENCH))
    importlib.import_module(f"efdbench.{name}")


@pytest.mark.parametrize("script", SCRIPTS)
def test_every_script_imports(script: str, monkeypatch: pytest.MonkeyPatch) -> None:
    path = BENCH / script
    monkeypatch.syspath_prepend(str(BENCH))
    monkeypatch.syspath_prepend(str(path.parent))  # as when run: its own directory first
    name = "bench_" + script.removesuffix(".py").replace("/", "_")
    spec = importlib.util.spec_from_file_location(name, path)
    assert spec is not None
    assert spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    monkeypatch.setitem(sys.modules, name, module)
    spec.loader.exec_module(module)  # the scripts run only under __main__
    assert callable(getattr(module, "main", None)), f"{script} has no main()"


@pytest.mark.slow
def test_the_bench_runs(tmp_path: Path) -> None:
    out = tmp_path / "results.json"
    # One process a daemon: the smoke run checks the bench's code, and each daemon's sender
    # and parser processes would only add start-up time.
    env = {
        **os.environ,
        "EFD_DELIVERY__SENDER_PROCESSES": "0",
        "EFD_SERVER__PARSE_PROCESSES": "0",
    }
    done = subprocess.run(
        [
            sys.executable,
            str(BENCH / "run.py"),
            "--smoke",
            "--only",
            "limits,deliver,actions,latency",
            "--out",
            str(out),
        ],
        capture_output=True,
        text=True,
        timeout=110,
        env=env,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    results = json.loads(out.read_text())
    context = results["context"]
    assert context["failure"] is None, done.stdout
    assert context["smoke"] is True
    assert not [note for note in context["notes"] if "in its log" in note], context["notes"]
    for key in (
        "sqlite_raw_rows_per_s",
        "bare_post_per_s",
        "deliver_events_per_s",
        "deliver_cpu_us_per_event",
        "latency_p99_ms",
        "actions_cpu_ratio_to_classic",
    ):
        assert results[key] is not None, (key, done.stdout)
    extra = context["extra"]
    assert extra["sqlalchemy_core_events_per_s"] is not None, done.stdout
    assert extra["deliver_lost"] == 0, done.stdout
    assert results["actions_lost"] == 0, done.stdout
    # Read from the daemon's /metrics: None where the counters' names changed.
    assert extra["deliver_handed_over_share"] is not None, done.stdout


def readme_module() -> Any:
    sys.path.insert(0, str(BENCH))
    try:
        return importlib.import_module("efdbench.readme")
    finally:
        sys.path.remove(str(BENCH))


def test_readme_writes_the_short_table_and_the_whole_one() -> None:
    readme = readme_module()
    blocks = readme.tables(json.loads((BENCH / "results.json").read_text()))
    assert set(blocks) == {"sqlite", "postgresql", "postgresql-summary"}
    header = [line for line in blocks["postgresql"].splitlines() if line.startswith("| daemons")]
    assert header[0].count("|") - 1 == 11
    summary = blocks["postgresql-summary"].splitlines()
    assert summary[2].count("|") - 1 == 4
    assert [row.split(" | ")[0] for row in summary[4:]] == ["| 1", "| 2", "| 3"]


def test_readme_rewrites_only_the_blocks_it_has(tmp_path: Path) -> None:
    readme = readme_module()
    page = tmp_path / "README.md"
    page.write_text(
        "intro\n<!-- bench:sqlite -->\nold\n<!-- /bench:sqlite -->\nmiddle\n"
        "<!-- bench:other -->\nkept\n<!-- /bench:other -->\nend\n"
    )
    assert readme.update(page, {"sqlite": "new\n", "postgresql": "x\n"}) == ["sqlite"]
    assert page.read_text() == (
        "intro\n<!-- bench:sqlite -->\nnew\n<!-- /bench:sqlite -->\nmiddle\n"
        "<!-- bench:other -->\nkept\n<!-- /bench:other -->\nend\n"
    )


def test_the_readme_is_a_newcomers_page() -> None:
    # The whole PostgreSQL table lives in bench/README.md; the README keeps a short one.
    front = (BENCH.parent / "README.md").read_text()
    assert "<!-- bench:sqlite -->" in front
    assert "<!-- bench:postgresql-summary -->" in front
    assert "<!-- bench:postgresql -->" not in front
    assert "<!-- bench:postgresql -->" in (BENCH / "README.md").read_text()
    assert len(front.splitlines()) < 300
