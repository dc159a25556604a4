"""Actions destinations end to end (docs/actions.md#how-actions-are-delivered): the mapped
body and rendered URL stored at ingestion and returned by claims, the migration that adds the
URL, a daemon ingesting over HTTP, and `efd map`. Real SQLite and PostgreSQL, real receivers
on 127.0.0.1."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from alembic import command
from sqlalchemy import inspect

from efd.operations.selection import message_json
from efd.records import ClaimRequest, DeliveryQuery, DeliveryStatus
from efd.store import Store, migrate
from efd.store.engine import make_engine
from efd.store.operations import OperationsStore
from tests.conftest import (
    WRITE_KEY,
    DaemonFactory,
    ReceiverFactory,
    eventually,
    post,
    settings_dict,
    sql,
)
from tests.support.rows import new_message

ROOT = Path(__file__).resolve().parents[2]
BODY = '{"order_id":"o/17","email":"ann@x.com"}'
URL = "https://crm.example/orders/o%2F17?u=u%201"


def claim(store: Store, route: str, now: float) -> list[Any]:
    return store.queue.claim(ClaimRequest(route, 10, owner="A", now=now, lease_until=now + 60))


def test_a_mapped_body_and_url_round_trip_through_insert_and_claim(db_url: str) -> None:
    migrate.upgrade(db_url)
    store = Store(db_url)
    try:
        now = time.time()
        row = new_message(
            "m1",
            destinations=("plain",),
            mapped=(
                ("crm/orders", BODY, URL, None),
                ("crm/form", None, None, "mapping: data.x.@path: the path must be a string"),
            ),
        )
        store.ingestion.insert_messages([row], now)
        [claimed] = claim(store, "crm/orders", now)
        assert (claimed.body, claimed.url) == (BODY, URL)
        [plain] = claim(store, "plain", now)
        assert (plain.body, plain.url) == ('{"type":"track"}', None)
        assert claim(store, "crm/form", now) == []  # failed at once: never claimed
        rows = sql(
            db_url,
            "SELECT destination, status, attempts, body, url, last_error FROM deliveries"
            " ORDER BY destination",
        )
        assert rows == [
            (
                "crm/form",
                "failed",
                0,
                None,
                None,
                "mapping: data.x.@path: the path must be a string",
            ),
            ("crm/orders", "pending", 0, BODY, URL, None),
            ("plain", "pending", 0, None, None, None),
        ]
        # What `efd inspect` and the admin API show: the rendered URL (query values hidden)
        # and why routing failed the other.
        operations = OperationsStore(store)
        record = operations.message("web", "m1")
        assert record is not None
        shown = {d["destination"]: d for d in message_json(record, 14400)["deliveries"]}
        assert shown["crm/orders"]["url"] == "https://crm.example/orders/o%2F17?u=***"
        assert shown["crm/form"]["lastError"] == rows[0][5]
        assert (shown["plain"]["url"], shown["plain"]["lastError"]) == (None, None)
        # A redrive leaves the routing failure; a replay repeats each as routing made it.
        assert operations.redrive(DeliveryQuery(statuses=(DeliveryStatus.FAILED,)), now) == 0
        found = operations.replay_sources("web", "m1")
        assert found is not None
        pk, _, originals = found
        targets = [(originals[name], name) for name in ("crm/orders", "crm/form")]
        assert operations.replay(pk, targets, now) is not None
        again = sql(
            db_url,
            "SELECT destination, status, body, url, last_error FROM deliveries"
            " WHERE replay_of IS NOT NULL ORDER BY destination",
        )
        assert again == [
            ("crm/form", "failed", None, None, rows[0][5]),
            ("crm/orders", "pending", BODY, URL, None),
        ]
    finally:
        store.dispose()


def _to(url: str, revision: str, *, down: bool = False) -> None:
    engine = make_engine(url, writer=True)
    config = migrate._config()
    try:
        with engine.connect() as conn:
            config.attributes["connection"] = conn
            (command.downgrade if down else command.upgrade)(config, revision)
            conn.commit()
    finally:
        engine.dispose()


def test_the_migration_applies_on_a_database_at_the_previous_head(db_url: str) -> None:
    _to(db_url, "0012")  # an empty SQLite file
    _to(db_url, "0012", down=True)  # a PostgreSQL copy of the migrated template
    engine = make_engine(db_url, writer=True)
    try:
        with engine.connect() as conn:
            assert "url" not in {c["name"] for c in inspect(conn).get_columns("deliveries")}
    finally:
        engine.dispose()
    sql(
        db_url,
        "INSERT INTO messages (id, source, message_id, type, timestamp, received_at, body)"
        " VALUES (1, 'web', 'old', 'track', 1, 1, '{}')",
    )
    sql(
        db_url,
        "INSERT INTO deliveries (message_pk, destination, status, attempts, created_at,"
        " next_attempt_at, lease_token) VALUES (1, 'd', 'pending', 0, 1, 1, 0)",
    )
    migrate.upgrade(db_url)
    assert migrate.current_revision(db_url) == migrate.head_revision()
    assert sql(db_url, "SELECT destination, url FROM deliveries") == [("d", None)]


def actions_settings(db_url: str, receiver_url: str) -> dict[str, Any]:
    settings = settings_dict(db_url, [receiver_url])
    settings["sources"][0]["destinations"] = ["crm", "hooks"]
    settings["destinations"].append(
        {
            "name": "crm",
            "type": "actions",
            "shared_secret": "s3cret",
            "actions": [
                {
                    "name": "orders",
                    "trigger": 'type = "track" and event = "Order Completed"',
                    "url": f"{receiver_url}/orders",
                    "data": {
                        "order_id": {"@path": "$.properties.order_id"},
                        "email": {
                            "@case": {
                                "operator": "lower",
                                "value": {"@path": "$.properties.email"},
                            }
                        },
                    },
                },
                {
                    "name": "people",
                    "trigger": 'type = "identify"',
                    "url": f"{receiver_url}/people/{{{{userId}}}}",
                    "method": "PUT",
                    "content_type": "application/x-www-form-urlencoded",
                    "data": {"email": {"@path": "$.traits.email"}},
                },
                {
                    "name": "broken",
                    "trigger": 'event = "Order Completed"',
                    "url": f"{receiver_url}/broken",
                    "content_type": "application/x-www-form-urlencoded",
                    "data": {"@path": "$.properties.items"},
                },
            ],
        }
    )
    return settings


def stored(db_url: str) -> list[tuple[Any, ...]]:
    return sql(
        db_url,
        "SELECT m.message_id, d.destination, d.status, d.attempts, d.body, d.url, d.last_error"
        " FROM deliveries d JOIN messages m ON m.id = d.message_pk ORDER BY d.id",
    )


async def test_a_daemon_stores_one_delivery_per_matching_action(
    db_url: str, receiver_factory: ReceiverFactory, daemon_factory: DaemonFactory
) -> None:
    receiver = await receiver_factory()
    daemon = await daemon_factory(actions_settings(db_url, receiver.url))
    order = {
        "userId": "u 1",
        "event": "Order Completed",
        "messageId": "order",
        "properties": {"order_id": "o-17", "email": "Ann@X.COM", "items": [1]},
    }
    person = {"userId": "a/b", "messageId": "person", "traits": {"email": "b@x.com"}}
    view = {"userId": "u", "event": "Viewed", "messageId": "view"}
    assert (await post(daemon.port, "/v1/track", order))[0] == 200
    assert (await post(daemon.port, "/v1/identify", person))[0] == 200
    assert (await post(daemon.port, "/v1/track", view))[0] == 200
    rows = {(r[0], r[1]): r[2:] for r in stored(db_url)}
    assert set(rows) == {
        ("order", "hooks"),
        ("order", "crm/orders"),
        ("order", "crm/broken"),
        ("person", "hooks"),
        ("person", "crm/people"),
        ("view", "hooks"),
        ("view", "crm"),
    }
    _, _, body, url, _ = rows[("order", "crm/orders")]
    # Its URL has no template: the delivery goes to the route's hook, and stores none.
    assert (body, url) == ('{"order_id":"o-17","email":"ann@x.com"}', None)
    _, _, body, url, _ = rows[("person", "crm/people")]
    assert (body, url) == ("email=b%40x.com", f"{receiver.url}/people/a%2Fb")
    status, attempts, body, url, error = rows[("order", "crm/broken")]
    assert (status, attempts, body, url) == ("failed", 0, None, None)
    assert error == (
        "request: data: a form body is made of an object's keys, and the mapped value is an array"
    )
    assert rows[("view", "crm")][0] == "filtered"
    assert rows[("view", "crm")][4] == "no action's trigger matched the message"
    # The JSON action without auth or templates goes out with its mapped body as it is.
    await eventually(lambda: any(r.path == "/hook/orders" for r in receiver.received))
    [sent] = [r for r in receiver.received if r.path == "/hook/orders"]
    assert sent.body == b'{"order_id":"o-17","email":"ann@x.com"}'


def write_config(path: Path, settings: dict[str, Any]) -> Path:
    """The settings as TOML: JSON is valid TOML for each value here, and the actions are
    tables of their own."""
    lines = []
    for source in settings["sources"]:
        lines += ["[[sources]]", *(f"{k} = {json.dumps(v)}" for k, v in source.items())]
    for destination in settings["destinations"]:
        lines.append("[[destinations]]")
        lists = ("hooks", "actions")
        lines += [f"{k} = {json.dumps(v)}" for k, v in destination.items() if k not in lists]
        for key in lists:
            for entry in destination.get(key, []):
                lines.append(f"[[destinations.{key}]]")
                lines += [f"{k} = {_toml(v)}" for k, v in entry.items()]
    path.write_text("\n".join(lines) + "\n")
    return path


def _toml(value: Any) -> str:
    if isinstance(value, dict):
        return "{ " + ", ".join(f"{json.dumps(k)} = {_toml(v)}" for k, v in value.items()) + " }"
    return json.dumps(value)


def efd_map(config: Path, action: str, message: dict[str, Any]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [
            sys.executable,
            "-m",
            "efd",
            "map",
            "--config",
            str(config),
            "--destination",
            "crm",
            "--action",
            action,
        ],
        input=json.dumps(message),
        capture_output=True,
        text=True,
        timeout=60,
        cwd=ROOT,
        check=False,
    )


def test_efd_map_prints_the_request_or_why_there_is_none(tmp_path: Path) -> None:
    settings = actions_settings(f"sqlite:///{tmp_path / 'efd.db'}", "https://crm.example")
    people = settings["destinations"][1]["actions"][1]
    people["auth"] = {"type": "basic", "username": "u", "password": "pa55word"}
    orders = settings["destinations"][1]["actions"][0]
    orders["auth"] = {"type": "bearer", "token": "t0ken-secret"}
    orders["headers"] = {"X-Source": "efd"}
    path = write_config(tmp_path / "efd.toml", settings)
    order = {"userId": "u1", "event": "Order Completed", "properties": {"order_id": "o-1"}}
    result = efd_map(path, "orders", order)
    assert result.returncode == 0, result.stderr
    head, _, body = result.stdout.partition("\n\n")
    assert head.splitlines() == [
        "POST https://crm.example/orders",
        "X-Source: efd",
        "Content-Type: application/json",
        "User-Agent: efd/1.0",
        "Authorization: Bearer ***",
        "X-Signature: *** (computed when sent)",
    ]
    assert body == '{"order_id":"o-1"}\n'
    assert "t0ken-secret" not in result.stdout + result.stderr
    result = efd_map(
        path, "people", {"type": "identify", "userId": "a b", "traits": {"email": "E"}}
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.splitlines()[0] == "PUT https://crm.example/people/a%20b"
    assert "Authorization: Basic ***" in result.stdout
    assert result.stdout.endswith("\n\nemail=E\n")
    assert "pa55word" not in result.stdout

    def refused(action: str, message: dict[str, Any], why: str) -> None:
        result = efd_map(path, action, message)
        assert result.returncode == 1
        assert result.stdout == ""
        assert why in result.stderr, result.stderr

    refused("orders", {"userId": "u", "event": "Viewed"}, "the trigger does not match")
    refused("broken", order, "no request: mapping: data: the mapping gives no value")
    with_items = {**order, "properties": {"items": [1]}}
    refused("broken", with_items, "no request: request: data: a form body is made of an object's")
    refused("nope", order, "'crm' has no action named 'nope' (it has orders, people, broken)")
    refused("orders", {**order, "integrations": {"crm": False}}, "integrations turn 'crm' off")
    broken = {**orders, "data": {"x": {"@path": {"@path": "$.properties.n"}}}}
    settings["destinations"][1]["actions"][0] = broken
    path = write_config(tmp_path / "efd.toml", settings)
    refused("orders", {**order, "properties": {"n": 5}}, "no request: mapping: data.x.@path")
    settings["destinations"][1]["actions"][0]["method"] = "GET"
    path = write_config(tmp_path / "efd.toml", settings)
    refused("orders", order, "destinations[1].actions[0].method: must be POST, PUT or PATCH")
    result = efd_map(path, "orders", order)
    assert "invalid configuration" in result.stderr
    assert WRITE_KEY not in result.stderr


async def test_a_parser_process_maps_a_large_batch_as_the_daemon_does(
    sqlite_url: str, receiver_factory: ReceiverFactory, daemon_factory: DaemonFactory
) -> None:
    receiver = await receiver_factory()
    settings = actions_settings(sqlite_url, receiver.url)
    settings["server"]["parse_processes"] = 1
    daemon = await daemon_factory(settings)
    assert daemon.parsers is not None
    assert len(daemon.parsers.pids) == 1
    batch = [
        {
            "type": "track",
            "userId": f"u{i}",
            "event": "Order Completed",
            "messageId": f"big-{i}",
            "properties": {"order_id": f"o-{i}", "email": "A@B.C", "pad": "x" * 400},
        }
        for i in range(40)  # past the size the daemon parses itself
    ]
    assert (await post(daemon.port, "/v1/batch", {"batch": batch}))[0] == 200
    rows = sql(
        sqlite_url,
        "SELECT m.message_id, d.body, d.url FROM deliveries d JOIN messages m"
        " ON m.id = d.message_pk WHERE d.destination = 'crm/orders' ORDER BY d.id",
    )
    assert rows == [
        (f"big-{i}", f'{{"order_id":"o-{i}","email":"a@b.c"}}', None) for i in range(40)
    ]
