"""Alembic glue: bring a database to the newest schema, safely from several processes."""

from __future__ import annotations

import logging
from importlib import resources
from pathlib import Path

from alembic import command
from alembic.config import Config
from alembic.runtime.migration import MigrationContext
from alembic.script import ScriptDirectory
from sqlalchemy import text

from efd.store.backends import backend_for
from efd.store.database import edge
from efd.store.engine import make_engine, safe_url

log = logging.getLogger(__name__)

# Any constant; every efd process takes this PostgreSQL advisory lock around migrations.
_MIGRATION_LOCK = 0x0EFD_0001


def _script_location() -> str:
    checkout = Path(__file__).resolve().parents[2] / "migrations"
    if (checkout / "env.py").is_file():
        return str(checkout)
    return str(resources.files("efd._migrations"))


def _config() -> Config:
    config = Config()
    config.set_main_option("script_location", _script_location())
    return config


def head_revision() -> str | None:
    return ScriptDirectory.from_config(_config()).get_current_head()


def current_revision(url: str) -> str | None:
    engine = make_engine(url, writer=False)
    try:
        with edge(), engine.connect() as conn:
            return MigrationContext.configure(conn).get_current_revision()
    finally:
        engine.dispose()


def upgrade(url: str) -> None:
    """alembic upgrade head. Concurrent callers wait for each other and then find
    nothing left to do: PostgreSQL through an advisory lock, SQLite through BEGIN IMMEDIATE."""
    engine = make_engine(url, writer=True)
    config = _config()
    # Several processes may start at once: they take turns through an advisory lock; a
    # single-process database's writer lock already serialises them.
    locks = not backend_for(url).single_process
    try:
        with edge(), engine.connect() as conn:
            if locks:
                conn.execute(text("SELECT pg_advisory_lock(:key)"), {"key": _MIGRATION_LOCK})
                conn.commit()
            try:
                config.attributes["connection"] = conn
                before = MigrationContext.configure(conn).get_current_revision()
                command.upgrade(config, "head")
                conn.commit()
                after = MigrationContext.configure(conn).get_current_revision()
                if before != after:
                    log.info("migrated %s from %s to %s", safe_url(url), before, after)
            finally:
                if locks:
                    conn.execute(text("SELECT pg_advisory_unlock(:key)"), {"key": _MIGRATION_LOCK})
                    conn.commit()
    finally:
        engine.dispose()
