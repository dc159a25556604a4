"""The command line, run as a newcomer or an operator would run it."""

from __future__ import annotations

import json
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest

from efd.records import NewMessage
from efd.segment import webhooks
from efd.store import Store, migrate
from tests.conftest import (
    ROOT,
    file_permissions_apply,
    free_port,
    settings_dict,
    sql,
    write_toml,
)


def efd(
    *args: str, timeout: float = 60, prefix: list[str] | None = None
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [*(prefix or []), sys.executable, "-m", "efd", *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        cwd=ROOT,
        check=False,
    )


def test_example_config_is_valid() -> None:
    result = efd("check-config", "--config", "config.example.toml")
    assert result.returncode == 0, result.stderr
    assert "OK" in result.stdout


def test_migrate_creates_the_schema(db_url: str, tmp_path: Path) -> None:
    path = write_toml(tmp_path / "efd.toml", settings_dict(db_url))
    result = efd("migrate", "--config", str(path))
    assert result.returncode == 0, result.stderr
    assert "database at revision" in result.stdout
    assert sql(db_url, "SELECT count(*) FROM deliveries") == [(0,)]


def test_serve_refuses_an_invalid_config_and_names_each_key(tmp_path: Path) -> None:
    path = tmp_path / "bad.toml"
    path.write_text(
        '[server]\nport = "eighty"\nhots = "x"\n[delivery]\ntimeout_seconds = -1\n'
        '[[destinations]]\nname = "d"\nhooks = []\n'
    )
    result = efd("serve", "--config", str(path))
    assert result.returncode == 2
    for key in ("server.port", "server.hots", "delivery.timeout_seconds", "destinations[0].hooks"):
        assert key in result.stderr


_SECRETS = ("wk_never_shown_1234", "tok_never_shown_123456")
_CONFIG = (
    f'[server]\nadmin_token = "{_SECRETS[1]}"\n[[sources]]\nname = "w"\n'
    f'write_key = "{_SECRETS[0]}"\n'
).encode()


def _unreadable(tmp_path: Path, case: str) -> tuple[Path, str, list[str]]:
    """A config file that cannot be used, the reason efd must give, and the command prefix
    to run efd under."""
    path = tmp_path / "efd.toml"
    if case == "missing":
        return path, "no such file", []
    if case == "directory":
        path.mkdir()
        return path, "a directory, not a file", []
    if case == "permission denied":
        path.write_bytes(_CONFIG)
        path.chmod(0)
        return path, "permission denied (efd runs as user ", file_permissions_apply()
    if case == "not UTF-8":
        path.write_bytes(_CONFIG + b'[delivery]\nuser_agent = "\xff"\n')
        return path, "not valid UTF-8 (line 7, column 15)", []
    path.write_bytes(_CONFIG + b"[delivery\n")
    return path, "not valid TOML: Expected ']' at the end of a table declaration", []


@pytest.mark.parametrize("command", ["check-config", "serve"])
@pytest.mark.parametrize(
    "case", ["missing", "directory", "permission denied", "not UTF-8", "not TOML"]
)
def test_a_config_that_cannot_be_read_is_one_line_and_exit_2(
    tmp_path: Path, command: str, case: str
) -> None:
    path, why, prefix = _unreadable(tmp_path, case)
    result = efd(command, "--config", str(path), prefix=prefix)
    assert result.returncode == 2, result.stderr
    assert result.stdout == ""
    [line] = result.stderr.splitlines()
    assert line.startswith(f"efd: {path}: {why}"), line
    for secret in _SECRETS:
        assert secret not in result.stderr


def _post(url: str, body: bytes, headers: dict[str, str]) -> int:
    request = urllib.request.Request(url, data=body, headers=headers, method="POST")
    try:
        with urllib.request.urlopen(request, timeout=5) as response:
            return int(response.status)
    except urllib.error.HTTPError as error:
        return int(error.code)


def test_listen_prints_webhooks_and_refuses_what_does_not_verify(tmp_path: Path) -> None:
    port = free_port()
    log = tmp_path / "listen.out"
    with log.open("w") as out:
        proc = subprocess.Popen(
            [
                *(sys.executable, "-m", "efd", "listen", "--port", str(port)),
                *("--secret", "old", "--secret", "k"),
            ],
            stdout=out,
            stderr=subprocess.STDOUT,
            cwd=ROOT,
        )
    try:
        url = f"http://127.0.0.1:{port}/webhook"
        body = json.dumps({"type": "track", "event": "Hello"}).encode()
        signed = {"X-Signature": webhooks.sign("k", body), "webhook-id": "msg_1"}
        for _ in range(100):
            try:
                assert _post(url, body, signed) == 200
                break
            except urllib.error.URLError:
                time.sleep(0.1)
        assert _post(url, body, {"X-Signature": "0" * 40}) == 401
        assert _post(url, body, {}) == 401
        assert _post(url, body, signed) == 200  # a repeat: acknowledged
        rotated = {"X-Signature": webhooks.sign("old", body), "webhook-id": "msg_2"}
        assert _post(url, body, rotated) == 200
        for _ in range(300):  # until it has printed all five (it flushes each)
            if log.read_text().count("POST /webhook") == 5:
                break
            time.sleep(0.05)
    finally:
        proc.terminate()
        proc.wait(10)
    text = log.read_text()
    assert text.count("POST /webhook") == 5
    assert text.count("(valid)") == 2
    assert "(INVALID)" in text
    assert "(MISSING)" in text
    assert text.count("refused (401)") == 2
    assert "repeat of webhook-id msg_1: acknowledged (200), not processed again" in text
    assert text.count('"event": "Hello"') == 4  # the repeat is not shown again


def test_concurrent_migrations_are_safe(db_url: str, tmp_path: Path) -> None:
    """Several processes starting at the same moment all migrate (or find nothing to do)."""
    path = write_toml(tmp_path / "efd.toml", settings_dict(db_url))
    procs = [
        subprocess.Popen(
            [sys.executable, "-m", "efd", "migrate", "--config", str(path)],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            cwd=ROOT,
        )
        for _ in range(4)
    ]
    results = [proc.communicate(timeout=60) for proc in procs]
    assert [proc.returncode for proc in procs] == [0, 0, 0, 0], results
    assert sql(db_url, "SELECT count(*) FROM alembic_version") == [(1,)]


def test_systemd_unit_verifies(tmp_path: Path) -> None:
    import shutil

    import pytest

    if shutil.which("systemd-analyze") is None:
        pytest.skip("systemd-analyze is not installed")
    unit = (ROOT / "systemd" / "efd.service").read_text()
    efd_bin = Path(sys.executable).with_name("efd")
    unit = unit.replace("/opt/efd/.venv/bin/efd", str(efd_bin))
    (tmp_path / "efd.service").write_text(unit)
    result = subprocess.run(
        ["systemd-analyze", "verify", str(tmp_path / "efd.service")],
        capture_output=True,
        text=True,
        check=False,
    )
    problems = [line for line in result.stderr.splitlines() if "efd.service" in line]
    assert problems == [], result.stderr


def test_message_key_and_received_at_find_a_message_through_an_index(db_url: str) -> None:
    """The README's indexed forms of "what happened to messageId X?"."""
    migrate.upgrade(db_url)
    store = Store(db_url)
    now = time.time()
    try:
        store.ingestion.insert_messages(
            [
                NewMessage("web", mid, "track", "u", None, "E", now, now, "{}", ("d",))
                for mid in ("audit-me", "other")
            ],
            now,
        )
    finally:
        store.dispose()
    result = efd("message-key", "web", "audit-me")
    assert result.returncode == 0, result.stderr
    query = "FROM messages WHERE message_key = :k AND message_id = 'audit-me'"
    assert sql(db_url, f"SELECT message_id {query}", k=int(result.stdout)) == [("audit-me",)]
    bounded = "FROM messages WHERE message_id = 'audit-me' AND received_at > :t"
    assert sql(db_url, f"SELECT message_id {bounded}", t=now - 3600) == [("audit-me",)]
    if db_url.startswith("sqlite"):  # message_key is indexed on PostgreSQL only
        plan = sql(db_url, f"EXPLAIN QUERY PLAN SELECT message_id {bounded}", t=0)
        assert "ix_messages_received_at" in str(plan)
