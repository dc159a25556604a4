#!/usr/bin/env python
"""Summarise a py-spy raw (collapsed-stack) profile written by `bench/run.py --profile`.

    .venv/bin/python bench/profile_top.py bench/profiles/ingest_batch.txt [--thread NAME]
        [--top 25] [--grep TEXT]

Prints the share of samples per thread, then the top functions by inclusive share (the
function is on the stack) and by self share (the function is the innermost frame). Shares
are of all samples in the selection; at --rate 100 one sample is 10 ms of one thread.
Lines look like 'process PID:"CMD";[process PID:"CMD";]thread (tid): NAME;frame;... COUNT'
(py-spy --subprocesses: the daemon, then a sender's or parser's process, whose threads are
shown as "child PID NAME"); frames are "func (file:line)".
Collapsed files also load into https://www.speedscope.app or flamegraph.pl.
"""

from __future__ import annotations

import argparse
import re
import signal
import sys
from collections import Counter

_LINE = re.compile(r":\d+\)$")
_PROCESS = re.compile(r'process (\d+):"[^"]*";')


def _function(frame: str) -> str:
    """'func (path/file.py:123)' -> 'func (path/file.py)' so lines of one function merge."""
    return _LINE.sub(")", frame)


def load(path: str) -> list[tuple[str, list[str], int]]:
    stacks = []
    with open(path) as handle:
        for line in handle:
            line = line.rstrip("\n")
            if not line:
                continue
            body, _, count = line.rpartition(" ")
            # With --subprocesses each stack starts with its process chain (the daemon, then
            # a sender's or parser's process); a command line may hold a ";".
            processes = _PROCESS.findall(body)
            body = _PROCESS.sub("", body)
            frames = body.split(";")
            thread = frames[0]
            if thread.startswith("thread (") and ": " in thread:
                thread = thread.split(": ", 1)[1]
                frames = frames[1:]
            if len(processes) > 1:  # a child's threads are named by it
                thread = f"child {processes[-1]} {thread}"
            thread = re.sub(r"_\d+$", "", thread)  # efd-db-reader_0 and _1 together
            stacks.append((thread, frames, int(count)))
    return stacks


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("file")
    parser.add_argument("--thread", help="only threads whose name contains this")
    parser.add_argument("--top", type=int, default=25)
    parser.add_argument("--grep", help="only stacks with a frame containing this")
    args = parser.parse_args(argv)
    signal.signal(signal.SIGPIPE, signal.SIG_DFL)  # `| head` ends quietly

    stacks = load(args.file)
    total_all = sum(c for _, _, c in stacks) or 1
    threads: Counter[str] = Counter()
    for thread, _, count in stacks:
        threads[thread] += count
    print(f"{args.file}: {total_all} samples")
    for thread, count in threads.most_common():
        print(f"  {100 * count / total_all:5.1f}%  {thread}")

    selected = [
        (t, f, c)
        for t, f, c in stacks
        if (not args.thread or args.thread in t)
        and (not args.grep or any(args.grep in frame for frame in f))
    ]
    total = sum(c for _, _, c in selected) or 1
    inclusive: Counter[str] = Counter()
    self_: Counter[str] = Counter()
    for _, frames, count in selected:
        names = [_function(frame) for frame in frames]
        for name in set(names):
            inclusive[name] += count
        if names:
            self_[names[-1]] += count
    scope = f"thread~{args.thread!r}" if args.thread else "all threads"
    if args.grep:
        scope += f", stacks with {args.grep!r}"
    print(f"\nselection: {scope}: {total} samples ({100 * total / total_all:.1f}% of all)")
    print("\ninclusive (on the stack):")
    for name, count in inclusive.most_common(args.top):
        print(f"  {100 * count / total:5.1f}%  {name}")
    print("\nself (innermost frame):")
    for name, count in self_.most_common(args.top):
        print(f"  {100 * count / total:5.1f}%  {name}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
