"""GET /readyz follows whether the store takes writes now, GET /healthz whether efd is alive:
writes made to fail for real (a SQLite database whose files may not grow, as on a full disk;
a PostgreSQL database turned read-only), and then to succeed again. Real daemon processes."""

from __future__ import annotations

import asyncio
import json
import resource
from pathlib import Path
from typing import Any

import aiohttp
import psycopg

from efd.http.status import FAILURE_MEMORY, PROBE_EVERY
from tests.conftest import PG_ADMIN_URL, ReceiverFactory, basic, post, settings_dict, sql
from tests.integration.test_doors import serve

TRACK = {"type": "track", "userId": "u-1", "event": "Signed Up"}


async def get(port: int, path: str) -> tuple[int, Any]:
    async with (
        aiohttp.ClientSession() as session,
        session.get(f"http://127.0.0.1:{port}{path}") as response,
    ):
        return response.status, json.loads(await response.read())


async def track(port: int, message_id: str) -> tuple[int, Any]:
    async with (
        aiohttp.ClientSession() as session,
        session.post(
            f"http://127.0.0.1:{port}/v1/track",
            json={**TRACK, "messageId": message_id},
            headers=basic(),
        ) as response,
    ):
        return response.status, json.loads(await response.read())


async def readiness_turns(port: int, expected: int, wait: float = 0.0) -> Any:
    """/readyz's answer once its status is `expected`. A probe's outcome stands for
    PROBE_EVERY, so the answer follows the store within that (plus `wait`); the margin
    beyond is for a loaded machine, not a bound being tested."""
    deadline = asyncio.get_running_loop().time() + PROBE_EVERY + wait + 10
    while True:
        status, answer = await get(port, "/readyz")
        if status == expected or asyncio.get_running_loop().time() > deadline:
            assert status == expected, answer
            return answer
        await asyncio.sleep(0.05)


def _pg_database(db_url: str) -> str:
    return db_url.rsplit("/", 1)[1]


def _pg_admin(statement: str) -> None:
    with psycopg.connect(PG_ADMIN_URL, autocommit=True) as conn:
        conn.execute(statement)


def _pg_reconnect(database: str) -> None:
    """Close the daemon's sessions: the new ones take the database's settings."""
    _pg_admin(
        "SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
        f"WHERE datname = '{database}' AND pid <> pg_backend_pid()"
    )


async def test_readiness_is_503_while_writes_fail_and_200_once_they_succeed(
    db_url: str, tmp_path: Path
) -> None:
    settings = settings_dict(db_url, delivery={"sender_processes": 0})
    settings["sources"][0]["destinations"] = []  # messages only: no delivery work
    daemon = serve(tmp_path, settings)
    assert daemon.proc is not None
    pid, port = daemon.proc.pid, daemon.port
    sqlite = db_url.startswith("sqlite")
    database = _pg_database(db_url)
    try:
        assert (await track(port, "before"))[0] == 200
        assert await get(port, "/readyz") == (200, {"status": "ready"})

        # Writes fail for real: on SQLite no file of the database may grow (each write
        # past the first 4 KiB fails, as on a full disk); on PostgreSQL the database is
        # read-only for every new session.
        if sqlite:
            resource.prlimit(pid, resource.RLIMIT_FSIZE, (4096, resource.RLIM_INFINITY))
        else:
            _pg_admin(f'ALTER DATABASE "{database}" SET default_transaction_read_only = on')
            _pg_reconnect(database)
        # Readiness says so before any message fails (on SQLite by its own probe write:
        # nothing else has written since), and ingestion refuses what it cannot store.
        answer = await readiness_turns(port, 503)
        assert answer["status"] == "unavailable"
        assert "a write to the store failed" in answer["reason"]
        status, answer = await track(port, "during")
        assert (status, answer["code"]) == (503, "storage_unavailable")
        assert (await get(port, "/readyz"))[0] == 503
        # Liveness: the process answers and reads work.
        assert await get(port, "/healthz") == (200, {"status": "ok"})

        if sqlite:
            resource.prlimit(
                pid, resource.RLIMIT_FSIZE, (resource.RLIM_INFINITY, resource.RLIM_INFINITY)
            )
        else:
            _pg_admin(f'ALTER DATABASE "{database}" RESET default_transaction_read_only')
            _pg_reconnect(database)
        # A failed write keeps efd unready for FAILURE_MEMORY seconds after it.
        assert await readiness_turns(port, 200, FAILURE_MEMORY + 1) == {"status": "ready"}
        assert (await track(port, "after"))[0] == 200
    finally:
        daemon.ensure_stopped()
        if not sqlite:
            _pg_admin(f'ALTER DATABASE "{database}" RESET default_transaction_read_only')


async def test_readiness_is_answered_by_a_write_of_its_own(db_url: str, tmp_path: Path) -> None:
    settings = settings_dict(db_url, delivery={"sender_processes": 0})
    daemon = serve(tmp_path, settings)
    try:
        assert sql(db_url, "SELECT count(*) FROM jobs WHERE name = 'readiness'") == [(0,)]
        assert await get(daemon.port, "/readyz") == (200, {"status": "ready"})
        [(owner, at)] = sql(db_url, "SELECT owner, last_run_at FROM jobs WHERE name = 'readiness'")
        assert owner.split(":")[1] == str(daemon.proc.pid if daemon.proc else None)
        assert at > 0
    finally:
        daemon.ensure_stopped()


# -- a NUL from a client ------------------------------------------------------------------------

# The same answer on both backends, though only SQLite's text could hold U+0000.
NUL_REQUESTS = [
    ({"userId": "u", "event": "e\x00secret-event"}, "event"),
    ({"userId": "u\x00secret-user", "event": "E"}, "userId"),
    ({"anonymousId": "a\x00secret-anonymous", "event": "E"}, "anonymousId"),
]


async def test_a_nul_in_a_column_field_is_a_400_that_leaves_the_rest_stored_and_ready(
    db_url: str, tmp_path: Path, receiver_factory: ReceiverFactory
) -> None:
    receiver = await receiver_factory()
    daemon = serve(tmp_path, settings_dict(db_url, [receiver.url]))
    good: list[dict[str, Any]] = [
        {**TRACK, "messageId": f"good-{i}", "properties": {"note": "n\x00ul"}} for i in range(6)
    ]
    try:
        # Side by side, so they share the group commits a stored NUL used to fail.
        answers = await asyncio.gather(
            *(post(daemon.port, "/v1/track", body) for body in good),
            *(post(daemon.port, "/v1/track", body) for body, _ in NUL_REQUESTS),
        )
        assert [status for status, _ in answers[: len(good)]] == [200] * len(good), answers
        for (status, answer), (_, field) in zip(answers[len(good) :], NUL_REQUESTS, strict=True):
            assert (status, answer["code"], answer["field"]) == (400, "invalid_field", field)
        assert await get(daemon.port, "/readyz") == (200, {"status": "ready"})
        received = await receiver.wait_for(len(good))
        ids = sorted(m for (m,) in sql(db_url, "SELECT message_id FROM messages"))
        assert ids == sorted(body["messageId"] for body in good)
    finally:
        daemon.ensure_stopped()
    # A NUL outside the columns is kept, escaped alike in the body on both backends.
    for delivered in received:
        assert b'"properties":{"note":"n\\u0000ul"}' in delivered.body, delivered.body
        assert delivered.json()["properties"] == {"note": "n\x00ul"}
    log = daemon.log()
    assert " ERROR " not in log, log
    assert "secret-" not in log, log  # the refusals name the field, not the value
