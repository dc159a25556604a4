"""No client can hold the doors shut: clients that do not read their answers, pipeline
without end, or open every connection from one address; and an open-file limit too low for
max_connections. Real daemons, real sockets."""

from __future__ import annotations

import asyncio
import contextlib
import json
import re
import resource
import socket
import time
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from efd.http.server import MAX_PIPELINED
from tests.conftest import (
    DaemonFactory,
    DaemonProcess,
    content_length,
    eventually,
    free_port,
    post,
    settings_dict,
    sql,
    write_toml,
)

TOKEN = "doors-admin-token-0123456"
TRACK = {"type": "track", "userId": "u-1", "event": "Signed Up"}
# A large answer that needs no token: what a client that never reads asks for.
LARGE = b"GET /openapi.json HTTP/1.1\r\nHost: x\r\n\r\n"


def door_settings(tmp_path: Path, **server: Any) -> dict[str, Any]:
    settings = settings_dict(f"sqlite:///{tmp_path / 'efd.db'}")
    settings["server"].update(admin_token=TOKEN, **server)
    return settings


def never_reads(port: int, source: str = "127.0.0.1", requests: int = 200) -> socket.socket:
    """A connection from `source` that pipelines `requests` large answers and never reads
    them, with a small receive buffer so that they stall soon."""
    sock = socket.socket()
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    sock.bind((source, 0))
    sock.connect(("127.0.0.1", port))
    sock.sendall(LARGE * requests)
    sock.setblocking(False)
    return sock


def answered(sock: socket.socket) -> bool:
    try:
        return bool(sock.recv(1, socket.MSG_PEEK))
    except BlockingIOError:
        return False


async def read_all(sock: socket.socket) -> bytes:
    """Everything the server sends until it closes the connection (a reset counts as
    closing; what arrived before it is kept)."""
    loop = asyncio.get_running_loop()
    received = b""
    with contextlib.suppress(ConnectionResetError):
        while chunk := await loop.sock_recv(sock, 65536):
            received += chunk
    return received


async def status_of(port: int, path: str, token: str | None = None) -> int:
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    async with (
        aiohttp.ClientSession() as session,
        session.get(f"http://127.0.0.1:{port}{path}", headers=headers) as response,
    ):
        await response.read()
        return response.status


# -- answers that are not taken --------------------------------------------------------------


async def test_clients_that_pipeline_and_never_read_are_cut_off_and_others_served(
    tmp_path: Path, daemon_factory: DaemonFactory
) -> None:
    # Every connection goes to a client that pipelines large answers and never reads them.
    # Each connection is closed after MAX_PIPELINED answers, or when an answer has waited
    # request_timeout_seconds (whichever comes first), so another client is served again
    # at the latest request_timeout_seconds (plus the one-second sweep) after they stall.
    daemon = await daemon_factory(
        door_settings(
            tmp_path, max_connections=4, max_connections_per_address=4, request_timeout_seconds=1
        )
    )
    attackers = [never_reads(daemon.port) for _ in range(4)]
    # Every one of them admitted (and answered) before the other client comes.
    await eventually(lambda: all(answered(sock) for sock in attackers))
    status = 503
    for _ in range(600):
        status = await status_of(daemon.port, "/healthz")
        if status == 200:
            break
        await asyncio.sleep(0.05)
    assert status == 200
    # efd closed every one of them (none closed its own socket), after at most the bound.
    for sock in attackers:
        async with asyncio.timeout(30):
            answers = (await read_all(sock)).count(b"HTTP/1.1 200")
        assert 0 < answers <= MAX_PIPELINED
        sock.close()
    assert (await post(daemon.port, "/v1/track", TRACK))[0] == 200


