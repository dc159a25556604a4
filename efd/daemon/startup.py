"""What efd checks and adjusts before it starts serving."""

from __future__ import annotations

import contextlib
import logging
import os
import resource
from dataclasses import dataclass

from efd.config import Settings
from efd.daemon import cgroups
from efd.store.engine import normalise_url, sqlite_path

log = logging.getLogger("efd.daemon")

# Open files besides those the settings account for: standard streams, the listening
# socket, the event loop's own, log files, the SQLite lock, DNS lookups, imports.
_BASE_FILES = 64


class StartupError(Exception):
    """efd cannot start; the message says why and what to do."""


@dataclass(frozen=True)
class Cpus:
    """What bounds the CPUs this process may keep busy."""

    affinity: int  # CPUs it may run on (taskset, systemd's CPUAffinity=, a cpuset)
    limit: float | None  # CPU time its cgroups allow (CPUQuota=, a container's CPU limit)

    @property
    def usable(self) -> int:
        return cgroups.usable(self.affinity, self.limit)

    def __str__(self) -> str:
        if self.limit is None or self.usable == self.affinity:
            return f"{self.usable} CPU(s)"
        return (
            f"{self.usable} CPU(s): its CPU quota allows {self.limit:.2f} "
            f"of the {self.affinity} it may run on"
        )


def usable_cpus() -> Cpus:
    """This process's affinity, else the machine's count, and its cgroups' CPU quota."""
    try:
        affinity = len(os.sched_getaffinity(0))
    except (AttributeError, OSError):  # not on Linux
        affinity = os.cpu_count() or 1
    cgroup, mountinfo = _read("/proc/self/cgroup"), _read("/proc/self/mountinfo")
    if cgroup is None or mountinfo is None:
        return Cpus(affinity, None)
    return Cpus(affinity, cgroups.cpu_limit(cgroup, mountinfo, _read))


def _read(path: str) -> str | None:
    try:
        with open(path, encoding="utf-8") as file:
            return file.read()
    except (OSError, UnicodeDecodeError):
        return None


def reserved_files(settings: Settings, cpus: int) -> int:
    """Open files efd keeps for other things than its HTTP connections: the database's,
    outbound requests when the daemon sends them itself, pipes to child processes, and a
    margin for the rest. Counted from the configuration at start, and `cpus` (what the
    helper processes' default follows: Settings.helpers)."""
    storage, delivery = settings.storage, settings.delivery
    if sqlite_path(normalise_url(storage.url)) is not None:
        database = 3 * 3  # a writer and two readers, each with the file, its WAL, its index
    else:
        database = 2 * storage.pool_size + 2  # the pool and its overflow, LISTEN, a spare
    parsers, senders = settings.helpers(cpus)
    children = 4 * (senders + parsers)
    outbound = 0
    if not senders:  # the daemon sends itself: its sockets are ours
        routes = [hooks for d in settings.destinations for _, hooks in d.route_hooks()]
        urls = {hook.url for hooks in routes for hook in hooks}
        widest = max((len(hooks) for hooks in routes), default=0)
        outbound = min(delivery.max_in_flight * widest, len(urls) * delivery.max_per_hook)
    return _BASE_FILES + database + children + outbound


def fit_open_files(settings: Settings, cpus: int) -> int:
    """The connections efd may hold at once: max_connections, after raising the open-file
    limit (RLIMIT_NOFILE) towards its hard limit if it cannot hold them with what else efd
    keeps open; fewer, said in one line, when even the hard limit cannot. Otherwise a
    connection beyond the limit would fail to be accepted: the client would hang, unanswered
    and unlogged, instead of getting the 503 of a full server."""
    wanted = settings.server.max_connections
    reserve = reserved_files(settings, cpus)
    needed = wanted + reserve
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft == resource.RLIM_INFINITY or soft >= needed:
        return wanted
    target = needed if hard == resource.RLIM_INFINITY or hard >= needed else hard
    raised = soft
    if target > soft:
        with contextlib.suppress(ValueError, OSError):
            resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
            raised = target
    if raised >= needed:
        log.info(
            "raised the open-file limit from %d to %d: %d connections (max_connections) and "
            "%d other open files",
            soft,
            raised,
            wanted,
            reserve,
        )
        return wanted
    room = raised - reserve
    if room < 1:
        raise StartupError(
            f"the open-file limit ({raised}, hard limit {hard}) leaves no room for connections: "
            f"efd keeps {reserve} open files for the database, outbound requests and child "
            f"processes; raise LimitNOFILE= (ulimit -n) to at least {needed}"
        )
    log.warning(
        "max_connections lowered from %d to %d: the open-file limit is %d (hard limit %d) and "
        "efd keeps %d open files for the database, outbound requests and child processes; "
        "raise LimitNOFILE= (ulimit -n) to at least %d to serve %d",
        wanted,
        room,
        raised,
        hard,
        reserve,
        needed,
        wanted,
    )
    return room
