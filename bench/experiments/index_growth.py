"""How SQLite's insert rate falls as an on-disk message_key index grows, and what does not help.

    .venv/bin/python bench/experiments/index_growth.py [seconds]

The measurement behind migration 0005, which moved SQLite's deduplication index into the
writer's memory. Raw inserts of efd's two rows per event (efd's schema and the writer settings
of that time: WAL, synchronous=FULL, checkpoint every 10,000 pages, 32 MiB cache, the on-disk
message_key index), 400 events a commit, with a
rate printed every 3 seconds beside the number of messages stored. Then the same with
synchronous=NORMAL, with a 1 GiB mmap, and without the message_key index.
"""

from __future__ import annotations

import sys
import tempfile
import time
from pathlib import Path

from dedupe_index import insert_events, open_tables  # the script's own directory

PER_COMMIT = 400
EFD_WRITER_PRAGMAS = ("PRAGMA wal_autocheckpoint=10000", "PRAGMA cache_size=-32768")
VARIANTS: dict[str, tuple[str, ...]] = {
    "efd": (),
    "synchronous=NORMAL": ("PRAGMA synchronous=NORMAL",),
    "mmap 1 GiB": ("PRAGMA mmap_size=1073741824",),
    "no message_key index": ("DROP INDEX ix_messages_message_key",),
}


def run(name: str, extra: tuple[str, ...], path: Path, seconds: float) -> None:
    db = open_tables(path)
    for pragma in (*EFD_WRITER_PRAGMAS, *extra):
        db.execute(pragma)
    print(name)
    stored = 0
    started = mark = time.perf_counter()
    at_mark = 0
    while time.perf_counter() - started < seconds:
        insert_events(db, stored + 1, PER_COMMIT)
        stored += PER_COMMIT
        if time.perf_counter() - mark >= 3:
            rate = (stored - at_mark) / (time.perf_counter() - mark)
            print(f"  {stored:>10,} stored  {rate:9,.0f} events/s", flush=True)
            mark, at_mark = time.perf_counter(), stored
    db.close()


def main() -> None:
    seconds = float(sys.argv[1]) if len(sys.argv) > 1 else 21.0
    with tempfile.TemporaryDirectory() as directory:
        for i, (name, extra) in enumerate(VARIANTS.items()):
            run(name, extra, Path(directory) / f"{i}.db", seconds)


if __name__ == "__main__":
    main()
