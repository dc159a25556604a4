"""The queue: messages in, their deliveries claimed and recorded, the attempt log.
Synchronous; callers run it in threads (efd/store/runner.py).

Writes go through one writer engine (on SQLite, one connection with BEGIN IMMEDIATE: the
single writer); reads use a separate engine so /healthz and /metrics never queue behind
a large commit. The feature stores (profiles, computations, regulations) use the same
engines.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from contextlib import contextmanager
from operator import attrgetter
from typing import Any, Protocol, TypeVar

import psycopg
from sqlalchemy import (
    Connection,
    Engine,
    and_,
    bindparam,
    delete,
    func,
    insert,
    or_,
    select,
    text,
    update,
)
from sqlalchemy.dialects.postgresql import insert as pg_insert
from sqlalchemy.dialects.sqlite import insert as sqlite_insert

from efd.rows import AttemptRow, Claimed, DeliveryStatus, InsertStatus, NewMessage, Outcome
from efd.store import dedupe, fastpath, lanes, pgpath
from efd.store.dedupe import message_key
from efd.store.engine import is_sqlite, make_engine, normalise_url
from efd.store.schema import attempts, deliveries, jobs, messages
from efd.store.statements import insert_for

PENDING = DeliveryStatus.PENDING
QUEUED = DeliveryStatus.QUEUED
# Not finished: waiting for a round (pending) or behind its lane's head (queued).
OPEN = (PENDING.value, QUEUED.value)

DEDUPE_WINDOW_SECONDS = 24 * 3600
NOTIFY_CHANNEL = "efd_deliveries"
READINESS_ROW = "readiness"  # the jobs row readiness probes write
_CHUNK = 500  # bound IN lists well below SQLite's variable limit


class Suppressed(Protocol):
    def suppressed(self, conn: Connection, ids: set[str]) -> set[str]:
        """Which of these userIds/anonymousIds are suppressed."""
        ...


# Profile capture (efd/personas/capture.py): the stored rows folded into profiles.
Capture = Callable[[Connection, Sequence[NewMessage]], None]


class Lanes(Protocol):
    def lane(self, row: NewMessage, destination: str) -> str | None:
        """The lane a delivery of `row` to `destination` joins; None: no lane (unordered)."""
        ...


T = TypeVar("T")


def _chunks(items: Sequence[T], size: int = _CHUNK) -> Iterable[Sequence[T]]:
    for start in range(0, len(items), size):
        yield items[start : start + size]


# Columns of the fast SQLite insert path, named as NewMessage's attributes.
_MESSAGE_FIELDS = (
    "source",
    "message_id",
    "type",
    "user_id",
    "anonymous_id",
    "event",
    "timestamp",
    "received_at",
    "body",
    "original_timestamp",
)
_message_fields = attrgetter(*_MESSAGE_FIELDS)
_MESSAGE_COLUMNS = (*_MESSAGE_FIELDS, "message_key")
_DELIVERY_FIELDS = (
    "message_pk",
    "destination",
    "status",
    "attempts",
    "created_at",
    "next_attempt_at",
    "lease_token",
    "lane",
)


_PG_INSERT_MESSAGES = pgpath.unnest_insert("messages", _MESSAGE_COLUMNS, returning=True)
_PG_INSERT_DELIVERIES = pgpath.unnest_insert("deliveries", _DELIVERY_FIELDS, returning=False)


# Delivery statements, built once with named parameters (see Store._run).
_CLAIM = (
    update(deliveries)
    .where(
        deliveries.c.id.in_(
            select(deliveries.c.id)
            .where(
                deliveries.c.destination == bindparam("c_destination"),
                deliveries.c.status == PENDING,
                deliveries.c.next_attempt_at <= bindparam("c_due_by"),
                # A row another process holds under a live lease is never taken, even by a
                # claim that reaches past `now` (a circuit's probe).
                or_(
                    deliveries.c.lease_owner.is_(None),
                    deliveries.c.next_attempt_at <= bindparam("c_now"),
                ),
            )
            .order_by(deliveries.c.next_attempt_at)
            .limit(bindparam("c_limit"))
            .with_for_update(skip_locked=True)
            .scalar_subquery()
        )
    )
    .values(
        lease_owner=bindparam("c_owner"),
        next_attempt_at=bindparam("c_until"),
        lease_token=deliveries.c.lease_token + 1,
    )
    .returning(
        deliveries.c.id,
        deliveries.c.lease_token,
        deliveries.c.message_pk,
        deliveries.c.attempts,
        deliveries.c.first_attempt_at,
        deliveries.c.failed_hooks,
    )
)
_RECORD_OUTCOME = (
    update(deliveries)
    .where(
        deliveries.c.id == bindparam("o_id"),
        deliveries.c.lease_token == bindparam("o_token"),
        deliveries.c.status == PENDING,
    )
    .values(
        status=bindparam("o_status"),
        attempts=bindparam("o_attempts"),
        first_attempt_at=bindparam("o_first"),
        next_attempt_at=bindparam("o_next"),
        finished_at=bindparam("o_finished"),
        failed_hooks=bindparam("o_failed"),
        last_error=bindparam("o_error"),
        lease_owner=None,
    )
)
_ATTEMPT_FIELDS = (
    "delivery_id",
    "hook_url",
    "attempted_at",
    "duration_ms",
    "outcome",
    "status_code",
    "error_class",
    "error",
    "response_head",
)
_INSERT_ATTEMPT = insert(attempts).values({name: bindparam(name) for name in _ATTEMPT_FIELDS})
_attempt_fields = attrgetter(*_ATTEMPT_FIELDS)
# PostgreSQL: a round's attempt rows as arrays, like ingestion's rows: one fixed text, where
# an executemany sends a multi-row VALUES the driver parses again for every batch size.
_PG_INSERT_ATTEMPTS = pgpath.unnest_insert("attempts", _ATTEMPT_FIELDS, returning=False)


def _attempt_params(row: AttemptRow) -> dict[str, Any]:
    return dict(zip(_ATTEMPT_FIELDS, _attempt_fields(row), strict=True))


class Store:
    def __init__(self, url: str, *, sqlite_synchronous: str = "FULL", pool_size: int = 5) -> None:
        self.url = url
        self.sqlite = is_sqlite(normalise_url(url))
        self._synchronous = sqlite_synchronous
        self.writer: Engine = make_engine(
            url, writer=True, synchronous=sqlite_synchronous, pool_size=pool_size
        )
        self.reader: Engine = (
            make_engine(url, writer=False, synchronous=sqlite_synchronous, pool_size=2)
            if self.sqlite
            else self.writer
        )

    @contextmanager
    def _bookkeeping(self) -> Iterator[Connection]:
        """A write transaction whose loss in a power cut costs at most a duplicate delivery.

        Only an acknowledged message must survive power loss (synchronous=FULL, an fsync per
        commit). Claims and outcomes may be lost with the last moments before a power cut:
        the delivery is then simply due again. So on SQLite they commit without waiting for
        the disk (synchronous=NORMAL in WAL mode), and the next FULL commit flushes them too.
        A process crash loses nothing either way: committed pages are in the OS cache.
        """
        if not self.sqlite or self._synchronous != "FULL":
            with self.writer.begin() as conn:
                yield conn
            return
        with self.writer.connect() as conn:
            # On the driver connection: SQLAlchemy would open a transaction first, and the
            # safety level cannot change inside one.
            raw = conn.connection.driver_connection
            assert raw is not None
            raw.execute("PRAGMA synchronous=NORMAL")
            try:
                with conn.begin():
                    yield conn
            finally:
                raw.execute("PRAGMA synchronous=FULL")

    def dispose(self) -> None:
        self.writer.dispose()
        if self.reader is not self.writer:
            self.reader.dispose()

    # -- ingestion -----------------------------------------------------------------------

    # Steps of the ingestion transaction, set by the daemon: the suppression check
    # (efd/store/regulations.py), profile capture while audiences or computed traits
    # are configured (efd/personas/capture.py), and lanes while a destination is ordered
    # (efd/rules/lanes.py; efd/store/lanes.py). None: not taken.
    suppressions: Suppressed | None = None
    capture: Capture | None = None
    lanes: Lanes | None = None

    def insert_messages(self, rows: Sequence[NewMessage], now: float) -> list[InsertStatus]:
        """Store messages and their deliveries in one transaction.

        Returns, per row, STORED; DUPLICATE for a messageId the same source already sent
        within 24 hours (or earlier in `rows`): acknowledged but not stored again; or
        SUPPRESSED for a message from a userId or anonymousId a regulation suppressed:
        acknowledged and dropped.
        """
        with self.writer.begin() as conn:
            blocked: set[str] = set()
            if self.suppressions is not None:
                who = {i for r in rows for i in (r.user_id, r.anonymous_id) if i is not None}
                if who:
                    blocked = self.suppressions.suppressed(conn, who)
            keys = [message_key(r.source, r.message_id) for r in rows]
            seen = self._recent_message_ids(conn, keys, now)
            fresh: list[NewMessage] = []
            fresh_keys: list[int] = []
            status: list[InsertStatus] = []
            for row, key in zip(rows, keys, strict=True):
                if blocked and (row.user_id in blocked or row.anonymous_id in blocked):
                    status.append(InsertStatus.SUPPRESSED)
                    continue
                pair = (row.source, row.message_id)
                if pair in seen:
                    status.append(InsertStatus.DUPLICATE)
                    continue
                seen.add(pair)
                fresh.append(row)
                fresh_keys.append(key)
                status.append(InsertStatus.STORED)
            if not fresh:
                return status
            self.insert_with_deliveries(conn, fresh, now, keys=fresh_keys)
            if self.capture is not None:
                self.capture(conn, fresh)
            return status

    def index_recent_messages(self, now: float) -> None:
        """On SQLite, fill the writer's in-memory deduplication index now rather than at the
        first insert (efd/store/dedupe.py). PostgreSQL's is a table index: nothing to do."""
        if self.sqlite:
            with self.writer.begin() as conn:
                dedupe.ensure(conn, now, DEDUPE_WINDOW_SECONDS)

    def insert_with_deliveries(
        self,
        conn: Connection,
        rows: Sequence[NewMessage],
        now: float,
        *,
        keys: Sequence[int] | None = None,
    ) -> list[int]:
        """Insert messages and their pending deliveries in `conn`'s transaction, without
        deduplication; return the messages' ids. Ingestion, regulations and audience syncs
        all store their messages through here. `keys`: the rows' message_key, when the
        caller has them already."""
        if keys is None:
            keys = [message_key(r.source, r.message_id) for r in rows]
        message_tuples = [(*_message_fields(r), k) for r, k in zip(rows, keys, strict=True)]
        if self.sqlite:
            # The hot path of ingestion. Under BEGIN IMMEDIATE this connection is the only
            # writer, so it can number the rows itself, and the driver's executemany (which
            # releases the GIL while SQLite works) replaces SQLAlchemy's per-row processing:
            # about twice the throughput. The statements are compiled from the tables.
            [last] = fastpath.query(conn, "last-id", lambda: select(func.max(messages.c.id)), [])
            first = (last or 0) + 1
            ids: Sequence[int] = range(first, first + len(rows))
        else:
            ids = sorted(
                conn.execute(
                    _PG_INSERT_MESSAGES, pgpath.arrays(_MESSAGE_COLUMNS, message_tuples)
                ).scalars()
            )
        delivery_tuples: list[tuple[Any, ...]]
        if self.lanes is None:
            delivery_tuples = [
                (pk, name, PENDING, 0, now, now, 0, None)
                for pk, r in zip(ids, rows, strict=True)
                for name in r.destinations
            ]
        else:
            # A delivery that joins a lane waits, queued, until admit() below makes it the
            # head of a lane that has none.
            lane_of = self.lanes.lane
            delivery_tuples = [
                (pk, name, PENDING, 0, now, now, 0, None)
                if (lane := lane_of(r, name)) is None
                else (pk, name, QUEUED, 0, now, None, 0, lane)
                for pk, r in zip(ids, rows, strict=True)
                for name in r.destinations
            ]
        if self.sqlite:
            dedupe.ensure(conn, now, DEDUPE_WINDOW_SECONDS)
            with fastpath.driver_cursor(conn) as cursor:
                fastpath.insert_many(
                    cursor,
                    messages,
                    ("id", *_MESSAGE_COLUMNS),
                    [(pk, *t) for pk, t in zip(ids, message_tuples, strict=True)],
                )
                # OR IGNORE: a key may remain from a deleted message whose id is reused.
                fastpath.insert_many(
                    cursor,
                    dedupe.recent,
                    ("message_key", "message_pk"),
                    list(zip(keys, ids, strict=True)),
                    or_ignore=True,
                )
                if delivery_tuples:
                    fastpath.insert_many(cursor, deliveries, _DELIVERY_FIELDS, delivery_tuples)
        elif delivery_tuples:
            conn.execute(_PG_INSERT_DELIVERIES, pgpath.arrays(_DELIVERY_FIELDS, delivery_tuples))
        if self.lanes is not None and any(t[7] is not None for t in delivery_tuples):
            insert = insert_for(self.sqlite)
            span = (min(ids), max(ids))
            lanes.admit(conn, insert, now, messages=span, lock=not self.sqlite, notify=False)
        if delivery_tuples and not self.sqlite:
            # Delivered at commit, to every process's LISTEN: none waits for a poll.
            conn.execute(text("SELECT pg_notify(:channel, '')"), {"channel": NOTIFY_CHANNEL})
        return list(ids)

    def _recent_message_ids(
        self, conn: Connection, keys: Sequence[int], now: float
    ) -> set[tuple[str, str]]:
        """(source, messageId) of the messages received in the 24 hours before `now` whose
        key is in `keys`. The caller compares these pairs, not the keys: a colliding key
        finds a pair that matches nothing."""
        since = now - DEDUPE_WINDOW_SECONDS
        if not self.sqlite:
            rows = conn.execute(
                pgpath.RECENT_BY_KEY, {"r_keys": sorted(set(keys)), "r_since": since}
            )
            return {(source, message_id) for source, message_id in rows}
        seen: set[tuple[str, str]] = set()
        dedupe.ensure(conn, now, DEDUPE_WINDOW_SECONDS)
        for chunk in _chunks(sorted(set(keys))):

            def query(chunk: Sequence[int] = chunk) -> Any:
                # The writer's in-memory index (efd/store/dedupe.py).
                return (
                    select(messages.c.source, messages.c.message_id)
                    .select_from(
                        dedupe.recent.join(messages, messages.c.id == dedupe.recent.c.message_pk)
                    )
                    .where(
                        dedupe.recent.c.message_key.in_(chunk),
                        messages.c.received_at > since,
                    )
                )

            # Compiled once per chunk size; SQLAlchemy's expanding IN costs more than the
            # query itself at ingestion rates.
            found = fastpath.query(conn, "recent", query, [*chunk, since])
            seen.update((source, message_id) for source, message_id in found)
        return seen

    # -- delivery ------------------------------------------------------------------------

    def claim(
        self,
        destination: str,
        limit: int,
        *,
        owner: str,
        now: float,
        lease_until: float,
        due_by: float | None = None,
    ) -> list[Claimed]:
        """Lease up to `limit` deliveries of one destination due by `due_by` (default
        `now`), oldest first, never one under another claimer's live lease.

        The lease moves next_attempt_at to `lease_until` and bumps the fencing token;
        FOR UPDATE SKIP LOCKED (PostgreSQL) keeps concurrent claimers off each other's rows.
        """
        params = {
            "c_destination": destination,
            "c_now": now,
            "c_due_by": now if due_by is None else due_by,
            "c_limit": limit,
            "c_owner": owner,
            "c_until": lease_until,
        }
        with self._bookkeeping() as conn:
            claimed = self._run(conn, "claim", _CLAIM, [params])
            if not claimed:
                return []
            bodies: dict[int, tuple[str, str | None, str, float]] = {}
            pks = [row[2] for row in claimed]
            for chunk in _chunks(pks):

                def query(chunk: Sequence[int] = chunk) -> Any:
                    return select(
                        messages.c.id,
                        messages.c.message_id,
                        messages.c.body,
                        messages.c.source,
                        messages.c.received_at,
                    ).where(messages.c.id.in_(chunk))

                rows = (
                    fastpath.query(conn, "bodies", query, list(chunk))
                    if self.sqlite
                    else conn.execute(query()).all()
                )
                for pk, message_id, body, source, received_at in rows:
                    bodies[pk] = (message_id, body, source, received_at)
        result = [
            Claimed(
                delivery_id=delivery_id,
                lease_token=token,
                destination=destination,
                attempts=attempts_so_far,
                first_attempt_at=first,
                failed_hooks=frozenset(json.loads(failed)) if failed else frozenset(),
                message_id=bodies[pk][0],
                body=bodies[pk][1],
                message_pk=pk,
                source=bodies[pk][2],
                received_at=bodies[pk][3],
            )
            for delivery_id, token, pk, attempts_so_far, first, failed in claimed
        ]
        result.sort(key=lambda c: c.delivery_id)
        return result

    def record(self, outcomes: Sequence[Outcome], attempt_rows: Sequence[AttemptRow]) -> int:
        """Write attempt rows and new delivery states; return how many states were stale.

        An outcome whose token no longer matches (the lease expired and another worker
        claimed the delivery) changes nothing; its attempts are still logged, since the
        requests did happen.
        """
        with self._bookkeeping() as conn:
            if attempt_rows and not self.sqlite:
                rows = [_attempt_fields(a) for a in attempt_rows]
                conn.execute(_PG_INSERT_ATTEMPTS, pgpath.arrays(_ATTEMPT_FIELDS, rows))
            elif attempt_rows:
                self._run(
                    conn, "attempts", _INSERT_ATTEMPT, [_attempt_params(a) for a in attempt_rows]
                )
            if not outcomes:
                return 0
            if not self.sqlite:
                applied = pgpath.record_outcomes(conn, outcomes)
                self._advance_lanes(conn, outcomes)
                return len(outcomes) - applied
            applied = self._run_count(
                conn,
                "outcome",
                _RECORD_OUTCOME,
                [
                    {
                        "o_id": o.delivery_id,
                        "o_token": o.lease_token,
                        "o_status": o.status,
                        "o_attempts": o.attempts,
                        "o_first": o.first_attempt_at,
                        "o_next": o.next_attempt_at,
                        "o_finished": o.finished_at,
                        "o_failed": json.dumps(sorted(o.failed_hooks)) if o.failed_hooks else None,
                        "o_error": o.last_error,
                    }
                    for o in outcomes
                ],
            )
            self._advance_lanes(conn, outcomes)
        return len(outcomes) - applied

    def _advance_lanes(self, conn: Connection, outcomes: Sequence[Outcome]) -> None:
        """The heads among these outcomes that finished hand their lanes on, in the same
        transaction (efd/store/lanes.py). A stale outcome finished nothing: its delivery is
        still pending, so its lane stays."""
        if self.lanes is None:
            return
        finished = [o for o in outcomes if o.status is not PENDING]
        if finished:
            now = max(o.finished_at or o.first_attempt_at for o in finished)
            heads = [o.delivery_id for o in finished]
            several = not self.sqlite
            lanes.advance(conn, now, heads=heads, lock=several, notify=several)

    def _run(
        self, conn: Connection, key: str, statement: Any, params: list[dict[str, Any]]
    ) -> list[tuple[Any, ...]]:
        """Execute a statement with named parameters; return its rows, if it has any.

        On SQLite through the driver, with the statement compiled once: at delivery rates
        SQLAlchemy's per-execution processing costs more than SQLite's own work.
        """
        if not self.sqlite:
            result = conn.execute(statement, params if len(params) != 1 else params[0])
            return [tuple(row) for row in result.all()] if result.returns_rows else []
        sql, order, fixed = fastpath.compiled((key,), lambda: statement)
        with fastpath.driver_cursor(conn) as cursor:
            if len(params) == 1:
                return list(cursor.execute(sql, fastpath.positional(params[0], order, fixed)))
            cursor.executemany(sql, [fastpath.positional(p, order, fixed) for p in params])
            return []

    def _run_count(
        self, conn: Connection, key: str, statement: Any, params: list[dict[str, Any]]
    ) -> int:
        """Execute with many parameter sets; return how many rows changed."""
        if not self.sqlite:
            return int(conn.execute(statement, params).rowcount)
        sql, order, fixed = fastpath.compiled((key,), lambda: statement)
        with fastpath.driver_cursor(conn) as cursor:
            cursor.executemany(sql, [fastpath.positional(p, order, fixed) for p in params])
            return int(cursor.rowcount)

    def release(self, leases: Sequence[tuple[int, int]], now: float) -> None:
        """Give back claimed deliveries that were never sent (shutdown): due again now."""
        if not leases:
            return
        with self.writer.begin() as conn:
            conn.execute(
                update(deliveries)
                .where(
                    deliveries.c.id == bindparam("b_id"),
                    deliveries.c.lease_token == bindparam("b_token"),
                    deliveries.c.status == PENDING,
                )
                .values(next_attempt_at=now, lease_owner=None),
                [{"b_id": d, "b_token": t} for d, t in leases],
            )

    def release_all_leases(self, now: float) -> int:
        """Make every leased delivery due now. Only safe when no other process is running
        (SQLite, where efd holds an exclusive lock on the database file)."""
        with self.writer.begin() as conn:
            result = conn.execute(
                update(deliveries)
                .where(deliveries.c.status == PENDING, deliveries.c.lease_owner.is_not(None))
                .values(next_attempt_at=now, lease_owner=None)
            )
            return result.rowcount

    def wake(self, destination: str, hook: Sequence[str], now: float) -> int:
        """Make due at `now` the destination's pending deliveries that are not leased and
        whose failed_hooks (a JSON list of strings) holds none of `hook`'s forms: the hook
        has not failed for good for them."""
        needles = []
        for form in hook:
            needle = json.dumps(form)
            for char in ("\\", "%", "_"):
                needle = needle.replace(char, "\\" + char)
            needles.append(needle)
        with self.writer.begin() as conn:
            result = conn.execute(
                update(deliveries)
                .where(
                    deliveries.c.destination == destination,
                    deliveries.c.status == PENDING,
                    deliveries.c.lease_owner.is_(None),
                    deliveries.c.next_attempt_at > now,
                    or_(
                        deliveries.c.failed_hooks.is_(None),
                        and_(
                            *(
                                deliveries.c.failed_hooks.not_like(f"%{needle}%", escape="\\")
                                for needle in needles
                            )
                        ),
                    ),
                )
                .values(next_attempt_at=now)
            )
            return result.rowcount

    def expire_waiting(self, destination: str, window: float, now: float) -> int:
        """Expire the destination's pending deliveries, not leased, whose retry window has
        closed: counted from the first attempt, or from creation if never attempted. Those
        waiting in lanes too; the lanes of expired heads move on."""
        with self.writer.begin() as conn:
            waiting = lanes.expire_waiting(conn, destination, window, now)
            result = conn.execute(
                update(deliveries)
                .where(
                    deliveries.c.destination == destination,
                    deliveries.c.status == PENDING,
                    deliveries.c.lease_owner.is_(None),
                    func.coalesce(deliveries.c.first_attempt_at, deliveries.c.created_at)
                    <= now - window,
                )
                .values(
                    status=DeliveryStatus.EXPIRED,
                    finished_at=now,
                    next_attempt_at=None,
                    last_error="retry window closed while every hook's circuit was open",
                )
            )
            if result.rowcount:
                several = not self.sqlite
                lanes.advance(conn, now, destination=destination, lock=several, notify=several)
            return int(result.rowcount) + waiting

    def autovacuum_off(self) -> bool:
        """Whether the PostgreSQL server runs with autovacuum off (never on SQLite)."""
        if self.sqlite:
            return False
        with self.reader.connect() as conn:
            return conn.execute(text("SHOW autovacuum")).scalar() == "off"

    def next_due(self, destination: str) -> float | None:
        with self.reader.connect() as conn:
            value = conn.execute(
                select(func.min(deliveries.c.next_attempt_at)).where(
                    deliveries.c.destination == destination, deliveries.c.status == PENDING
                )
            ).scalar()
            return float(value) if value is not None else None

    def listen(self, on_notify: Callable[[], None], stopping: Callable[[], bool]) -> None:
        """Block, calling `on_notify` for each NOTIFY on the channel, until `stopping()`.

        PostgreSQL only. Reconnects by itself; while disconnected, polling covers the gap.
        """
        conninfo = (
            normalise_url(self.url)
            .set(drivername="postgresql")
            .render_as_string(hide_password=False)
        )
        delay = 0.5
        while not stopping():
            try:
                with psycopg.connect(conninfo, autocommit=True, connect_timeout=5) as conn:
                    conn.execute(f"LISTEN {NOTIFY_CHANNEL}")
                    delay = 0.5
                    on_notify()  # anything stored while we were not listening
                    while not stopping():
                        for _ in conn.notifies(timeout=0.5, stop_after=1000):
                            on_notify()
            except psycopg.Error:
                if stopping():
                    return
                time.sleep(delay)
                delay = min(delay * 2, 10.0)

    # -- observation and housekeeping --------------------------------------------------------

    def claim_job(self, name: str, *, interval: float, owner: str, now: float) -> bool:
        """True when this process should run the periodic job `name` now: it is due and no
        other process took this turn. Works the same on SQLite and PostgreSQL."""
        upsert = (sqlite_insert if self.sqlite else pg_insert)(jobs).values(
            name=name, last_run_at=0.0, owner=None
        )
        with self.writer.begin() as conn:
            conn.execute(upsert.on_conflict_do_nothing(index_elements=["name"]))
            result = conn.execute(
                update(jobs)
                .where(jobs.c.name == name, jobs.c.last_run_at <= now - interval * 0.9)
                .values(last_run_at=now, owner=owner)
            )
            return result.rowcount == 1

    def ping(self) -> None:
        with self.reader.connect() as conn:
            conn.execute(text("SELECT 1"))

    def write_probe(self, owner: str, now: float) -> None:
        """A small real write and commit, for readiness: the `readiness` row of jobs notes
        which process wrote last, and when."""
        insert = (sqlite_insert if self.sqlite else pg_insert)(jobs).values(
            name=READINESS_ROW, last_run_at=now, owner=owner
        )
        with self.writer.begin() as conn:
            conn.execute(
                insert.on_conflict_do_update(
                    index_elements=["name"], set_={"last_run_at": now, "owner": owner}
                )
            )

    def backlog(self) -> dict[str, int]:
        """Pending deliveries per destination (including those in flight, and those waiting
        in lanes)."""
        with self.reader.connect() as conn:
            rows = conn.execute(
                select(deliveries.c.destination, func.count())
                .where(deliveries.c.status.in_(OPEN))
                .group_by(deliveries.c.destination)
            ).all()
        return {destination: count for destination, count in rows}

    def purge_finished(self, before: float, limit: int) -> int:
        """Delete up to `limit` messages all of whose deliveries finished before `before`,
        and those that never had a delivery, with their deliveries and attempts."""
        unfinished = (
            select(deliveries.c.id)
            .where(
                deliveries.c.message_pk == messages.c.id,
                or_(deliveries.c.status.in_(OPEN), deliveries.c.finished_at >= before),
            )
            .exists()
        )
        with self.writer.begin() as conn:
            ids = (
                conn.execute(
                    select(messages.c.id)
                    .where(messages.c.received_at < before, ~unfinished)
                    .order_by(messages.c.id)
                    .limit(limit)
                )
                .scalars()
                .all()
            )
            if not ids:
                return 0
            delivery_ids = select(deliveries.c.id).where(deliveries.c.message_pk.in_(ids))
            conn.execute(delete(attempts).where(attempts.c.delivery_id.in_(delivery_ids)))
            conn.execute(delete(deliveries).where(deliveries.c.message_pk.in_(ids)))
            conn.execute(delete(messages).where(messages.c.id.in_(ids)))
            return len(ids)
