"""systemd's notification protocol (sd_notify): READY=1, STATUS=…, STOPPING=1, WATCHDOG=1.

A datagram of newline-separated KEY=VALUE lines to the Unix socket in $NOTIFY_SOCKET ("@"
means the abstract namespace). Without $NOTIFY_SOCKET (not run by systemd with
Type=notify) every call does nothing. The watchdog pings come from the event loop itself,
so a wedged loop stops them and systemd restarts efd (WatchdogSec=).
"""

from __future__ import annotations

import logging
import math
import os
import socket
from collections.abc import Mapping

log = logging.getLogger(__name__)


class Notifier:
    def __init__(self, environ: Mapping[str, str] = os.environ) -> None:
        path = environ.get("NOTIFY_SOCKET", "")
        self._address = "\0" + path[1:] if path.startswith("@") else path
        self._socket: socket.socket | None = None
        if self._address:
            self._socket = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        # WATCHDOG_USEC is meant for the process named by WATCHDOG_PID, when that is given.
        usec = environ.get("WATCHDOG_USEC", "")
        pid = environ.get("WATCHDOG_PID", "")
        for_us = not pid or pid == str(os.getpid())
        self.watchdog_interval = int(usec) / 1e6 / 2 if usec.isdigit() and for_us else None

    @property
    def enabled(self) -> bool:
        return self._socket is not None

    def notify(self, **fields: str) -> None:
        """Send KEY=VALUE lines (keys upper-cased); never raises."""
        if self._socket is None:
            return
        message = "\n".join(f"{key.upper()}={value}" for key, value in fields.items())
        try:
            self._socket.sendto(message.encode(), self._address)
        except OSError as error:
            log.warning("cannot notify systemd at %s: %s", self._address, error)

    async def ping_watchdog(self) -> float:
        """WATCHDOG=1 now; the seconds until the next ping is due (half WatchdogSec)."""
        if self.watchdog_interval is None:
            return math.inf
        self.notify(watchdog="1")
        return self.watchdog_interval

    def close(self) -> None:
        if self._socket is not None:
            self._socket.close()
            self._socket = None
