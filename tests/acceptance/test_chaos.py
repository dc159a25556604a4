"""A short chaos soak (bench/chaos.py): real daemons killed, stopped and reloaded, receivers
failing, PostgreSQL stopped, and still nothing acknowledged is lost, every duplicate was in
flight at a kill -9, and no user's messages to the ordered destination went backwards."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[2]


def _initdb() -> bool:
    return any(Path("/usr/lib/postgresql").glob("*/bin/initdb")) or bool(shutil.which("initdb"))


def soak(store: str, seed: int, seconds: float) -> dict[str, Any]:
    cmd = [
        sys.executable,
        str(ROOT / "bench" / "chaos.py"),
        "--store",
        store,
        "--minutes",
        str(seconds / 60),
        "--seed",
        str(seed),
        "--gap",
        "2",
        "4",
        "--drain-seconds",
        "60",
    ]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        out, _ = proc.communicate(timeout=150)
    except subprocess.TimeoutExpired:
        proc.send_signal(signal.SIGINT)  # the script stops everything it started
        out, _ = proc.communicate(timeout=60)
        pytest.fail(f"the soak did not finish:\n{out}")
    result: dict[str, Any] = json.loads(out.strip().splitlines()[-1])
    assert proc.returncode == 0, out
    return result


def check(result: dict[str, Any], out_kinds: set[str]) -> None:
    assert result["acknowledged"] > 200, result
    assert result["lost"] == 0, result
    assert result["duplicates_explained"] == result["duplicates"], result
    assert result["delivered"] + result["expired"] == result["deliveries_expected"], result
    # The ordered destination: each user's messages never arrived out of order.
    assert result["ordered_requests_read"] > 200, result
    assert result["ordered_backwards"] == 0, result
    # The seed puts these faults first, so the short run does go through them.
    assert out_kinds <= set(result["faults"]), result


# The seeds are chosen so that the first faults drawn include a kill -9 (and, on PostgreSQL,
# a stop of the database) within the short run.


@pytest.mark.timeout(240)
def test_chaos_sqlite() -> None:
    check(soak("sqlite", seed=1, seconds=12), {"kill9"})


@pytest.mark.timeout(240)
@pytest.mark.skipif(not _initdb(), reason="PostgreSQL's initdb is not installed")
@pytest.mark.skipif(
    "postgresql" not in os.environ.get("EFD_TEST_DB", "sqlite,postgresql"),
    reason="EFD_TEST_DB leaves PostgreSQL out",
)
def test_chaos_postgresql() -> None:
    check(soak("postgresql", seed=36, seconds=12), {"kill9", "pg_stop"})
