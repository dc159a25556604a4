"""efd/processes/collector.py: the garbage collector's settings a process runs with. Each case runs
in a child interpreter, so the test process keeps its own."""

from __future__ import annotations

import json
import subprocess
import sys

from efd.processes import collector


def _in_child(code: str) -> dict[str, int | list[int]]:
    done = subprocess.run(
        [sys.executable, "-c", f"import gc, json\nfrom efd.processes import collector\n{code}"],
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    result: dict[str, int | list[int]] = json.loads(done.stdout)
    return result


def test_tune_makes_young_collections_a_hundred_times_rarer() -> None:
    before = _in_child("print(json.dumps({'t': gc.get_threshold()}))")
    after = _in_child("collector.tune()\nprint(json.dumps({'t': gc.get_threshold()}))")
    assert after["t"] == list(collector.THRESHOLDS)
    assert isinstance(before["t"], list)
    assert isinstance(after["t"], list)
    # 700 is Python 3.11's and 3.12's default (3.13's is 2000): rarer than any of them.
    assert after["t"][0] == 100 * 700
    assert after["t"][0] > 30 * before["t"][0]


def test_freeze_keeps_what_start_up_built_out_of_later_collections() -> None:
    frozen = _in_child(
        "import efd.config\nbefore = gc.get_freeze_count()\ncollector.freeze()\n"
        "print(json.dumps({'before': before, 'after': gc.get_freeze_count(), "
        "'young': gc.get_count()[0]}))"
    )
    assert frozen["before"] == 0
    assert isinstance(frozen["after"], int)
    assert frozen["after"] > 10_000
    assert isinstance(frozen["young"], int)
    assert frozen["young"] < 100  # nothing left for the next collection to walk