async def test_an_answer_left_untaken_closes_its_connection(
    tmp_path: Path, daemon_factory: DaemonFactory
) -> None:
    # One answer larger than the kernel's socket buffers take, to a client that never
    # reads it: efd closes the connection request_timeout_seconds after the answer stalls
    # and serves the next client on the only connection there is.
    daemon = await daemon_factory(
        door_settings(
            tmp_path, max_connections=1, max_connections_per_address=1, request_timeout_seconds=1
        )
    )
    assert (await post(daemon.port, "/v1/track", {**TRACK, "messageId": "m-big"}))[0] == 200
    db_url = f"sqlite:///{tmp_path / 'efd.db'}"
    # Forty attempts, each with a 100,000-character answer that JSON doubles: about 8 MB.
    sql(
        db_url,
        "WITH RECURSIVE n(i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM n WHERE i < 40) "
        "INSERT INTO attempts (delivery_id, hook_url, attempted_at, duration_ms, outcome, "
        "response_head) SELECT d.id, 'http://127.0.0.1:9/unused', 0, 1, 'retry', "
        "replace(hex(zeroblob(50000)), '0', '\"') FROM deliveries d, n",
    )
    await eventually(lambda: daemon.listener is not None and not daemon.listener.connections)
    sock = socket.socket()
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    sock.connect(("127.0.0.1", daemon.port))
    sock.sendall(
        f"GET /admin/messages/web/m-big HTTP/1.1\r\nHost: x\r\n"
        f"Authorization: Bearer {TOKEN}\r\n\r\n".encode()
    )
    sock.setblocking(False)
    await eventually(lambda: answered(sock))  # admitted before the other client comes
    status = 503
    for _ in range(600):
        status = await status_of(daemon.port, "/healthz")
        if status == 200:
            break
        await asyncio.sleep(0.05)
    assert status == 200
    assert daemon.metrics.responses_timed_out == 1
    async with asyncio.timeout(30):
        received = await read_all(sock)
    sock.close()
    head, _, body = received.partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 200")
    length = content_length(head)
    assert len(body) < length  # cut off, not finished


async def test_one_address_cannot_take_every_connection(
    tmp_path: Path, daemon_factory: DaemonFactory
) -> None:
    # The default bound for one address is half of max_connections. The attack's
    # connections stay open for the whole test (request_timeout_seconds is long): the
    # other client is served while the attack goes on, not after it.
    daemon = await daemon_factory(
        door_settings(tmp_path, max_connections=8, request_timeout_seconds=300)
    )
    attackers = []
    for _ in range(8):  # headers that never end
        sock = socket.socket()
        sock.bind(("127.0.0.2", 0))
        sock.connect(("127.0.0.1", daemon.port))
        sock.sendall(b"GET /healthz HTTP/1.1\r\nHost: x\r\n")
        attackers.append(sock)
    await eventually(lambda: daemon.metrics.connections_refused == 4)
    listener = daemon.listener
    assert listener is not None
    assert listener.by_address == {"127.0.0.2": 4}
    assert await status_of(daemon.port, "/healthz") == 200
    assert await status_of(daemon.port, "/admin/deliveries", token=TOKEN) == 200
    assert (await post(daemon.port, "/v1/track", TRACK))[0] == 200
    # ... while the attack still holds its four.
    assert listener.by_address.get("127.0.0.2") == 4
    refused = []
    for sock in attackers:
        sock.setblocking(False)
        with contextlib.suppress(BlockingIOError):
            answer = sock.recv(65536)
            if answer.startswith(b"HTTP/1.1 503"):
                refused.append(answer)
        sock.close()
    assert len(refused) == 4
    for answer in refused:
        body = json.loads(answer.partition(b"\r\n\r\n")[2])
        assert body["code"] == "too_many_connections"
        assert "address" in body["message"]


