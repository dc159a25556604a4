"""Scale-out proof: several daemons on one PostgreSQL, real kills, a real database restart,
counted at a real receiver. Each test prints its counts (run with -s to see them)."""

from __future__ import annotations

import asyncio
import contextlib
import glob
import os
import shutil
import subprocess
import tempfile
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from aiohttp import web

from tests.conftest import (
    DaemonProcess,
    Receiver,
    ReceiverFactory,
    basic,
    eventually,
    free_port,
    pg_database,
    settings_dict,
    sql,
    write_toml,
)

pytestmark = pytest.mark.slow


def _daemon(
    tmp_path: Path, db_url: str, receiver_url: str, name: str, **delivery: Any
) -> DaemonProcess:
    settings = settings_dict(
        db_url,
        [receiver_url],
        delivery={"timeout_seconds": 2, "lease_seconds": 8, "max_per_hook": 32, **delivery},
    )
    port = free_port()
    settings["server"] = {"host": "127.0.0.1", "port": port}
    settings["logging"] = {"level": "WARNING"}
    path = write_toml(tmp_path / f"{name}.toml", settings)
    return DaemonProcess(path, port, tmp_path / f"{name}.log")


async def _send(
    ports: list[int], ids: list[str], *, batch: int = 100, concurrency: int = 8
) -> tuple[list[str], int]:
    """POST `ids` in batches spread over `ports`; return (acknowledged ids, refused batches)."""
    acked: list[str] = []
    refused = 0
    chunks = [ids[i : i + batch] for i in range(0, len(ids), batch)]
    queue: asyncio.Queue[tuple[int, list[str]]] = asyncio.Queue()
    for n, chunk in enumerate(chunks):
        queue.put_nowait((ports[n % len(ports)], chunk))

    async def worker(session: aiohttp.ClientSession) -> None:
        nonlocal refused
        while not queue.empty():
            port, chunk = queue.get_nowait()
            payload = {
                "batch": [
                    {"type": "track", "userId": "u", "event": "E", "messageId": m} for m in chunk
                ]
            }
            try:
                async with session.post(
                    f"http://127.0.0.1:{port}/v1/batch", json=payload, headers=basic()
                ) as response:
                    if response.status == 200:
                        acked.extend(chunk)
                    else:
                        refused += 1
            except aiohttp.ClientError:
                refused += 1

    async with aiohttp.ClientSession() as session:
        await asyncio.gather(*(worker(session) for _ in range(concurrency)))
    return acked, refused


def _counts(receiver: Receiver) -> Counter[str]:
    return Counter(r.json()["messageId"] for r in receiver.received)


@pytest.fixture
def pg_url(pg_template: str) -> Iterator[str]:
    with pg_database(pg_template, "efd_scale") as url:
        yield url


async def test_three_daemons_deliver_8000_messages_exactly_once(
    pg_url: str, receiver_factory: ReceiverFactory, tmp_path: Path
) -> None:
    receiver = await receiver_factory()
    daemons = [_daemon(tmp_path, pg_url, receiver.url, f"d{i}").start() for i in range(3)]
    try:
        ids = [f"s{i}" for i in range(8_000)]
        acked, refused = await _send([d.port for d in daemons], ids)
        assert refused == 0
        assert len(acked) == 8_000
        await eventually(lambda: len(_counts(receiver)) == 8_000, timeout=120, interval=0.5)
        await _all_finished(pg_url)
        counts = _counts(receiver)
        duplicates = sum(c - 1 for c in counts.values())
        owners = sql(pg_url, "SELECT count(DISTINCT lease_owner) FROM deliveries")
        print(
            f"\nthree daemons: sent 8000, acknowledged {len(acked)}, "
            f"delivered {len(counts)}, duplicates {duplicates}"
        )
        assert duplicates == 0
        assert sql(pg_url, "SELECT count(*) FROM deliveries WHERE status = 'delivered'") == [
            (8_000,)
        ]
        # Every daemon took part in delivering (the claims were shared, not serialised).
        per_daemon = [d.log() for d in daemons]
        assert owners == [(0,)]  # no lease left behind
        assert all("Traceback" not in log for log in per_daemon)
    finally:
        for daemon in daemons:
            daemon.ensure_stopped()


