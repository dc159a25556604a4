"""The CPU limit a process's control groups set (systemd's CPUQuota=, a container's CPU
limit), read from the texts of /proc/self/cgroup and /proc/self/mountinfo and the limit files
they lead to. Pure: the files are read through the caller's `read`."""

from __future__ import annotations

import math
import re
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import PurePosixPath

# A file's text, or None where it is missing or unreadable.
Read = Callable[[str], str | None]

_ESCAPE = re.compile(r"\\([0-7]{3})")


@dataclass(frozen=True)
class Mount:
    root: str  # the cgroup directory mounted here (not "/" inside some containers)
    point: str
    fstype: str
    options: frozenset[str]  # the super options: for cgroup v1, its controllers


def mounts(mountinfo: str) -> list[Mount]:
    """The cgroup and cgroup2 mounts of a /proc/<pid>/mountinfo text."""
    found = []
    for line in mountinfo.splitlines():
        fields = line.split(" ")
        if "-" not in fields[6:]:
            continue
        dash = fields.index("-", 6)
        if len(fields) < dash + 4:
            continue
        fstype = fields[dash + 1]
        if fstype not in ("cgroup", "cgroup2"):
            continue
        found.append(
            Mount(
                root=_unescape(fields[3]),
                point=_unescape(fields[4]),
                fstype=fstype,
                options=frozenset(fields[dash + 3].split(",")),
            )
        )
    return found


def memberships(cgroup: str) -> dict[str, str]:
    """A /proc/<pid>/cgroup text as controller -> path; the cgroup v2 path under ''."""
    found: dict[str, str] = {}
    for line in cgroup.splitlines():
        parts = line.split(":", 2)
        if len(parts) != 3:
            continue
        _, controllers, path = parts
        for controller in controllers.split(",") if controllers else [""]:
            found[controller] = path
    return found


def limit_dirs(path: str, mount: Mount) -> list[str]:
    """The directories of `path`'s cgroup under `mount`, itself first, then each parent up
    to the mount: a parent's limit bounds its children too."""
    root, cgroup = PurePosixPath(mount.root), PurePosixPath(path)
    if cgroup != root and root not in cgroup.parents:
        # Mounted elsewhere than the process's cgroup (a namespace shows "/"): the mount
        # itself is the nearest directory that can be read.
        return [mount.point]
    inner = cgroup.relative_to(root)
    dirs = []
    while True:
        dirs.append(str(PurePosixPath(mount.point) / inner))
        if inner == PurePosixPath("."):
            return dirs
        inner = inner.parent


def cpus_v2(cpu_max: str | None) -> float | None:
    """CPUs a cgroup v2 `cpu.max` ("$MAX $PERIOD", MAX "max" for none) allows."""
    if cpu_max is None:
        return None
    parts = cpu_max.split()
    if len(parts) != 2 or parts[0] == "max":
        return None
    return _ratio(parts[0], parts[1])


def cpus_v1(quota: str | None, period: str | None) -> float | None:
    """CPUs cgroup v1's `cpu.cfs_quota_us` (-1 for none) over `cpu.cfs_period_us` allow."""
    if quota is None or period is None:
        return None
    return _ratio(quota.strip(), period.strip())


def cpu_limit(cgroup: str, mountinfo: str, read: Read) -> float | None:
    """The tightest CPU limit on the process whose cgroup and mountinfo texts these are,
    over cgroup v2 and v1 (both may be mounted), or None where none is set."""
    paths = memberships(cgroup)
    limits: list[float] = []
    for mount in mounts(mountinfo):
        if mount.fstype == "cgroup2":
            path, limit_in = paths.get(""), _limit_v2
        elif "cpu" in mount.options:
            path, limit_in = paths.get("cpu"), _limit_v1
        else:
            continue
        if path is None:
            continue
        for directory in limit_dirs(path, mount):
            cpus = limit_in(directory, read)
            if cpus is not None:
                limits.append(cpus)
    return min(limits, default=None)


def _limit_v2(directory: str, read: Read) -> float | None:
    return cpus_v2(read(f"{directory}/cpu.max"))


def _limit_v1(directory: str, read: Read) -> float | None:
    return cpus_v1(read(f"{directory}/cpu.cfs_quota_us"), read(f"{directory}/cpu.cfs_period_us"))


def usable(affinity: int, limit: float | None) -> int:
    """Whole CPUs a process may keep busy: its affinity, narrowed by a CPU limit (a limit of
    1.5 CPUs keeps one busy and half of another: it counts as one), at least one."""
    if limit is None:
        return max(1, affinity)
    return max(1, min(affinity, math.floor(limit + 1e-9)))


def _ratio(quota: str, period: str) -> float | None:
    try:
        q, p = int(quota), int(period)
    except ValueError:
        return None
    if q <= 0 or p <= 0:
        return None  # -1: no quota
    return q / p


def _unescape(field: str) -> str:
    # mountinfo writes a space, tab, newline or backslash in a path as \ and three octal digits.
    return _ESCAPE.sub(lambda m: chr(int(m.group(1), 8)), field)