async def test_pipelined_requests_are_answered_up_to_the_bound_then_the_connection_closes(
    tmp_path: Path, daemon_factory: DaemonFactory
) -> None:
    daemon = await daemon_factory(door_settings(tmp_path, keepalive_timeout_seconds=1))
    reader, writer = await asyncio.open_connection("127.0.0.1", daemon.port)
    writer.write(b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n" * (MAX_PIPELINED + 24))
    async with asyncio.timeout(30):
        received = await reader.read()  # until the server closes
    writer.close()
    heads = re.findall(rb"HTTP/1\.1 (\d+) [^\r]*\r\n(.*?)\r\n\r\n", received, re.S)
    assert [status for status, _ in heads] == [b"200"] * MAX_PIPELINED
    assert b"Connection: close" in heads[-1][1]
    assert all(b"Connection: close" not in head for _, head in heads[:-1])
    # A client that waits for each answer is not bounded.
    reader, writer = await asyncio.open_connection("127.0.0.1", daemon.port)
    for _ in range(MAX_PIPELINED + 4):
        writer.write(b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n")
        head = await reader.readuntil(b"\r\n\r\n")
        assert head.startswith(b"HTTP/1.1 200")
        assert b"Connection: close" not in head
        length = content_length(head)
        await reader.readexactly(length)
    writer.close()


# -- the open-file limit ---------------------------------------------------------------------


def serve(tmp_path: Path, settings: dict[str, Any], preexec_fn: Any = None) -> DaemonProcess:
    """`efd serve` in its own process, listening on a free port: once its log says it
    listens there (a port taken by someone else between the check and the bind gets another
    try)."""
    for attempt in range(5):
        port = free_port()
        settings["server"]["port"] = port
        config = write_toml(tmp_path / "efd.toml", settings)
        log = tmp_path / f"efd-{attempt}.log"
        daemon = DaemonProcess(config, port, log, preexec_fn=preexec_fn)
        try:
            daemon.start()
            deadline = time.monotonic() + 20
            while f"efd listening on http://127.0.0.1:{port} " not in daemon.log():
                assert daemon.proc is not None
                if daemon.proc.poll() is not None or time.monotonic() > deadline:
                    raise AssertionError(f"daemon did not start:\n{daemon.log()}")
                time.sleep(0.05)
        except AssertionError:
            daemon.ensure_stopped()
            if "address already in use" in daemon.log().lower():
                continue
            raise
        return daemon
    raise AssertionError("no free port found")


def _open_files(limit: int) -> Any:
    def apply() -> None:
        resource.setrlimit(resource.RLIMIT_NOFILE, (limit, limit))

    return apply


async def test_max_connections_is_lowered_to_what_the_open_file_limit_holds(tmp_path: Path) -> None:
    # 1024 connections (the default) cannot fit in 200 open files: efd serves what fits and
    # answers the rest 503, and says so once at start. Before, connections beyond the
    # limit were never accepted: their clients hung without an answer or a log line.
    settings = door_settings(
        tmp_path, keepalive_timeout_seconds=300, max_connections_per_address=1024
    )
    daemon = serve(tmp_path, settings, preexec_fn=_open_files(200))
    port = daemon.port
    held: list[asyncio.StreamWriter] = []
    statuses: list[int] = []
    try:
        for _ in range(250):
            reader, writer = await asyncio.open_connection("127.0.0.1", port)
            writer.write(b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n")
            async with asyncio.timeout(20):
                line = await reader.readline()
            statuses.append(int(line.split()[1]))
            held.append(writer)
        found = re.search(
            r"max_connections lowered from 1024 to (\d+): the open-file limit is 200", daemon.log()
        )
        assert found is not None, daemon.log()
        room = int(found[1])
        served = statuses.count(200)
        assert statuses == [200] * served + [503] * (250 - served)
        # As many as fit, or one fewer while the daemon still holds the start-up probe's
        # connection (made and closed by the test before it began).
        assert room - 1 <= served <= room
        assert len(re.findall("max_connections lowered", daemon.log())) == 1
        for writer in held:
            writer.close()
        held.clear()
        for _ in range(200):  # once they are gone, new connections are served again
            status = await status_of(port, "/healthz")
            if status == 200:
                break
            await asyncio.sleep(0.05)
        assert status == 200
    finally:
        for writer in held:
            writer.close()
        daemon.ensure_stopped()


async def test_the_open_file_limit_is_raised_when_the_hard_limit_allows(tmp_path: Path) -> None:
    def low_soft_limit() -> None:
        resource.setrlimit(resource.RLIMIT_NOFILE, (200, 4096))

    daemon = serve(tmp_path, door_settings(tmp_path), preexec_fn=low_soft_limit)
    try:
        assert daemon.proc is not None
        soft, hard = resource.prlimit(daemon.proc.pid, resource.RLIMIT_NOFILE)
        assert hard == 4096
        assert soft > 1024
        assert f"raised the open-file limit from 200 to {soft}" in daemon.log()
        assert "max_connections lowered" not in daemon.log()
    finally:
        daemon.ensure_stopped()


async def test_an_open_file_limit_without_room_for_connections_refuses_to_start(
    tmp_path: Path,
) -> None:
    port = free_port()
    config = write_toml(tmp_path / "efd.toml", door_settings(tmp_path, port=port))
    daemon = DaemonProcess(config, port, tmp_path / "efd.log", preexec_fn=_open_files(100))
    try:
        with pytest.raises(AssertionError, match="exited early"):
            daemon.start()
    finally:
        daemon.ensure_stopped()
    assert daemon.proc is not None
    assert daemon.proc.returncode == 1
    assert "the open-file limit (100, hard limit 100) leaves no room for connections" in (
        daemon.log()
    )
