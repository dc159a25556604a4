"""The local PostgreSQL server a run uses: a database of its own per measurement, and the
CPU of the server's processes that work for it (read from /proc)."""

from __future__ import annotations

import contextlib
import glob
import os
import shutil
import subprocess
import tempfile
from typing import Any

import psycopg
from psycopg import sql

from efdbench.procstats import own_cpu_seconds

# The server's own helpers, whose work every database's writes cause (WAL flushes,
# checkpoints). They serve other databases on the server too.
AUX_TYPES = ("walwriter", "checkpointer", "background writer")


def admin_url(root: str) -> str:
    """$EFD_BENCH_PG, else what scripts/ensure-postgres prints (it starts a server if none
    runs)."""
    url = os.environ.get("EFD_BENCH_PG")
    if url:
        return url
    out = subprocess.run(
        [os.path.join(root, "scripts", "ensure-postgres")],
        capture_output=True,
        text=True,
        check=True,
    )
    return out.stdout.strip()


class PgServer:
    def __init__(self, admin: str) -> None:
        self.admin = admin
        self.prefix = f"efd_bench_{os.getpid()}_"
        self.created: list[str] = []

    def _connect(self) -> psycopg.Connection[Any]:
        return psycopg.connect(self.admin, autocommit=True)

    def url(self, db: str) -> str:
        base, _, _ = self.admin.rpartition("/")
        return f"{base}/{db}"

    def create_database(self, tag: str) -> str:
        name = self.prefix + tag
        with self._connect() as pg:
            pg.execute(sql.SQL("DROP DATABASE IF EXISTS {}").format(sql.Identifier(name)))
            pg.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(name)))
        self.created.append(name)
        return name

    def drop_database(self, name: str) -> None:
        with self._connect() as pg:
            pg.execute(
                sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(name))
            )
        if name in self.created:
            self.created.remove(name)

    def drop_all(self) -> None:
        for name in list(self.created):
            self.drop_database(name)

    def migrate(self, db: str) -> None:
        from efd.store import migrate

        migrate.upgrade(self.url(db))

    def settings(self) -> dict[str, str]:
        names = ("server_version", "autovacuum", "synchronous_commit", "shared_buffers", "fsync")
        out: dict[str, str] = {}
        with self._connect() as pg:
            for name in names:
                row = pg.execute(sql.SQL("SHOW {}").format(sql.Identifier(name))).fetchone()
                out[name] = str(row[0]) if row else ""
        return out

    def backend_pids(self, db: str) -> list[int]:
        """The backends connected to `db` (the daemons' pools and LISTEN connections)."""
        with self._connect() as pg:
            rows = pg.execute(
                "SELECT pid FROM pg_stat_activity WHERE datname = %s", (db,)
            ).fetchall()
        return [int(r[0]) for r in rows]

    def aux_pids(self) -> list[int]:
        with self._connect() as pg:
            rows = pg.execute(
                "SELECT pid FROM pg_stat_activity WHERE backend_type = ANY(%s)", (list(AUX_TYPES),)
            ).fetchall()
        return [int(r[0]) for r in rows]

    def checkpoint(self) -> None:
        """Write every dirty buffer now: a checkpoint that one phase's writes made due would
        otherwise fall into the next phase, whose backends would then write whole pages into
        the WAL (the first change of each page after a checkpoint)."""
        with self._connect() as pg:
            pg.execute("CHECKPOINT")

    def transactions(self, db: str) -> dict[str, int]:
        """The database's committed transactions and updated rows so far, as its backends
        have reported them (each within about a second of the work)."""
        with self._connect() as pg:
            row = pg.execute(
                "SELECT xact_commit, tup_updated FROM pg_stat_database WHERE datname = %s",
                (db,),
            ).fetchone()
        commits, updated = row or (0, 0)
        return {"commits": int(commits or 0), "updated": int(updated or 0)}

    def checkpoints(self) -> int:
        """Checkpoints the server has begun since its statistics were reset."""
        with self._connect() as pg:
            try:  # PostgreSQL 17 and later
                row = pg.execute(
                    "SELECT num_timed + num_requested FROM pg_stat_checkpointer"
                ).fetchone()
            except psycopg.errors.UndefinedTable:
                row = pg.execute(
                    "SELECT checkpoints_timed + checkpoints_req FROM pg_stat_bgwriter"
                ).fetchone()
        return int(row[0]) if row else 0

    @staticmethod
    def backend_cpu_seconds(pids: list[int]) -> float:
        return sum(c for c in (own_cpu_seconds(p) for p in pids) if c == c)