async def _all_finished(db_url: str) -> None:
    """Until no delivery is pending: then the receiver's counts are final (a duplicate is
    received before the 200 that finishes its delivery)."""
    pending = "SELECT count(*) FROM deliveries WHERE status = 'pending'"
    await eventually(lambda: sql(db_url, pending) == [(0,)], timeout=120, interval=0.2)


async def _kill_test(
    db_url: str, receiver_factory: ReceiverFactory, tmp_path: Path, count: int, n_daemons: int
) -> None:
    async def slowish(_request: web.Request, _n: int) -> web.StreamResponse:
        await asyncio.sleep(0.05)
        return web.Response(text="ok")

    receiver = await receiver_factory(slowish)
    daemons = [_daemon(tmp_path, db_url, receiver.url, f"k{i}").start() for i in range(n_daemons)]
    victim = daemons[-1]
    try:
        ids = [f"k{i}" for i in range(count)]
        acked, refused = await _send([d.port for d in daemons], ids)
        assert refused == 0
        await eventually(lambda: len(receiver.received) >= count // 4, timeout=60, interval=0.05)
        assert victim.proc is not None
        pid = victim.proc.pid
        victim.kill()
        in_flight = {
            row[0]
            for row in sql(
                db_url,
                "SELECT m.message_id FROM deliveries d JOIN messages m ON m.id = d.message_pk "
                "WHERE d.status = 'pending' AND d.lease_owner LIKE :owner",
                owner=f"%:{pid}:%",
            )
        }
        if n_daemons == 1:
            victim.start()  # SQLite: the single daemon comes back
        await eventually(lambda: len(_counts(receiver)) == count, timeout=120, interval=0.5)
        await _all_finished(db_url)
        counts = _counts(receiver)
        duplicated = {m for m, c in counts.items() if c > 1}
        print(
            f"\nkill -9 ({n_daemons} daemon(s)): sent {count}, acknowledged {len(acked)}, "
            f"delivered {len(counts)}, in flight at the kill {len(in_flight)}, "
            f"duplicates {sum(counts[m] - 1 for m in duplicated)}"
        )
        assert set(counts) == set(acked)
        assert in_flight, "the kill should have caught deliveries in flight"
        assert duplicated <= in_flight  # duplicates only among those in flight at the kill
        assert all(counts[m] == 2 for m in duplicated)
    finally:
        for daemon in daemons:
            daemon.ensure_stopped()


async def test_kill_9_of_one_of_three_daemons_under_load(
    pg_url: str, receiver_factory: ReceiverFactory, tmp_path: Path
) -> None:
    await _kill_test(pg_url, receiver_factory, tmp_path, count=6000, n_daemons=3)


async def test_kill_9_of_a_single_sqlite_daemon_under_load(
    receiver_factory: ReceiverFactory, tmp_path: Path
) -> None:
    db_url = f"sqlite:///{tmp_path / 'kill.db'}"
    await _kill_test(db_url, receiver_factory, tmp_path, count=4000, n_daemons=1)


# -- a PostgreSQL of the test's own, to restart under load ----------------------------------


class PrivatePostgres:
    """initdb + pg_ctl in a temporary directory, so restarting it disturbs nobody else."""

    def __init__(self) -> None:
        bins = sorted(glob.glob("/usr/lib/postgresql/*/bin"))
        if not bins:
            pytest.skip("no PostgreSQL server binaries to run a private cluster")
        self.bin = bins[-1]
        self.port = free_port()
        self.dir = tempfile.mkdtemp(prefix="efd-pg-")
        self.root = os.geteuid() == 0
        if self.root:
            shutil.chown(self.dir, "postgres")
        self._run("initdb", "-D", self.dir, "-A", "trust", "-U", "postgres")

    @property
    def url(self) -> str:
        return f"postgresql://postgres@127.0.0.1:{self.port}/postgres"

    def _run(self, tool: str, *args: str) -> None:
        command = [f"{self.bin}/{tool}", *args]
        if self.root:
            command = ["runuser", "-u", "postgres", "--", *command]
        subprocess.run(command, check=True, capture_output=True, timeout=60)

    def ctl(self, action: str) -> None:
        options = f"-p {self.port} -k {self.dir} -c listen_addresses=127.0.0.1"
        self._run(
            "pg_ctl",
            "-D",
            self.dir,
            "-l",
            f"{self.dir}/log",
            "-o",
            options,
            "-m",
            "fast",
            "-w",
            action,
        )

    def destroy(self) -> None:
        with contextlib.suppress(subprocess.CalledProcessError):
            self.ctl("stop")
        shutil.rmtree(self.dir, ignore_errors=True)


async def test_postgres_restart_under_load_loses_nothing_acknowledged(
    receiver_factory: ReceiverFactory, tmp_path: Path
) -> None:
    server = PrivatePostgres()
    try:
        server.ctl("start")
        receiver = await receiver_factory()
        daemons = [_daemon(tmp_path, server.url, receiver.url, f"r{i}").start() for i in range(2)]
        try:
            ids = [f"r{i}" for i in range(8000)]

            async def restart_midway() -> None:
                await asyncio.sleep(1.0)
                await asyncio.to_thread(server.ctl, "stop")
                await asyncio.sleep(2.0)  # ingestion must answer 503, never 200
                await asyncio.to_thread(server.ctl, "start")

            (acked, refused), _ = await asyncio.gather(
                _send([d.port for d in daemons], ids, batch=20, concurrency=4), restart_midway()
            )
            await eventually(lambda: set(_counts(receiver)) >= set(acked), timeout=90, interval=0.5)
            counts = _counts(receiver)
            print(
                f"\npostgres restart: sent {len(ids)}, acknowledged {len(acked)}, "
                f"refused batches {refused}, delivered {len(counts)}, "
                f"duplicates {sum(c - 1 for c in counts.values())}"
            )
            assert refused > 0, "the restart should have refused some requests"
            assert set(acked) <= set(counts)  # nothing that got a 200 is lost
            # The daemons reconnected by themselves and report healthy again.
            async with aiohttp.ClientSession() as session:
                for daemon in daemons:
                    async with session.get(f"http://127.0.0.1:{daemon.port}/healthz") as response:
                        assert response.status == 200
        finally:
            for daemon in daemons:
                daemon.ensure_stopped()
    finally:
        server.destroy()


async def test_healthz_and_ingestion_report_a_database_outage(
    receiver_factory: ReceiverFactory, tmp_path: Path
) -> None:
    server = PrivatePostgres()
    try:
        server.ctl("start")
        receiver = await receiver_factory()
        daemon = _daemon(tmp_path, server.url, receiver.url, "h").start()
        try:
            await asyncio.to_thread(server.ctl, "stop")
            async with aiohttp.ClientSession() as session:
                async with session.get(f"http://127.0.0.1:{daemon.port}/healthz") as response:
                    assert response.status == 503
                    assert (await response.json())["status"] == "unavailable"
                payload = {"userId": "u", "event": "E", "messageId": "during-outage"}
                async with session.post(
                    f"http://127.0.0.1:{daemon.port}/v1/track", json=payload, headers=basic()
                ) as response:
                    assert response.status == 503
                    assert (await response.json())["code"] == "storage_unavailable"
                await asyncio.to_thread(server.ctl, "start")
                await eventually(lambda: True)
                for _ in range(50):
                    async with session.get(f"http://127.0.0.1:{daemon.port}/healthz") as response:
                        if response.status == 200:
                            break
                    await asyncio.sleep(0.2)
                assert response.status == 200
                payload["messageId"] = "after-outage"
                async with session.post(
                    f"http://127.0.0.1:{daemon.port}/v1/track", json=payload, headers=basic()
                ) as response:
                    assert response.status == 200
            await receiver.wait_for(1, timeout=15)
            assert [r.json()["messageId"] for r in receiver.received] == ["after-outage"]
        finally:
            daemon.ensure_stopped()
    finally:
        server.destroy()
