"""The writer's CPU per recorded outcome on SQLite: `DeliveryQueue.record` for rounds of one
attempt each, in batches as the dispatcher's recorder writes them.

    .venv/bin/python bench/experiments/record_outcomes.py [batches] [batch size]

Messages are ingested and claimed first (not measured); then each batch of outcomes, half
delivered and half due again, is recorded with its attempt rows, and the thread's CPU time
over all batches is divided by the outcomes recorded. Run it from two trees alternately
(A B A B) to compare their store code.
"""

from __future__ import annotations

import sys
import tempfile
import time
from pathlib import Path

from efd.records import AttemptRow, Claimed, ClaimRequest, DeliveryStatus, NewMessage, Outcome
from efd.store import Store, migrate


def main() -> None:
    batches = int(sys.argv[1]) if len(sys.argv) > 1 else 100
    size = int(sys.argv[2]) if len(sys.argv) > 2 else 200
    total = batches * size
    with tempfile.TemporaryDirectory() as directory:
        url = f"sqlite:///{Path(directory) / 'efd.db'}"
        migrate.upgrade(url)
        store = Store(url, synchronous="NORMAL")
        now = time.time()
        for start in range(0, total, 1000):
            rows = [
                NewMessage(
                    source="web",
                    message_id=f"m{n}",
                    type="track",
                    user_id=f"u{n % 97}",
                    anonymous_id=None,
                    event="Order Completed",
                    timestamp=now,
                    received_at=now,
                    body='{"type":"track","event":"Order Completed"}',
                    destinations=("hooks",),
                )
                for n in range(start, min(start + 1000, total))
            ]
            store.ingestion.insert_messages(rows, now)
        claimed: list[Claimed] = []
        while len(claimed) < total:
            got = store.queue.claim(
                ClaimRequest("hooks", 500, owner="bench", now=now, lease_until=now + 60)
            )
            if not got:
                break
            claimed.extend(got)
        outcomes, attempts = [], []
        for n, item in enumerate(claimed):
            delivered = n % 2 == 0
            outcomes.append(
                Outcome(
                    delivery_id=item.delivery_id,
                    lease_token=item.lease_token,
                    status=DeliveryStatus.DELIVERED if delivered else DeliveryStatus.PENDING,
                    attempts=1,
                    first_attempt_at=now,
                    next_attempt_at=None if delivered else now + 30,
                    finished_at=now if delivered else None,
                    failed_hooks=frozenset(),
                    last_error=None if delivered else "HTTP 503",
                )
            )
            attempts.append(
                AttemptRow(
                    delivery_id=item.delivery_id,
                    hook_url="https://hooks.example/1",
                    attempted_at=now,
                    duration_ms=3.25,
                    outcome="success" if delivered else "retry",
                    status_code=200 if delivered else 503,
                    error_class=None if delivered else "http_status",
                    error=None,
                    response_head=None if delivered else "HTTP/1.1 503",
                )
            )
        cpu = time.thread_time()
        stale = 0
        for start in range(0, len(outcomes), size):
            stale += store.queue.record(
                outcomes[start : start + size], attempts[start : start + size]
            )
        cpu = time.thread_time() - cpu
        store.dispose()
    print(
        f"{len(outcomes)} outcomes in batches of {size}: "
        f"{cpu / max(len(outcomes), 1) * 1e6:.2f} µs of CPU each, {stale} stale"
    )


if __name__ == "__main__":
    main()
