"""Profiles: identify traits, identity links and events, captured in the ingestion
transaction, on real SQLite files and real PostgreSQL databases."""

from __future__ import annotations

import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

import pytest
from pydantic import SecretStr
from sqlalchemy import Connection

from efd.config import SourceConfig
from efd.personas.capture import Capture
from efd.records import InsertStatus, NewMessage
from efd.segment.messages import normalise
from efd.segment.payload import message_row
from efd.store import Steps, Store, migrate
from efd.store.profiles import ProfilesStore
from efd.store.regulations import RegulationsStore
from efd.store.suppressions import Suppressions
from tests.conftest import sql

WEB = SourceConfig(name="web", write_key=SecretStr("k"), destinations=["d"])


class Configured:
    """The steps the daemon gives its store while audiences or traits are configured,
    once the parts they use exist; none before."""

    def __init__(self) -> None:
        self.steps = Steps()

    def __call__(self) -> Steps:
        return self.steps


@pytest.fixture
def configured() -> Configured:
    return Configured()


@pytest.fixture
def store(db_url: str, configured: Configured) -> Iterator[Store]:
    migrate.upgrade(db_url)
    s = Store(db_url, steps=configured)
    yield s
    s.dispose()


@dataclass
class Stores:
    profiles: ProfilesStore
    regulations: RegulationsStore


@pytest.fixture
def stores(store: Store, configured: Configured) -> Stores:
    """The store as the daemon sets it up while audiences or traits are configured."""
    suppressions = Suppressions(store)
    profiles = ProfilesStore(store)
    configured.steps = Steps(suppressions=suppressions, capture=Capture(profiles))
    return Stores(profiles, RegulationsStore(store, suppressions))


def iso(t: float) -> str:
    return datetime.fromtimestamp(t, UTC).isoformat()


def row(raw: dict[str, Any]) -> NewMessage:
    """A message as ingestion would store it."""
    received = datetime.now(UTC)
    return message_row(WEB, normalise(raw, received_at=received), received, False)


def ingest(store: Store, *raws: dict[str, Any]) -> list[InsertStatus]:
    return store.ingestion.insert_messages([row(r) for r in raws], time.time())


def event_rows(db_url: str) -> list[tuple[str, str]]:
    return sql(db_url, "SELECT identity, name FROM events ORDER BY id")


def test_identify_traits_merge_and_the_later_message_wins(
    store: Store, stores: Stores, db_url: str
) -> None:
    t = time.time() - 1000
    ingest(
        store,
        {
            "type": "identify",
            "userId": "u1",
            "traits": {"plan": "free", "age": 30},
            "timestamp": iso(t),
        },
    )
    ingest(
        store,
        {"type": "identify", "userId": "u1", "traits": {"plan": "pro"}, "timestamp": iso(t + 10)},
    )
    assert stores.profiles.profile("u1") == ("u1", "user", {"plan": "pro", "age": 30})
    # An older message arriving late does not undo the newer value, but adds new traits.
    ingest(
        store,
        {
            "type": "identify",
            "userId": "u1",
            "traits": {"plan": "basic", "city": "Oslo"},
            "timestamp": iso(t + 5),
        },
    )
    expected = ("u1", "user", {"plan": "pro", "age": 30, "city": "Oslo"})
    assert stores.profiles.profile("u1") == expected
    # Same timestamp: the later arrival wins.
    ingest(
        store,
        {"type": "identify", "userId": "u1", "traits": {"plan": "team"}, "timestamp": iso(t + 10)},
    )
    profile = stores.profiles.profile("u1")
    assert profile is not None
    assert profile[2]["plan"] == "team"
    # Within one batch, in order.
    ingest(
        store,
        {"type": "identify", "userId": "u2", "traits": {"plan": "a"}, "timestamp": iso(t)},
        {"type": "identify", "userId": "u2", "traits": {"plan": "b"}, "timestamp": iso(t)},
    )
    assert stores.profiles.profile("u2") == ("u2", "user", {"plan": "b"})


