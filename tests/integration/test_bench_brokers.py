"""`bench/run.py --smoke --only brokers` runs the brokers phase at its smallest against the
brokers on this machine (scripts/ensure-brokers): efd delivers each slice to every broker
and the raw client publishes to it, so that a renamed metric, configuration key or client
call fails here rather than at the next benchmark. bench/README.md#brokers."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parents[2] / "bench"
KINDS = ("amqp", "nats", "redis_streams", "mqtt")


@pytest.mark.slow
def test_the_brokers_phase_runs(tmp_path: Path) -> None:
    out = tmp_path / "brokers.json"
    env = {**os.environ, "EFD_SERVER__PARSE_PROCESSES": "0"}
    done = subprocess.run(
        [
            sys.executable,
            str(BENCH / "run.py"),
            "--smoke",
            "--only",
            "brokers",
            "--out",
            str(tmp_path / "results.json"),
            "--brokers-out",
            str(out),
        ],
        capture_output=True,
        text=True,
        timeout=150,
        env=env,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    figures = json.loads(out.read_text())
    assert not (tmp_path / "results.json").exists()  # the phase keeps to its own file
    for kind in KINDS:
        got = figures[kind]
        assert got["efd_per_s"] > 0, (kind, done.stdout)
        assert got["raw_per_s"] > 0, (kind, done.stdout)
        assert got["efd_cpu_us_per_event"] > 0, (kind, done.stdout)
        [pair] = got["pairs"]
        assert pair["raw_errors"] == {}, (kind, pair)
        # No warning or error in the daemon's log: a broker's client that logs once per
        # publish would show here.
        assert got["daemon_log_lines"] == {}, (kind, got)
    assert figures["context"]["efd_commit"]
