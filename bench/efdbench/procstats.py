"""CPU and memory of processes and of the machine, from /proc."""

from __future__ import annotations

import contextlib
import os

CLK_TCK = os.sysconf("SC_CLK_TCK")


def process_tree(pid: int) -> list[int]:
    """`pid` and its descendants (efd's sender processes are children of the daemon)."""
    tree = [pid]
    for parent in tree:
        with contextlib.suppress(OSError):
            for task in os.listdir(f"/proc/{parent}/task"):
                with open(f"/proc/{parent}/task/{task}/children") as handle:
                    tree.extend(int(child) for child in handle.read().split())
    return tree


def own_cpu_seconds(pid: int) -> float:
    try:
        with open(f"/proc/{pid}/stat") as handle:
            fields = handle.read().rsplit(")", 1)[1].split()
    except OSError:
        return float("nan")
    return (int(fields[11]) + int(fields[12])) / CLK_TCK


def cpu_seconds(pid: int) -> float:
    """utime + stime of a process (all its threads) and its child processes, in seconds."""
    return sum(own_cpu_seconds(p) for p in process_tree(pid))


def machine_cpu_seconds() -> dict[str, float]:
    """CPU seconds of the whole machine (all cores) from /proc/stat: time in processes
    (user, nice, system), in interrupts (irq, softirq: loopback networking lands partly
    here), and stolen by the hypervisor (steal: other virtual machines on the host)."""
    with open("/proc/stat") as handle:
        f = [int(x) for x in handle.readline().split()[1:]]
    return {
        "processes": (f[0] + f[1] + f[2]) / CLK_TCK,
        "irq": (f[5] + f[6]) / CLK_TCK,
        "steal": f[7] / CLK_TCK,
    }


def memory_mb(pid: int) -> dict[str, float]:
    """VmRSS and VmHWM of a process and its child processes, summed, in MB."""
    out: dict[str, float] = {}
    for p in process_tree(pid):
        with contextlib.suppress(OSError), open(f"/proc/{p}/status") as handle:
            for line in handle:
                key, _, value = line.partition(":")
                if key in ("VmRSS", "VmHWM"):
                    out[key] = round(out.get(key, 0.0) + int(value.split()[0]) / 1024, 1)
    return out