class PgCpu:
    """CPU seconds of the backends serving one database (and, apart, of the server's helpers)
    between start() and stop(). Backends that connect in between count from zero; one that
    exits in between is lost (the daemons keep their pools open, so that is rare)."""

    def __init__(self, server: PgServer, db: str) -> None:
        self.server = server
        self.db = db

    def start(self) -> None:
        self.checkpoints = self.server.checkpoints()
        self.written = self.server.transactions(self.db)
        self.before = {p: own_cpu_seconds(p) for p in self.server.backend_pids(self.db)}
        self.aux_before = {p: own_cpu_seconds(p) for p in self.server.aux_pids()}

    def stop(self) -> dict[str, float]:
        now = {p: own_cpu_seconds(p) for p in self.server.backend_pids(self.db)}
        backends = sum(v - self.before.get(p, 0.0) for p, v in now.items() if v == v)
        aux_now = {p: own_cpu_seconds(p) for p in self.aux_before}
        aux = sum(aux_now[p] - v for p, v in self.aux_before.items() if aux_now[p] == aux_now[p])
        written = self.server.transactions(self.db)
        return {
            **{key: float(written[key] - self.written[key]) for key in written},
            "backends": backends,
            "aux": aux,
            "backend_count": float(len(now)),
            "checkpoints": float(self.server.checkpoints() - self.checkpoints),
        }


class OwnCluster:
    """A PostgreSQL cluster of the bench's own, made by initdb with the distribution's
    defaults (autovacuum on, as in production): the shared server of these machines runs
    with autovacuum off, which leaves a table that retention deletes from without planner
    statistics and with its dead rows. Started on a free port, removed at stop()."""

    def __init__(self, port: int) -> None:
        bins = sorted(glob.glob("/usr/lib/postgresql/*/bin"), key=_version)
        if not bins:
            raise RuntimeError("no PostgreSQL binaries in /usr/lib/postgresql/*/bin")
        self.bin = bins[-1]
        self.port = port
        self.dir = tempfile.mkdtemp(prefix="efd-bench-pg-")
        self.data = os.path.join(self.dir, "data")
        if os.getuid() == 0:  # the server refuses to run as root
            shutil.chown(self.dir, "postgres")
        self._run("initdb", "-D", self.data, "-A", "trust", "-U", "postgres")
        self._run(
            "pg_ctl", "-D", self.data, "-l", os.path.join(self.dir, "log"), "-w", "-o",
            f"-p {port} -k {self.dir} -c listen_addresses=127.0.0.1", "start",
        )  # fmt: skip
        self.url = f"postgresql://postgres@127.0.0.1:{port}/postgres"

    def _run(self, tool: str, *args: str) -> None:
        cmd = [os.path.join(self.bin, tool), *args]
        if os.getuid() == 0:
            cmd = ["runuser", "-u", "postgres", "--", *cmd]
        subprocess.run(cmd, check=True, capture_output=True, timeout=300)

    def stop(self) -> None:
        with contextlib.suppress(subprocess.SubprocessError, OSError):
            self._run("pg_ctl", "-D", self.data, "-m", "fast", "-w", "stop")
        shutil.rmtree(self.dir, ignore_errors=True)


def _version(path: str) -> tuple[int, ...]:
    part = path.split("/")[-2]
    return tuple(int(p) for p in part.split(".") if p.isdigit())
