"""PostgreSQL's array path: statements whose rows go as one array per column.

Each statement's text is the same for any number of rows, so the driver and the server parse
and plan it once; a multi-row VALUES list (an executemany) is a new, long text for every batch
size. The queue (efd/store/queue.py) builds its PostgreSQL inserts from here, as it builds its
SQLite statements from efd/store/fastpath.py.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

from sqlalchemy import Connection, text

from efd.rows import Outcome

# PostgreSQL's deduplication lookup: one index probe per key. As `message_key IN (...) AND
# received_at > ...` the planner seq-scans `messages` whenever its statistics are missing or
# stale (a fresh database, a restore, autovacuum off). Through LATERAL it plans one index
# probe per key even without statistics; OFFSET 0 keeps the subquery from being flattened
# into a join the planner could turn back into a scan.
RECENT_BY_KEY = text(
    "SELECT m.source, m.message_id"
    " FROM unnest(CAST(:r_keys AS BIGINT[])) AS k(key)"
    " CROSS JOIN LATERAL (SELECT source, message_id FROM messages"
    " WHERE message_key = k.key AND received_at > :r_since OFFSET 0) AS m"
)


# PostgreSQL's inserts of ingestion: one array per column, so the statement's text is the
# same for any number of rows. A multi-row VALUES list is a new, long text per batch size,
# which the driver parses again on every execution (it caches only short queries) and the
# server never gets to prepare. ORDER BY the ordinality makes the sequence hand out ids in
# the rows' order, so the returned ids, sorted, line up with the rows.
TYPES = {
    "source": "TEXT",
    "message_id": "TEXT",
    "type": "TEXT",
    "user_id": "TEXT",
    "anonymous_id": "TEXT",
    "event": "TEXT",
    "timestamp": "DOUBLE PRECISION",
    "received_at": "DOUBLE PRECISION",
    "body": "TEXT",
    "original_timestamp": "DOUBLE PRECISION",
    "message_key": "BIGINT",
    "message_pk": "BIGINT",
    "destination": "TEXT",
    "status": "TEXT",
    "attempts": "INTEGER",
    "created_at": "DOUBLE PRECISION",
    "next_attempt_at": "DOUBLE PRECISION",
    "lease_token": "INTEGER",
    "lane": "TEXT",
    "delivery_id": "BIGINT",
    "hook_url": "TEXT",
    "attempted_at": "DOUBLE PRECISION",
    "duration_ms": "DOUBLE PRECISION",
    "outcome": "TEXT",
    "status_code": "INTEGER",
    "error_class": "TEXT",
    "error": "TEXT",
    "response_head": "TEXT",
}


def unnest_insert(table: str, columns: Sequence[str], *, returning: bool) -> Any:
    # `body` goes as one JSON array: the driver escapes the quotes of every body in a text
    # array element by element in Python, the json module does it in C.
    arrays = [c for c in columns if c != "body"]
    unnest = ", ".join(f"CAST(:a_{c} AS {TYPES[c]}[])" for c in arrays)
    source = f"unnest({unnest}) WITH ORDINALITY AS r({', '.join(arrays)}, n)"
    if "body" in columns:
        source += (
            " JOIN json_array_elements_text(CAST(:a_body AS JSON)) WITH ORDINALITY"
            " AS b(body, n) USING (n)"
        )
    names = ", ".join(columns)
    return text(
        f"INSERT INTO {table} ({names}) SELECT {names} FROM {source} ORDER BY n"
        + (" RETURNING id" if returning else "")
    )


def arrays(columns: Sequence[str], rows: Sequence[tuple[Any, ...]]) -> dict[str, Any]:
    params: dict[str, Any] = {f"a_{c}": [row[i] for row in rows] for i, c in enumerate(columns)}
    if "a_body" in params:
        params["a_body"] = json.dumps(params["a_body"], ensure_ascii=False)
    return params


# PostgreSQL's outcome UPDATE: one statement for the whole batch, its rows as arrays. As one
# UPDATE a row (an executemany), each row is a statement of its own the server parses, plans
# and runs, and the driver sends and reads back. The WHERE is the per-row statement's: the
# id, the fencing token and `pending`, so a stale outcome matches nothing and is counted.
# Two things keep the plan an index probe by primary key whatever the statistics:
# `d.id = ANY(ids)`, without which the join, planned generically (unnest assumed to give ten
# rows), hashes every delivery; and `pending` coming from the arrays side as `u.was`: as a
# constant it lets the planner add a scan of the whole partial due index to the probe.
_RECORD_OUTCOMES = text(
    "UPDATE deliveries AS d SET status = u.status, attempts = u.attempts,"
    " first_attempt_at = u.first_at, next_attempt_at = u.next_at, finished_at = u.finished_at,"
    " failed_hooks = u.failed, last_error = u.error, lease_owner = NULL"
    " FROM unnest(CAST(:a_id AS BIGINT[]), CAST(:a_token AS INTEGER[]),"
    " CAST(:a_status AS TEXT[]), CAST(:a_attempts AS INTEGER[]),"
    " CAST(:a_first AS DOUBLE PRECISION[]), CAST(:a_next AS DOUBLE PRECISION[]),"
    " CAST(:a_finished AS DOUBLE PRECISION[]), CAST(:a_failed AS TEXT[]),"
    " CAST(:a_error AS TEXT[]),"
    " array_fill(CAST('pending' AS TEXT), ARRAY[cardinality(CAST(:a_id AS BIGINT[]))]))"
    " AS u(id, token, status, attempts, first_at, next_at, finished_at, failed, error, was)"
    " WHERE d.id = ANY(CAST(:a_id AS BIGINT[])) AND d.id = u.id AND d.lease_token = u.token"
    " AND d.status = u.was"
)


def record_outcomes(conn: Connection, outcomes: Sequence[Outcome]) -> int:
    """Apply the outcomes in one UPDATE; return how many rows it changed."""
    params = {
        "a_id": [o.delivery_id for o in outcomes],
        "a_token": [o.lease_token for o in outcomes],
        "a_status": [str(o.status) for o in outcomes],
        "a_attempts": [o.attempts for o in outcomes],
        "a_first": [o.first_attempt_at for o in outcomes],
        "a_next": [o.next_attempt_at for o in outcomes],
        "a_finished": [o.finished_at for o in outcomes],
        "a_failed": [
            json.dumps(sorted(o.failed_hooks)) if o.failed_hooks else None for o in outcomes
        ],
        "a_error": [o.last_error for o in outcomes],
    }
    return int(conn.execute(_RECORD_OUTCOMES, params).rowcount)
