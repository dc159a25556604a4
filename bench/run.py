#!/usr/bin/env python
"""efd benchmark: throughput, latency and scale, each beside this machine's own limit.

    .venv/bin/python bench/run.py [--quick] [--profile] [--only PHASES] [--out FILE]

Starts, all on 127.0.0.1 and each in its own process:
  * a webhook receiver (raw asyncio HTTP/1.1 on uvloop; answers 200 or 503, counts unique
    messageIds and duplicates, timestamps each receipt),
  * a load generator (a minimal keep-alive HTTP/1.1 client on uvloop, so that the load
    generator costs the daemon as little CPU as possible; the bare-POST limit uses aiohttp),
  * `python -m efd serve --config <generated toml>` on a fresh SQLite database in a temp
    directory, once per scenario (ingest+backlog, delivery+latency, recovery).

Prints a table and writes bench/results.json. See bench/README.md for what each figure
means and how it is measured, and bench/efdbench/ for the code. It is a benchmark, not a
test: nothing asserts a time.
"""

import sys
from pathlib import Path

# The package sits beside this script; spawned workers inherit this path.
sys.path.insert(0, str(Path(__file__).resolve().parent))

from efdbench.cli import main

if __name__ == "__main__":
    sys.exit(main(doc=__doc__))
