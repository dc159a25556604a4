"""Why the daemon's writer thread and event loop take turns: the GIL convoy, in isolation.

    .venv/bin/python bench/experiments/gil_convoy.py

A thread inserting into SQLite (many rows per statement; the GIL is released while SQLite
works) runs alone, then beside a thread parsing and re-encoding JSON as the event loop does.
Each time the writer wants the GIL back it waits for the busy thread's switch interval.
"""

from __future__ import annotations

import json
import sqlite3
import sys
import tempfile
import threading
import time
import uuid
from pathlib import Path

SECONDS = 4.0
ROWS = 256
DOCUMENT = json.dumps(
    {"batch": [{"type": "track", "userId": f"u{i}", "event": "E", "n": i} for i in range(100)]}
)


def measure(path: Path, *, writer: bool, parser: bool) -> tuple[float, float]:
    db = sqlite3.connect(path, isolation_level=None, check_same_thread=False)
    db.execute("PRAGMA journal_mode=WAL")
    db.execute("PRAGMA synchronous=NORMAL")
    db.execute("CREATE TABLE IF NOT EXISTS m (id INTEGER PRIMARY KEY, mid TEXT, body TEXT)")
    db.execute("CREATE INDEX IF NOT EXISTS ix_m_mid ON m (mid)")
    statement = "INSERT INTO m (mid, body) VALUES " + ", ".join(["(?, ?)"] * ROWS)
    stop = time.perf_counter() + SECONDS
    counts = {"rows": 0, "parses": 0}

    def write() -> None:
        while time.perf_counter() < stop:
            params: list[str] = []
            for _ in range(ROWS):
                params += [str(uuid.uuid4()), "x" * 200]
            db.execute("BEGIN IMMEDIATE")
            db.execute(statement, params)
            db.execute("COMMIT")
            counts["rows"] += ROWS

    thread = threading.Thread(target=write) if writer else None
    if thread:
        thread.start()
    while parser and time.perf_counter() < stop:
        json.dumps(json.loads(DOCUMENT))
        counts["parses"] += 1
    if thread:
        thread.join()
    db.close()
    return counts["rows"] / SECONDS, counts["parses"] / SECONDS


def main() -> None:
    with tempfile.TemporaryDirectory() as directory:
        path = Path(directory) / "convoy.db"
        rows, _ = measure(path, writer=True, parser=False)
        print(f"writer alone:                        {rows:9,.0f} rows/s")
        _, parses = measure(path, writer=False, parser=True)
        print(f"parser alone:                        {parses:9,.0f} documents/s")
        for interval in (0.005, 0.001):
            sys.setswitchinterval(interval)
            rows, parses = measure(path, writer=True, parser=True)
            print(
                f"both, switch interval {interval * 1000:g} ms:"
                f"{rows:12,.0f} rows/s, {parses:7,.0f} documents/s"
            )


if __name__ == "__main__":
    main()
