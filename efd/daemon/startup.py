"""What efd checks and adjusts before it starts serving."""

from __future__ import annotations

import contextlib
import logging
import os
import resource

from efd.config import Settings
from efd.store.engine import normalise_url, sqlite_path

log = logging.getLogger("efd.daemon")

# Open files besides those the settings account for: standard streams, the listening
# socket, the event loop's own, log files, the SQLite lock, DNS lookups, imports.
_BASE_FILES = 64


class StartupError(Exception):
    """efd cannot start; the message says why and what to do."""


def usable_cpus() -> int:
    """The CPUs this process may run on: its affinity (taskset, systemd's CPUAffinity=, a
    container's cpuset), else the machine's count. A CPU quota (CPUQuota=, a container's CPU
    limit) does not narrow it."""
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):  # not on Linux
        return os.cpu_count() or 1


def reserved_files(settings: Settings) -> int:
    """Open files efd keeps for other things than its HTTP connections: the database's,
    outbound requests when the daemon sends them itself, pipes to child processes, and a
    margin for the rest. Counted from the configuration at start."""
    storage, delivery = settings.storage, settings.delivery
    if sqlite_path(normalise_url(storage.url)) is not None:
        database = 3 * 3  # a writer and two readers, each with the file, its WAL, its index
    else:
        database = 2 * storage.pool_size + 2  # the pool and its overflow, LISTEN, a spare
    parsers, senders = settings.helpers(usable_cpus())
    children = 4 * (senders + parsers)
    outbound = 0
    if not senders:  # the daemon sends itself: its sockets are ours
        urls = {hook.url for d in settings.destinations for hook in d.hooks}
        widest = max((len(d.hooks) for d in settings.destinations), default=0)
        outbound = min(delivery.max_in_flight * widest, len(urls) * delivery.max_per_hook)
    return _BASE_FILES + database + children + outbound


def fit_open_files(settings: Settings) -> int:
    """The connections efd may hold at once: max_connections, after raising the open-file
    limit (RLIMIT_NOFILE) towards its hard limit if it cannot hold them with what else efd
    keeps open; fewer, said in one line, when even the hard limit cannot. Otherwise a
    connection beyond the limit would fail to be accepted: the client would hang, unanswered
    and unlogged, instead of getting the 503 of a full server."""
    wanted = settings.server.max_connections
    reserve = reserved_files(settings)
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