def test_anonymous_activity_joins_the_user_once_identified(
    store: Store, stores: Stores, db_url: str
) -> None:
    ingest(
        store,
        {"type": "track", "anonymousId": "a1", "event": "Viewed Item", "properties": {"sku": 1}},
        {"type": "page", "anonymousId": "a1", "name": "Pricing"},
        {"type": "identify", "anonymousId": "a1", "traits": {"utm": "ads"}},
    )
    assert stores.profiles.profile("a1") == ("a1", "anonymous", {"utm": "ads"})
    ingest(
        store, {"type": "identify", "userId": "u1", "anonymousId": "a1", "traits": {"plan": "pro"}}
    )
    assert stores.profiles.profile("u1") == ("u1", "user", {"utm": "ads", "plan": "pro"})
    assert stores.profiles.profile("a1") == ("u1", "user", {"utm": "ads", "plan": "pro"})
    assert sql(db_url, "SELECT id FROM profiles") == [("u1",)]
    assert sql(db_url, "SELECT alias_id, canonical_id FROM identities") == [("a1", "u1")]
    # Later anonymous-only messages on that device belong to the user too.
    ingest(store, {"type": "screen", "anonymousId": "a1", "name": "Home"})
    assert event_rows(db_url) == [
        ("u1", "Viewed Item"),
        ("u1", "Page Viewed"),
        ("u1", "Screen Viewed"),
    ]
    assert sql(db_url, "SELECT properties FROM events WHERE name = 'Screen Viewed'") == [
        ('{"name":"Home"}',)
    ]
    assert sql(db_url, "SELECT properties FROM events WHERE name = 'Page Viewed'") == [
        ('{"name":"Pricing"}',)
    ]


def test_an_anonymous_id_already_linked_to_a_user_is_not_merged_into_another(
    store: Store, stores: Stores, db_url: str
) -> None:
    ingest(store, {"type": "identify", "userId": "u1", "anonymousId": "shared", "traits": {"n": 1}})
    ingest(store, {"type": "identify", "userId": "u2", "anonymousId": "shared", "traits": {"n": 2}})
    assert stores.profiles.profile("u1") == ("u1", "user", {"n": 1})
    assert stores.profiles.profile("u2") == ("u2", "user", {"n": 2})
    assert stores.profiles.resolve("shared") == "u1"


def test_alias_joins_the_previous_identity_to_the_new_one(
    store: Store, stores: Stores, db_url: str
) -> None:
    t = time.time() - 100
    ingest(
        store,
        {
            "type": "identify",
            "userId": "old",
            "traits": {"plan": "free", "x": 1},
            "timestamp": iso(t),
        },
        {"type": "track", "userId": "old", "event": "Order Completed"},
        {"type": "identify", "userId": "new", "traits": {"plan": "pro"}, "timestamp": iso(t + 1)},
    )
    ingest(store, {"type": "alias", "userId": "new", "previousId": "old"})
    assert stores.profiles.profile("new") == ("new", "user", {"plan": "pro", "x": 1})
    assert stores.profiles.resolve("old") == "new"
    assert sql(db_url, "SELECT id FROM profiles") == [("new",)]
    assert event_rows(db_url) == [("new", "Order Completed")]
    # Messages under the previous id land on the joined profile.
    ingest(store, {"type": "track", "userId": "old", "event": "Signed In"})
    assert event_rows(db_url)[-1] == ("new", "Signed In")
    # A further alias moves every link along: links stay flat.
    ingest(store, {"type": "alias", "userId": "newest", "previousId": "new"})
    assert sql(db_url, "SELECT alias_id, canonical_id FROM identities ORDER BY alias_id") == [
        ("new", "newest"),
        ("old", "newest"),
    ]
    assert stores.profiles.profile("old") == ("newest", "user", {"plan": "pro", "x": 1})
    # An alias from an id never seen just links it.
    ingest(store, {"type": "alias", "userId": "newest", "previousId": "never-seen"})
    assert stores.profiles.resolve("never-seen") == "newest"


def test_alias_in_the_same_batch_as_the_activity(store: Store, stores: Stores, db_url: str) -> None:
    ingest(
        store,
        {"type": "track", "anonymousId": "a9", "event": "E"},
        {"type": "alias", "userId": "u9", "previousId": "a9"},
        {"type": "track", "anonymousId": "a9", "event": "F"},
    )
    assert event_rows(db_url) == [("u9", "E"), ("u9", "F")]
    assert sql(db_url, "SELECT id, kind FROM profiles") == [("u9", "user")]


