"""The suite's PostgreSQL databases (tests/conftest.py `pg_database`): a database a test used
comes back to the next one empty, its sequences restarted, at the newest revision; one whose
schema a test changed is dropped, never handed on."""

from __future__ import annotations

import contextlib

import psycopg

from tests.conftest import PG_ADMIN_URL, pg_database


def _database(url: str) -> str:
    return url.rsplit("/", 1)[1]


def _exists(name: str) -> bool:
    with psycopg.connect(PG_ADMIN_URL) as conn:
        row = conn.execute("SELECT 1 FROM pg_database WHERE datname = %s", [name]).fetchone()
    return row is not None


def test_a_used_database_is_handed_on_empty_and_at_the_newest_revision(pg_template: str) -> None:
    with contextlib.ExitStack() as left_open:
        with pg_database(pg_template) as url, psycopg.connect(url, autocommit=True) as conn:
            conn.execute(
                "INSERT INTO messages (source, message_id, type, timestamp, received_at, body)"
                " VALUES ('web', 'm-1', 'track', 1, 1, '{}'), ('web', 'm-2', 'track', 1, 1, '{}')"
            )
            revision = conn.execute("SELECT version_num FROM alembic_version").fetchone()
            # A session the test left open (a daemon killed mid-transaction) does not stop it.
            lingering = psycopg.connect(url)
            left_open.callback(lingering.close)
            lingering.execute("SELECT count(*) FROM messages")  # its transaction stays open
        with pg_database(pg_template) as again, psycopg.connect(again) as conn:
            assert _database(again) == _database(url)  # the same database, reused
            assert conn.execute("SELECT count(*) FROM messages").fetchone() == (0,)
            assert conn.execute("SELECT version_num FROM alembic_version").fetchone() == revision
            conn.execute(
                "INSERT INTO messages (source, message_id, type, timestamp, received_at, body)"
                " VALUES ('web', 'm-3', 'track', 1, 1, '{}')"
            )
            assert conn.execute("SELECT id FROM messages").fetchone() == (1,)  # restarted


def test_a_database_whose_schema_a_test_changed_is_dropped(pg_template: str) -> None:
    with pg_database(pg_template) as url, psycopg.connect(url, autocommit=True) as conn:
        conn.execute("ALTER TABLE messages ADD COLUMN extra text")
    assert not _exists(_database(url))
    with pg_database(pg_template) as fresh, psycopg.connect(fresh) as conn:
        assert _database(fresh) != _database(url)
        columns = conn.execute(
            "SELECT count(*) FROM information_schema.columns"
            " WHERE table_name = 'messages' AND column_name = 'extra'"
        ).fetchone()
        assert columns == (0,)
