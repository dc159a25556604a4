"""The systemd install of docs/operations.md, followed literally under a real systemd.

A Debian bookworm root (scripts/acceptance-root, made once and cached) boots in
systemd-nspawn with systemd as PID 1, on an overlay so that the cached root stays clean. Each
command of the docs' walk-through runs inside it (nsenter), from a copy of the source tree's
systemd/ and config.example.toml, with two stand-ins: efd is installed from wheels built here
(the container has no package index) in place of `/path/to/efd`, and where the docs say
`$EDITOR /etc/efd/efd.toml` the test rewrites the file in place, as an editor would. The
container shares this host's network: receivers here get the webhooks, and the test sends
to efd's port. The container and everything in it end with the test, whatever happens.

Skipped without root or the tools (scripts/test installs them and sets EFD_REQUIRE_SYSTEMD=1,
which turns the skip into a failure).
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import platform
import re
import shutil
import signal
import subprocess
import sys
import threading
import time
import urllib.request
from base64 import b64encode
from collections.abc import Callable, Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import IO, Any

import pytest
from packaging.markers import Marker, default_environment

from efd.segment import webhooks
from tests.conftest import ROOT, free_port

pytestmark = [pytest.mark.slow, pytest.mark.timeout(900)]

TOOLS = ("systemd-nspawn", "debootstrap", "nsenter", "unshare", "setpriv")
SOURCE = "/root/efd-source"  # the docs' relative paths (systemd/…) are from here
WHEELS = "/root/efd-wheels"
CONFIG = "/etc/efd/efd.toml"
EXAMPLE_WRITE_KEY = "wk_example"  # config.example.toml's
EXAMPLE_SECRET = "example-secret"


def _unavailable() -> str | None:
    if not sys.platform.startswith("linux"):
        return "needs Linux"
    if os.geteuid() != 0:
        return "needs root (debootstrap, mounts, systemd-nspawn)"
    missing = [tool for tool in TOOLS if shutil.which(tool) is None]
    if missing:
        return f"{', '.join(missing)} missing (apt-get install debootstrap systemd-container)"
    return None


# -- what the docs say --------------------------------------------------------------------


def walkthrough() -> dict[str, list[str]]:
    """The commands of docs/operations.md's systemd walk-through, grouped under the comment
    line that heads each group ("install (once) …", "change the configuration", …)."""
    text = (ROOT / "docs" / "operations.md").read_text()
    block = text.split("\nStep by step", 1)[1].split("```sh\n", 1)[1].split("```", 1)[0]
    groups: dict[str, list[str]] = {}
    commands: list[str] = []
    for line in block.splitlines():
        if line.startswith("# "):
            commands = groups.setdefault(line[2:].strip(), [])
            continue
        command = re.sub(r"\s+#.*$", "", line).strip()  # a trailing comment
        if command:
            commands.append(command)
    return groups


def group(groups: dict[str, list[str]], heading: str) -> list[str]:
    [found] = [commands for name, commands in groups.items() if name.startswith(heading)]
    return found


# -- a receiver on this host ----------------------------------------------------------------


class Receiver:
    """Webhooks arriving on 127.0.0.1, answered 200, in a thread of their own."""

    def __init__(self) -> None:
        self.received: list[tuple[dict[str, str], bytes]] = []
        received = self.received

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers.get("Content-Length", "0")))
                received.append((dict(self.headers.items()), body))
                self.send_response(200)
                self.send_header("Content-Length", "0")
                self.end_headers()

            def log_message(self, *_args: Any) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", free_port()), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_port}/webhook"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    def message_ids(self) -> list[str]:
        return [json.loads(body)["messageId"] for _headers, body in self.received]

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


def wait_for(check: Callable[[], Any], what: str, timeout: float = 60) -> Any:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = check()
        if value:
            return value
        time.sleep(0.2)
    raise AssertionError(f"{what}: not within {timeout} s")


# -- the container ------------------------------------------------------------------------


class Container:
    """A booted systemd-nspawn container on an overlay of `lower`."""

    def __init__(self, lower: Path, workdir: Path) -> None:
        self.lower = lower
        self.workdir = workdir
        self.console = workdir / "console.log"
        self.proc: subprocess.Popen[bytes] | None = None
        self.init_pid = 0
        self.lock: IO[bytes] | None = None

    def boot(self, timeout: float = 120) -> None:
        # One container at a time on a machine: systemd-nspawn --keep-unit puts every
        # container started from one cgroup into the same payload cgroup, where their units
        # would collide. The kernel drops the lock if this process dies.
        self.lock = (self.lower.parent / ".nspawn.lock").open("wb")
        fcntl.flock(self.lock, fcntl.LOCK_EX)
        upper, work, merged = (self.workdir / name for name in ("upper", "work", "root"))
        for path in (upper, work, merged):
            path.mkdir()
        # A mount namespace of its own holds the overlay and the tmpfs nspawn wants on
        # /run/systemd/nspawn: both vanish with it. setpriv's parent-death signal ends the
        # container (SIGTERM: a clean shutdown) if this test process dies.
        script = (
            'set -e; mount -t overlay overlay -o "lowerdir=$1,upperdir=$2,workdir=$3" "$4"; '
            "mkdir -p /run/systemd/nspawn; mount -t tmpfs tmpfs /run/systemd/nspawn; "
            'exec systemd-nspawn -D "$4" --register=no --keep-unit -b --console=passive'
        )
        with self.console.open("wb") as console:
            self.proc = subprocess.Popen(
                [
                    *("setpriv", "--pdeathsig", "SIGTERM", "--"),
                    *("unshare", "--mount", "--propagation", "private", "--"),
                    *("sh", "-c", script, "sh", str(self.lower), str(upper), str(work)),
                    str(merged),
                ],
                stdin=subprocess.DEVNULL,
                stdout=console,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        self.init_pid = wait_for(self._init, "the container's systemd started", timeout=30)
        # Up when systemd says so; its bus answers a moment after PID 1 exists.
        state = wait_for(self._booted, "the container booted", timeout=timeout)
        assert state in ("running", "degraded"), f"{state}\n{self.run('systemctl --failed')}"

    def _init(self) -> int | None:
        assert self.proc is not None
        if self.proc.poll() is not None:
            raise AssertionError(f"systemd-nspawn exited:\n{self.console.read_text()}")
        pid = self.proc.pid
        try:
            children = Path(f"/proc/{pid}/task/{pid}/children").read_text().split()
            for child in children:
                status = Path(f"/proc/{child}/status").read_text()
                if re.search(r"^NSpid:.*\s1$", status, re.MULTILINE):
                    return int(child)
        except FileNotFoundError:
            pass
        return None

    def _booted(self) -> str | None:
        done = self.run("systemctl is-system-running --wait", check=False, timeout=60)
        state = done.stdout.strip()
        return state if state in ("running", "degraded", "maintenance") else None

    def path(self, inside: str) -> Path:
        """A path inside the container, as this host reaches it."""
        return Path(f"/proc/{self.init_pid}/root") / inside.lstrip("/")

    def run(
        self, command: str, *, check: bool = True, timeout: float = 120, stdin: bytes = b""
    ) -> subprocess.CompletedProcess[str]:
        """`command` by bash inside, as root, from SOURCE, in a clean environment."""
        env = [
            "PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
            "HOME=/root",
            "LANG=C.UTF-8",
            "SYSTEMD_COLORS=0",
        ]
        done = subprocess.run(
            [
                *("nsenter", "-t", str(self.init_pid), "-a", "env", "-i", *env),
                *("bash", "-c", f"cd {SOURCE} 2>/dev/null; {command}"),
            ],
            input=stdin.decode(),
            capture_output=True,
            text=True,
            timeout=timeout,
            cwd="/",
            check=False,
        )
        if check and done.returncode != 0:
            raise AssertionError(
                f"`{command}` exited {done.returncode}:\n{done.stdout}{done.stderr}\n"
                f"-- journal of efd:\n{self.journal()}"
            )
        return done

    def journal(self) -> str:
        if not self.init_pid:
            return ""
        try:
            done = subprocess.run(
                [
                    *("nsenter", "-t", str(self.init_pid), "-a"),
                    *("journalctl", "-u", "efd", "--no-pager", "-n", "60", "-o", "cat"),
                ],
                capture_output=True,
                text=True,
                timeout=30,
                check=False,
            )
        except subprocess.TimeoutExpired:
            return "(journalctl did not answer)"
        return done.stdout + done.stderr

    def destroy(self) -> None:
        """Shut the container down; kill it if it does not go within 30 s. Killing its PID 1
        from here ends every process in it; the mounts go with the namespace."""
        try:
            self._end()
        finally:
            if self.lock is not None:
                self.lock.close()

    def _end(self) -> None:
        if self.proc is None or self.proc.poll() is not None:
            return
        self.proc.send_signal(signal.SIGTERM)  # nspawn: a clean shutdown of the container
        try:
            self.proc.wait(30)
            return
        except subprocess.TimeoutExpired:
            pass
        for pid in (self.init_pid, self.proc.pid):
            if pid:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
        self.proc.wait(30)


def _package_version(root: Path, package: str) -> str:
    """The upstream version ("3.11.2") of a package installed in the root, from dpkg's status."""
    status = (root / "var" / "lib" / "dpkg" / "status").read_text()
    for entry in status.split("\n\n"):
        if f"Package: {package}\n" in entry + "\n":
            found = re.search(r"^Version: (?:\d+:)?([0-9.]+)", entry, re.M)
            if found:
                return found.group(1)
    raise AssertionError(f"{package} is not installed in {root}")


