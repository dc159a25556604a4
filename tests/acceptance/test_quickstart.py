"""The README's quickstart as a newcomer follows it: `scripts/serve`, the curl example, the
signed webhook in `efd listen`'s output, the attempt in `efd-data/efd.db`, the console.

scripts/serve runs from a copy of the files it uses (its `.venv` the checkout's own), so the
database lands in the copy's `efd-data/` as the README says, and the checkout's own quickstart
database is left alone. Only the ports differ from a newcomer's run: the daemon's through
`EFD_SERVER__PORT`, `efd listen`'s (9000 in scripts/serve and config.example.toml) rewritten
in the copy, so that runs beside each other do not collide."""

from __future__ import annotations

import base64
import os
import re
import shutil
import signal
import sqlite3
import subprocess
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.conftest import ROOT, eventually, free_port

pytestmark = pytest.mark.slow  # a setup check and a daemon's start each

# The README's example, as curl sends it.
WRITE_KEY = "wk_example"
BODY = b'{"userId":"user-1","event":"Order Completed","properties":{"revenue":39.95}}'


@dataclass
class Quickstart:
    root: Path  # where scripts/serve runs: the copy
    base: str  # the daemon's address
    log: Path  # scripts/serve's stderr (its banner, the daemon's and efd listen's logs)
    listened: Path  # efd listen's output: the webhooks it received


def _up_to_date_venv() -> bool:
    """What scripts/setup (without extras) checks before it installs anything: an install
    stamp no older than pyproject.toml and the base lock file. Without one, scripts/serve
    would install into the checkout's .venv from the copy."""
    newest = max(
        (ROOT / "pyproject.toml").stat().st_mtime,
        (ROOT / "requirements" / "base.txt").stat().st_mtime,
    )
    return any(s.stat().st_mtime >= newest for s in (ROOT / ".venv").glob(".installed-*"))


def _replace_once(path: Path, old: str, new: str) -> None:
    text = path.read_text()
    assert text.count(old) == 1, f"{path.name} no longer holds {old!r} once"
    path.write_text(text.replace(old, new))


@contextmanager
def quickstart(tmp_path: Path) -> Iterator[Quickstart]:
    if not _up_to_date_venv():
        pytest.skip("no up-to-date .venv at the root: scripts/serve would install one first")
    root = tmp_path / "efd"
    root.mkdir()
    shutil.copytree(ROOT / "scripts", root / "scripts")  # mtimes kept: setup compares them
    shutil.copytree(ROOT / "requirements", root / "requirements")
    for name in ("pyproject.toml", "config.example.toml"):
        shutil.copy2(ROOT / name, root / name)
    (root / ".venv").symlink_to(ROOT / ".venv")
    listen_port = free_port()
    _replace_once(root / "scripts" / "serve", "--port 9000", f"--port {listen_port}")
    _replace_once(
        root / "config.example.toml",
        "http://127.0.0.1:9000/webhook",
        f"http://127.0.0.1:{listen_port}/webhook",
    )
    port = free_port()
    env = {k: v for k, v in os.environ.items() if not k.startswith("EFD_")}
    env["EFD_SERVER__PORT"] = str(port)
    log, listened = tmp_path / "serve.err", tmp_path / "serve.out"
    with log.open("w") as err, listened.open("w") as out:
        proc = subprocess.Popen(
            ["bash", str(root / "scripts" / "serve")],
            stdout=out,
            stderr=err,
            env=env,
            start_new_session=True,  # its own group: efd serve and efd listen stop with it
        )
    base = f"http://127.0.0.1:{port}"
    try:
        for _ in range(300):
            try:
                with urllib.request.urlopen(f"{base}/healthz", timeout=5):
                    break
            except urllib.error.URLError:
                assert proc.poll() is None, log.read_text()
                time.sleep(0.1)
        else:
            raise AssertionError(f"scripts/serve did not start efd:\n{log.read_text()}")
        yield Quickstart(root, base, log, listened)
    finally:
        os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(15)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(5)


def curl_example(base: str) -> int:
    """`curl -u wk_example: -H 'Content-Type: application/json' -d '…' …/v1/track`."""
    request = urllib.request.Request(
        f"{base}/v1/track",
        data=BODY,
        method="POST",  # as curl's -d
        headers={
            "Authorization": "Basic " + base64.b64encode(f"{WRITE_KEY}:".encode()).decode(),
            "Content-Type": "application/json",
        },
    )
    with urllib.request.urlopen(request, timeout=10) as response:
        return int(response.status)


async def test_the_curl_example_arrives_signed_at_efd_listen_and_its_attempt_is_in_sqlite(
    tmp_path: Path,
) -> None:
    with quickstart(tmp_path) as qs:
        await eventually(lambda: "efd listen: printing webhooks" in qs.log.read_text())
        assert curl_example(qs.base) == 200

        # "watch the signed webhook arrive in the `efd listen` output, with
        # `X-Signature: … (valid)`"
        printed = await eventually(
            lambda: "Order Completed" in (text := qs.listened.read_text()) and text
        )
        assert re.search(r"^X-Signature: \S+ \(valid\)$", printed, re.MULTILINE), printed
        assert '"revenue": 39.95' in printed
        assert "refused" not in printed

        # "`sqlite3 efd-data/efd.db 'select * from attempts'` shows the delivery attempt"
        def query(sql: str) -> list[tuple[object, ...]]:
            path = qs.root / "efd-data" / "efd.db"
            with sqlite3.connect(f"file:{path}?mode=ro", uri=True) as db:  # never creates it
                return db.execute(sql).fetchall()

        rows = await eventually(lambda: query("select * from attempts"))
        assert len(rows) == 1
        [(url, outcome, status)] = query("select hook_url, outcome, status_code from attempts")
        assert (outcome, status) == ("success", 200)
        assert isinstance(url, str)
        assert url.endswith("/webhook")


def test_the_console_opens_with_the_token_scripts_serve_prints(tmp_path: Path) -> None:
    """Run scripts/serve, open /console, sign in with the printed token (the console's page
    calls the admin API with it, as here)."""
    with quickstart(tmp_path) as qs:
        with urllib.request.urlopen(f"{qs.base}/console", timeout=5) as response:
            page = response.read()  # an HTTPError here: the console is off, or broken
        assert b"<html" in page.lower()
        printed = re.search(
            rf"console is at {re.escape(qs.base)}/console;\nsign in with the admin token\n\n"
            r"  (\S+)\n",
            qs.log.read_text(),
        )
        assert printed is not None, qs.log.read_text()
        token = printed.group(1)
        assert len(token) >= 16

        def admin(token: str) -> int:
            request = urllib.request.Request(
                f"{qs.base}/admin/destinations", headers={"Authorization": f"Bearer {token}"}
            )
            try:
                with urllib.request.urlopen(request, timeout=5) as response:
                    return int(response.status)
            except urllib.error.HTTPError as error:
                return int(error.code)

        assert admin(token) == 200
        assert admin(token + "x") == 401
