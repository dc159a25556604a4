"""One sync over 100,000 profiles: seconds and rows read.

Seeds a temporary SQLite file through efd's own store code (the same capture that
ingestion runs: identify traits, then track and page events), then times syncs of the
issue's example audience and computed trait:

    .venv/bin/python bench/personas.py [--profiles 100000] [--keep PATH]

A first sync sends every member (or value) and stores it; a second sync right after
finds no change, which is what a steady-state sync costs.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import tempfile
import time
from pathlib import Path

from sqlalchemy import func, select

from efd.personas.capture import Capture
from efd.personas.sync import Computation, run_sync
from efd.records import NewMessage
from efd.store import Store, migrate
from efd.store.computations import ComputationsStore
from efd.store.profiles import ProfilesStore
from efd.store.runner import AsyncStore
from efd.store.schema import events, profiles
from efd.store.suppressions import Suppressions

AUDIENCE = (
    "event('Order Completed').where(property('revenue') >= 100).within(30 days).count() >= 3"
    " and trait('plan') = 'pro'"
)
TRAIT = "event('Order Completed').within(180 days).sum('revenue')"
DAY = 86400.0


def seed(store: Store, count: int, now: float, rng: random.Random) -> None:
    capture = Capture(ProfilesStore(store))
    batch: list[NewMessage] = []

    def add(type_: str, user: str, timestamp: float, body: dict[str, object]) -> None:
        body = {"type": type_, "userId": user, **body}
        event = body.get("event")
        assert event is None or isinstance(event, str)
        batch.append(
            NewMessage(
                source="bench",
                message_id=f"{len(batch)}",
                type=type_,
                user_id=user,
                anonymous_id=None,
                event=event,
                timestamp=timestamp,
                received_at=now,
                body=json.dumps(body),
                destinations=(),
            )
        )

    def flush() -> None:
        with store.database.writer.begin() as conn:
            capture(conn, batch)
        batch.clear()

    for i in range(count):
        user = f"user-{i:07d}"
        add(
            "identify",
            user,
            now - 90 * DAY,
            {
                "traits": {
                    "plan": "pro" if rng.random() < 0.3 else "free",
                    "email": f"{user}@example.com",
                    "name": f"User {i}",
                    "city": rng.choice(["Paris", "Lyon", "Berlin", "Oslo"]),
                }
            },
        )
        for _ in range(rng.randrange(0, 9)):
            add(
                "track",
                user,
                now - rng.random() * 60 * DAY,
                {
                    "event": "Order Completed",
                    "properties": {"revenue": rng.randrange(20, 300), "currency": "EUR"},
                },
            )
        for _ in range(rng.randrange(0, 3)):
            add("page", user, now - rng.random() * 60 * DAY, {"properties": {"path": "/"}})
        if len(batch) >= 5000:
            flush()
    flush()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--profiles", type=int, default=100_000)
    parser.add_argument("--keep", help="use (and keep) this SQLite file instead of a temp one")
    args = parser.parse_args()

    with tempfile.TemporaryDirectory() as tmp:
        path = Path(args.keep) if args.keep else Path(tmp) / "bench.db"
        url = f"sqlite:///{path}"
        migrate.upgrade(url)
        store = Store(url, synchronous="NORMAL")
        now = time.time()
        started = time.perf_counter()
        seed(store, args.profiles, now, random.Random(7))
        with store.database.reader.connect() as conn:
            n_profiles = conn.execute(select(func.count()).select_from(profiles)).scalar_one()
            n_events = conn.execute(select(func.count()).select_from(events)).scalar_one()
        print(
            f"seeded {n_profiles} profiles and {n_events} events through the capture path "
            f"in {time.perf_counter() - started:.1f} s"
        )
        db = AsyncStore(store)
        computations = ComputationsStore(store, Suppressions(store))
        for kind, name, text in (
            ("audience", "High Value Customers", AUDIENCE),
            ("trait", "total_revenue_180_days", TRAIT),
        ):
            computation = Computation(kind, name, text, ("crm",))
            for label in ("first sync", "next sync (no change)"):
                result = asyncio.run(run_sync(db, computations, computation, now))
                print(
                    f"{kind:8} {label:22} {result.seconds:6.2f} s  "
                    f"rows read {result.rows_read:>9,}  profiles {result.evaluated:>7,}  "
                    f"identify sent {result.sent:>7,}"
                )
        db.close()


if __name__ == "__main__":
    main()