@pytest.fixture(scope="module")
def debian_root() -> Path:
    why = _unavailable()
    if why is not None:
        if os.environ.get("EFD_REQUIRE_SYSTEMD") == "1":
            pytest.fail(f"the systemd acceptance test {why}, and EFD_REQUIRE_SYSTEMD=1")
        pytest.skip(f"the systemd acceptance test {why}")
    made = subprocess.run(
        [str(ROOT / "scripts" / "acceptance-root")],
        capture_output=True,
        text=True,
        timeout=900,
        check=False,
    )
    if made.returncode != 0:
        pytest.fail(f"scripts/acceptance-root failed:\n{made.stderr}")
    return Path(made.stdout.strip().splitlines()[-1])


@pytest.fixture(scope="module")
def wheels(debian_root: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """efd's wheel and its dependencies' for the root's Python (which may not be ours)."""
    out = tmp_path_factory.mktemp("wheels")
    [python] = [
        p.name for p in (debian_root / "usr" / "bin").glob("python3.*") if p.name[8:].isdigit()
    ]
    machine = platform.machine()
    version = _package_version(debian_root, f"{python}-minimal")
    pip = [sys.executable, "-m", "pip", "--disable-pip-version-check", "-q"]
    subprocess.run(
        [*pip, "wheel", "--no-deps", "-w", str(out), str(ROOT)],
        check=True,
        timeout=300,
        capture_output=True,
    )
    [wheel] = out.glob("efd-*.whl")
    platforms = [
        f"{tag}_{machine}"
        for tag in (
            "manylinux_2_36",
            "manylinux_2_28",
            "manylinux_2_17",
            "manylinux2014",
            "manylinux_2_5",
            "manylinux1",
            "linux",
        )
    ]
    subprocess.run(
        [
            *pip,
            *("download", "-d", str(out), "--only-binary=:all:"),
            # The full version: markers such as python_full_version < "3.11.3" decide
            # which dependencies the root's Python needs.
            *("--python-version", version),
            *(arg for tag in platforms for arg in ("--platform", tag)),
            str(wheel),
        ],
        check=True,
        timeout=300,
        capture_output=True,
    )
    # pip judges a dependency's markers by this interpreter, not the root's: the lock's
    # packages whose markers hold only for the root's Python are fetched by name.
    only_there = _locked_for(version)
    if only_there:
        subprocess.run(
            [
                *pip,
                *("download", "-d", str(out), "--only-binary=:all:", "--no-deps"),
                *("--python-version", version),
                *(arg for tag in platforms for arg in ("--platform", tag)),
                *only_there,
            ],
            check=True,
            timeout=300,
            capture_output=True,
        )
    return out


def _locked_for(version: str) -> list[str]:
    """The pins of requirements/base.txt whose markers hold for a Linux CPython `version`
    and not for this interpreter."""
    target: dict[str, str] = {
        **{key: str(value) for key, value in default_environment().items()},
        "python_full_version": version,
        "python_version": ".".join(version.split(".")[:2]),
    }
    pins = []
    for line in (ROOT / "requirements" / "base.txt").read_text().splitlines():
        found = re.match(r"([A-Za-z0-9._-]+==[^\s;]+) ; ([^\\]+)", line)
        marker = Marker(found.group(2).strip()) if found else None
        if found and marker and marker.evaluate(target) and not marker.evaluate():
            pins.append(found.group(1))
    return pins


@pytest.fixture
def container(debian_root: Path, wheels: Path, tmp_path: Path) -> Iterator[Container]:
    box = Container(debian_root, tmp_path)
    try:
        box.boot()
        source = box.path(SOURCE)
        source.mkdir(parents=True)
        shutil.copytree(ROOT / "systemd", source / "systemd")
        shutil.copy(ROOT / "config.example.toml", source / "config.example.toml")
        shutil.copytree(wheels, box.path(WHEELS))
        yield box
    finally:
        box.destroy()


@pytest.fixture
def receivers() -> Iterator[tuple[Receiver, Receiver]]:
    first, second = Receiver(), Receiver()
    yield first, second
    first.close()
    second.close()


# -- the walk-through -----------------------------------------------------------------------


def edited(text: str, *, port: int, hook: str) -> str:
    """The example configuration as an operator edits it for this host: the database in the
    unit's state directory, a port and a hook of the test's."""
    text, n = re.subn(r'(?m)^url = "sqlite:[^"]*"', 'url = "sqlite:////var/lib/efd/efd.db"', text)
    assert n == 1
    text, n = re.subn(r"(?m)^port = \d+", f"port = {port}", text)
    assert n == 1
    text, n = re.subn(r'(?m)^url = "http://[^"]*"', f'url = "{hook}"', text)
    assert n == 1
    return text


def send(port: int, message_id: str) -> int:
    request = urllib.request.Request(
        f"http://127.0.0.1:{port}/v1/track",
        data=json.dumps({"userId": "u1", "event": "Installed", "messageId": message_id}).encode(),
        headers={
            "Content-Type": "application/json",
            "Authorization": "Basic " + b64encode(f"{EXAMPLE_WRITE_KEY}:".encode()).decode(),
        },
        method="POST",
    )
    with urllib.request.urlopen(request, timeout=10) as answer:
        return int(answer.status)


def follow(box: Container, commands: list[str], editor: Callable[[str], None]) -> list[str]:
    """Run the docs' commands in order; `$EDITOR FILE` is `editor(FILE)`. Their outputs."""
    outputs = []
    for command in commands:
        if match := re.fullmatch(r"\$EDITOR (\S+)", command):
            editor(match[1])
            outputs.append("")
            continue
        command = command.replace("/path/to/efd", f"--no-index --find-links {WHEELS} efd")
        done = box.run(command, timeout=300)
        outputs.append(done.stdout)
    return outputs


@pytest.fixture
def steps() -> dict[str, list[str]]:
    """Read before the container boots: a walk-through the test cannot follow fails at once."""
    found = walkthrough()
    for heading in ("install", "change the configuration", "stop"):
        assert group(found, heading), heading
    return found


def test_the_documented_install_runs_reloads_and_stops(
    steps: dict[str, list[str]], container: Container, receivers: tuple[Receiver, Receiver]
) -> None:
    box, (first, second) = container, receivers
    port = free_port()
    example = (ROOT / "config.example.toml").read_text()

    def write(path: str, text: str) -> None:
        # In place, as an editor saves: the file keeps its owner and mode.
        box.run(f"cat > {path}", stdin=text.encode())

    # Install, as the docs say, and start.
    install = group(steps, "install")
    assert any("/path/to/efd" in command for command in install)
    configured = edited(example, port=port, hook=first.url)
    outputs = follow(box, install, lambda path: write(path, configured))
    assert "active (running)" in outputs[-1]

    # The secrets stay with root and the service: the file is root's and its group's, the
    # service runs as that group's user, and no other user can read it.
    assert box.run(f"stat -c '%U %G %a' {CONFIG}").stdout.split() == ["root", "efd", "640"]
    main_pid = box.run("systemctl show -p MainPID --value efd").stdout.strip()
    assert box.run(f"ps -o user= -p {main_pid}").stdout.strip() == "efd"
    assert box.run(f"runuser -u nobody -- cat {CONFIG}", check=False).returncode != 0

    # A message sent here goes through efd in the container to a receiver here, signed.
    assert send(port, "installed-1") == 200
    wait_for(lambda: first.message_ids() == ["installed-1"], "delivery to the first hook")
    headers, body = first.received[0]
    assert webhooks.verify(EXAMPLE_SECRET, body, headers["X-Signature"])

    # Change the configuration (the hook moves to the second receiver) and reload.
    change = group(steps, "change the configuration")
    assert any(re.fullmatch(r"systemctl reload efd", c) for c in change)
    moved = edited(example, port=port, hook=second.url)
    follow(box, change, lambda path: write(path, moved))
    # The reload is applied once the daemon has re-read the file: the journal says so.
    wait_for(
        lambda: f"reloaded {CONFIG}" in box.journal(), "the journal's 'reloaded' line", timeout=30
    )
    assert send(port, "after-reload") == 200
    wait_for(lambda: second.message_ids() == ["after-reload"], "delivery to the moved hook")
    assert first.message_ids() == ["installed-1"]

    # An invalid file is refused by the reload itself; the service keeps running as it was.
    write(CONFIG, moved.replace('name = "website"', 'name = "personas"'))
    refused = box.run("systemctl reload efd", check=False)
    assert refused.returncode == 1
    assert "sources[0].name" in box.journal()
    # So is a file the service cannot read (an editor saved it as root's alone): one line.
    write(CONFIG, moved)
    box.run(f"chgrp root {CONFIG}")
    assert box.run("systemctl reload efd", check=False).returncode == 1
    assert f"efd: {CONFIG}: permission denied (efd runs as user efd)" in box.journal()
    box.run(f"chgrp efd {CONFIG}")
    assert box.run("systemctl is-active efd").stdout.strip() == "active"
    assert send(port, "after-refusal") == 200
    wait_for(
        lambda: second.message_ids() == ["after-reload", "after-refusal"],
        "delivery after a refused reload",
    )

    # Stop: a clean exit.
    follow(box, group(steps, "stop"), lambda path: None)
    assert box.run("systemctl is-active efd", check=False).stdout.strip() == "inactive"
    assert box.run("systemctl show -p Result --value efd").stdout.strip() == "success"
    assert "Traceback" not in box.journal()
