"""A real tinyproxy (Debian's package) on 127.0.0.1 for the proxy tests: each started on a free
port with its own configuration file and log, with or without Basic authentication, and
allowed to CONNECT to the given ports only.

Without tinyproxy installed the tests skip, unless EFD_REQUIRE_PROXY is set (scripts/test
sets it once scripts/ensure-proxy has installed it)."""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol

USER, PASSWORD = "efd-user", "proxy-SECRET-pw"


@dataclass
class Tinyproxy:
    port: int
    directory: Path
    auth: bool
    process: subprocess.Popen[bytes] | None = field(default=None, repr=False)

    @property
    def log(self) -> Path:
        return self.directory / "tinyproxy.log"

    def url(self, user: str = USER, password: str = PASSWORD) -> str:
        """The proxy URL, with the credentials when the proxy asks for them."""
        if not self.auth:
            return f"http://127.0.0.1:{self.port}"
        return f"http://{user}:{password}@127.0.0.1:{self.port}"

    def requests(self) -> list[str]:
        """The request lines the proxy logged ("CONNECT localhost:4433 HTTP/1.1")."""
        if not self.log.exists():
            return []
        lines = self.log.read_text(errors="replace").splitlines()
        return [line.split("): ", 1)[1] for line in lines if ": Request (file descriptor" in line]

    def start(self, connect_ports: Sequence[int]) -> Tinyproxy:
        config = self.directory / "tinyproxy.conf"
        lines = [
            f"Port {self.port}",
            "Listen 127.0.0.1",
            "Timeout 30",
            f'LogFile "{self.log}"',
            "LogLevel Info",
            "MaxClients 50",
            "Allow 127.0.0.1",
            # Without ConnectPort lines tinyproxy would tunnel to any port.
            *[f"ConnectPort {port}" for port in connect_ports],
        ]
        if self.auth:
            lines.append(f"BasicAuth {USER} {PASSWORD}")
        config.write_text("\n".join(lines) + "\n")
        binary = shutil.which("tinyproxy") or "/usr/bin/tinyproxy"
        with (self.directory / "stderr.txt").open("wb") as stderr:  # the child keeps its own
            self.process = subprocess.Popen(
                [binary, "-d", "-c", str(config)], stdout=subprocess.DEVNULL, stderr=stderr
            )
        deadline = time.monotonic() + 10
        while True:
            try:
                with socket.create_connection(("127.0.0.1", self.port), timeout=0.2):
                    return self
            except OSError:
                if self.process.poll() is not None or time.monotonic() > deadline:
                    said = (self.directory / "stderr.txt").read_text(errors="replace")
                    raise AssertionError(f"tinyproxy did not start: {said}") from None
                time.sleep(0.05)

    def stop(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(5)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()


class ProxyFactory(Protocol):
    """The tinyproxy_factory fixture: a started tinyproxy, stopped after the test."""

    def __call__(self, connect_ports: Sequence[int], *, auth: bool = ...) -> Tinyproxy: ...


def installed() -> bool:
    found = shutil.which("tinyproxy") is not None or os.access("/usr/bin/tinyproxy", os.X_OK)
    if not found and os.environ.get("EFD_REQUIRE_PROXY"):
        raise AssertionError("EFD_REQUIRE_PROXY is set but tinyproxy is not installed")
    return found
