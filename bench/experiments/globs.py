"""How long match() holds the event loop at its step budget: the worst patterns a message can
choose against a 32 KiB string, each run at the budget, and the compilation of the longest
pattern a message may hold (efd/languages/filters/glob.py, docs/filters.md#the-work-of-a-message).

    .venv/bin/python bench/experiments/globs.py

Prints, for each case, the steps counted and the best of 20 runs in milliseconds.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from functools import partial

from efd.languages.filters.glob import MAX_PATTERN, compile_glob

TEXT = "a" * 32_000
BMP = "".join(chr(0x100 + 3 * i) for i in range(MAX_PATTERN - 10))
WIDE = "".join(chr(0x10000 + 3 * i) for i in range(MAX_PATTERN - 10))
CASES = {
    "?a middle segment": ("*" + "?a" * ((MAX_PATTERN - 3) // 2) + "b*", TEXT),
    "? middle segment": ("*" + "?" * (MAX_PATTERN - 3) + "b*", TEXT),
    "class of BMP characters": (
        "*[" + "".join(chr(0x100 + 3 * i) for i in range(990)) + "]b*",
        TEXT,
    ),
    "class beyond U+FFFF": ("*[" + WIDE + "]b*", WIDE[-1] * 32_000),
    "the issue's configured pattern": ("*a*a*a*a*a*a*a*a*a*b", "a" * 40),
    "literal middle segment": ("*" + "a" * (MAX_PATTERN - 3) + "b*", TEXT),
}
RUNS = 20


def best(run: Callable[[], object]) -> float:
    times = []
    for _ in range(RUNS):
        start = time.perf_counter()
        run()
        times.append(time.perf_counter() - start)
    return min(times) * 1000


def main() -> None:
    for name, (pattern, text) in CASES.items():
        glob = compile_glob(pattern)
        matched, steps = glob.run(text)
        ms = best(partial(glob.run, text))
        print(f"{name:32} {matched!s:5} {steps:>9,} steps {ms:6.2f} ms")
    for name, (pattern, _) in CASES.items():
        ms = best(partial(compile_glob, pattern))
        print(f"compiling: {name:32} {len(pattern):>5} chars {ms:6.2f} ms")


if __name__ == "__main__":
    main()