def test_nothing_is_captured_when_no_audience_or_trait_is_configured(
    store: Store, db_url: str
) -> None:
    ingest(
        store,
        {"type": "identify", "userId": "u1", "anonymousId": "a1", "traits": {"plan": "pro"}},
        {"type": "track", "userId": "u1", "event": "E"},
    )
    assert sql(db_url, "SELECT count(*) FROM messages") == [(2,)]
    for table in ("profiles", "identities", "events"):
        assert sql(db_url, f"SELECT count(*) FROM {table}") == [(0,)]


def test_capture_shares_the_ingestion_transaction(
    store: Store, stores: Stores, configured: Configured, db_url: str
) -> None:
    def broken(conn: Connection, rows: Sequence[NewMessage]) -> None:
        raise RuntimeError("capture failed")

    configured.steps = Steps(capture=broken)
    with pytest.raises(RuntimeError):
        ingest(store, {"type": "track", "userId": "u1", "event": "E"})
    assert sql(db_url, "SELECT count(*) FROM messages") == [(0,)]
    assert sql(db_url, "SELECT count(*) FROM deliveries") == [(0,)]


def test_suppressed_users_are_acknowledged_and_dropped_until_unsuppressed(
    store: Store, stores: Stores, db_url: str
) -> None:
    ingest(store, {"type": "identify", "userId": "u1", "anonymousId": "a1", "traits": {}})
    stores.regulations.create_regulation("r1", "SUPPRESS_ONLY", None, ["u1"], time.time())
    # The userId, and the anonymousId the profile store links to it, are both suppressed.
    assert sql(db_url, "SELECT subject_id, user_id FROM suppressions ORDER BY 1") == [
        ("a1", "u1"),
        ("u1", "u1"),
    ]
    assert ingest(
        store,
        {"type": "track", "userId": "u1", "event": "E"},
        {"type": "track", "anonymousId": "a1", "event": "E"},
        {"type": "track", "userId": "u2", "event": "E"},
    ) == ["suppressed", "suppressed", "stored"]
    stores.regulations.create_regulation("r2", "UNSUPPRESS", None, ["u1"], time.time())
    assert sql(db_url, "SELECT count(*) FROM suppressions") == [(0,)]
    assert ingest(store, {"type": "track", "userId": "u1", "event": "E"}) == ["stored"]


def test_old_events_are_purged_beyond_the_lookback(
    store: Store, stores: Stores, db_url: str
) -> None:
    now = time.time()
    ingest(
        store,
        {"type": "track", "userId": "u1", "event": "Old", "timestamp": iso(now - 40 * 86400)},
        {"type": "track", "userId": "u1", "event": "New", "timestamp": iso(now - 10 * 86400)},
    )
    assert stores.profiles.purge_events(now - 30 * 86400, 1000)[0] == 1
    assert event_rows(db_url) == [("u1", "New")]


def add_events(store: Store, stores: Stores, *stamps: tuple[str, float]) -> None:
    with store.database.write() as conn:
        stores.profiles.add_events(conn, [("u1", name, t, "{}") for name, t in stamps])


def test_events_purge_in_steps_each_from_where_the_last_stopped(
    store: Store, stores: Stores, db_url: str
) -> None:
    # Three share a timestamp across a step's boundary: the next step, from that timestamp
    # on, still finds the two left.
    old = [(f"old{i}", 1000.0 + t) for i, t in enumerate([5, 1, 3, 3, 3, 2, 4, 0])]
    add_events(store, stores, *old, ("new0", 2000.0), ("new1", 1500.0))
    since, steps, total = None, [], 0
    while True:
        purged, since = stores.profiles.purge_events(1500.0, 3, since)
        if not purged:
            break
        steps.append((purged, since))
        total += purged
    assert steps == [(3, 1002.0), (3, 1003.0), (2, 1005.0)]
    assert total == len(old)
    assert event_rows(db_url) == [("u1", "new0"), ("u1", "new1")]


def test_an_events_step_leaves_what_is_older_than_its_start(
    store: Store, stores: Stores, db_url: str
) -> None:
    add_events(store, stores, ("a", 10.0), ("b", 20.0), ("c", 30.0))
    assert stores.profiles.purge_events(100.0, 10, 20.0) == (2, 30.0)
    assert event_rows(db_url) == [("u1", "a")]
    assert stores.profiles.purge_events(100.0, 10, 40.0) == (0, 40.0)
    assert event_rows(db_url) == [("u1", "a")]
