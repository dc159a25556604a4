"""Hostile input and configuration: every refusal is a clear 4xx with a JSON error that names
the problem, nothing is stored, the parser processes survive, and slow or broken clients hold
only their own connection. Real daemons, real sockets, SQLite and PostgreSQL."""

from __future__ import annotations

import asyncio
import gzip
import json
import logging
from typing import Any

import aiohttp
import pydantic
import pytest

import efd
from efd import config
from efd.delivery.retry import Verdict
from efd.delivery.sender import Sender
from efd.jsonjs import MAX_DEPTH
from efd.segment.messages import MAX_MESSAGE_BYTES
from efd.segment.webhooks import Route
from tests.conftest import (
    WRITE_KEY,
    DaemonFactory,
    ReceiverFactory,
    StartedDaemon,
    basic,
    eventually,
    post,
    settings_dict,
    sql,
)
from tests.unit.test_config import NUMERIC_HOSTS_ACCEPTED, NUMERIC_HOSTS_REFUSED
from tests.unit.test_payload import BAD_TIMESTAMPS, GZIP_VARIANTS, LONE_SURROGATES, MALFORMED_BASIC

TRACK = {"type": "track", "userId": "u-1", "event": "Signed Up"}
ADMIN_TOKEN = "hardening-admin-token-0123"


def stored_count(db_url: str) -> int:
    return int(sql(db_url, "SELECT count(*) FROM messages")[0][0])


async def raw_post(
    port: int, path: str, data: bytes, headers: dict[str, str] | None = None
) -> tuple[int, Any]:
    async with (
        aiohttp.ClientSession(auto_decompress=False) as session,
        session.post(
            f"http://127.0.0.1:{port}{path}",
            data=data,
            headers={"Content-Type": "application/json", **(headers or {})},
        ) as response,
    ):
        text = await response.read()
        return response.status, json.loads(text)


def parser_pids(daemon: StartedDaemon) -> list[int]:
    """The daemon fixture's parser processes: it has one."""
    assert daemon.parsers is not None
    return daemon.parsers.pids


def nested(depth: int) -> Any:
    """An array nested `depth` levels deep."""
    value: Any = []
    for _ in range(depth - 1):
        value = [value]
    return value


@pytest.fixture
async def daemon(
    db_url: str, receiver_factory: ReceiverFactory, daemon_factory: DaemonFactory
) -> StartedDaemon:
    receiver = await receiver_factory()
    settings = settings_dict(db_url, [receiver.url])
    settings["server"].update(parse_processes=1, admin_token=ADMIN_TOKEN)
    return await daemon_factory(settings)


# -- deep nesting ---------------------------------------------------------------------------


@pytest.mark.parametrize("auth", [True, False], ids=["write key", "no write key"])
@pytest.mark.parametrize("padding", [0, 20_000], ids=["small", "parser process"])
async def test_nesting_deeper_than_the_limit_is_refused_everywhere(
    db_url: str, daemon: StartedDaemon, auth: bool, padding: int
) -> None:
    pids = parser_pids(daemon)
    # The message itself is depth 1: properties at MAX_DEPTH - 1 more levels is the limit.
    ok = {**TRACK, "properties": {"p": "x" * padding, "deep": nested(MAX_DEPTH - 2)}}
    too_deep = {**TRACK, "properties": {"p": "x" * padding, "deep": nested(MAX_DEPTH - 1)}}
    hostile = json.dumps(TRACK)[:-1].encode() + b', "d": ' + b"[" * 50_000 + b"]" * 50_000 + b"}"
    headers = basic() if auth else {}
    for body in (json.dumps(too_deep).encode(), hostile):
        status, answer = await raw_post(daemon.port, "/v1/track", body, headers)
        assert (status, answer["code"]) == (400, "too_deep"), answer
        assert str(MAX_DEPTH) in answer["message"]
    batch = json.dumps({"batch": [too_deep], "writeKey": WRITE_KEY}).encode()
    status, answer = await raw_post(daemon.port, "/v1/batch", batch, headers)
    assert (status, answer["code"]) == (400, "too_deep")
    assert stored_count(db_url) == 0
    # Up to the limit is fine, and the parser process is the one that was there before:
    # it neither died nor had to be restarted (a restart delays later large requests).
    status, _ = await raw_post(daemon.port, "/v1/track", json.dumps(ok).encode(), basic())
    assert status == 200
    assert parser_pids(daemon) == pids
    assert stored_count(db_url) == 1


async def test_deep_regulation_bodies_are_refused(db_url: str, daemon: StartedDaemon) -> None:
    body = b'{"regulationType": "DELETE_ONLY", "subjectType": "USER_ID", "subjectIds": ' + (
        b"[" * 10_000 + b"]" * 10_000 + b"}"
    )
    status, answer = await raw_post(
        daemon.port, "/regulations", body, {"Authorization": f"Bearer {ADMIN_TOKEN}"}
    )
    assert (status, answer["code"]) == (400, "too_deep")
    assert sql(db_url, "SELECT count(*) FROM regulations") == [(0,)]


# -- numbers past a double's range ----------------------------------------------------------

_RANGE = "out of range: numbers are limited to a double's range, about ±1.8e308"


@pytest.mark.parametrize("padding", [0, 20_000], ids=["small", "parser process"])
@pytest.mark.parametrize(
    ("number", "spelling"),
    [(b"1e999", "1e999"), (b"1" * 10_000, "111111111111… (10000 digits)")],
    ids=["1e999", "10000 digits"],
)
async def test_numbers_past_a_double_are_refused_naming_the_field(
    db_url: str, daemon: StartedDaemon, padding: int, number: bytes, spelling: str
) -> None:
    pids = parser_pids(daemon)
    message = json.dumps({**TRACK, "properties": {"p": "x" * padding, "n": 0}}).encode()
    message = message.replace(b'"n": 0', b'"n": ' + number)
    status, answer = await raw_post(daemon.port, "/v1/track", message, basic())
    assert (status, answer) == (
        400,
        {
            "success": False,
            "code": "invalid_field",
            "message": f"properties.n holds the number {spelling}, {_RANGE}",
            "field": "properties.n",
        },
    )
    batch = b'{"batch": [' + json.dumps(TRACK).encode() + b", " + message + b"]}"
    status, answer = await raw_post(daemon.port, "/v1/batch", batch, basic())
    assert (status, answer) == (
        400,
        {
            "success": False,
            "code": "invalid_field",
            "message": f"batch[1]: properties.n holds the number {spelling}, {_RANGE}",
            "field": "properties.n",
            "index": 1,
        },
    )
    assert stored_count(db_url) == 0
    assert parser_pids(daemon) == pids


async def test_regulations_refuse_numbers_past_a_double(db_url: str, daemon: StartedDaemon) -> None:
    body = b'{"regulationType": "DELETE_ONLY", "subjectType": "USER_ID", "subjectIds": [1e999]}'
    status, answer = await raw_post(
        daemon.port, "/regulations", body, {"Authorization": f"Bearer {ADMIN_TOKEN}"}
    )
    assert (status, answer["code"], answer["field"]) == (400, "invalid_field", "subjectIds[0]")
    assert answer["message"] == f"subjectIds[0] holds the number 1e999, {_RANGE}"
    assert sql(db_url, "SELECT count(*) FROM regulations") == [(0,)]


# -- text that is not valid Unicode -----------------------------------------------------------


# One case of the table end to end, on both backends; every case: tests/unit/test_payload.py.
@pytest.mark.parametrize(("message", "field"), LONE_SURROGATES[:1])
async def test_unpaired_surrogates_in_identifiers_are_refused(
    db_url: str, daemon: StartedDaemon, message: dict[str, Any], field: str
) -> None:
    body = json.dumps({"batch": [message]}).encode()  # ASCII: "\ud800" travels as an escape
    assert b"\\ud" in body
    status, answer = await raw_post(daemon.port, "/v1/batch", body, basic())
    assert (status, answer["code"], answer["field"], answer["index"]) == (
        400,
        "invalid_field",
        field,
        0,
    )
    assert stored_count(db_url) == 0


async def test_invalid_utf8_is_refused(db_url: str, daemon: StartedDaemon) -> None:
    # ED A0 80 would be U+D800 in UTF-8, which is not allowed to encode surrogates.
    body = b'{"userId": "\xed\xa0\x80", "event": "E"}'
    status, answer = await raw_post(daemon.port, "/v1/track", body, basic())
    assert (status, answer["code"]) == (400, "invalid_json")
    assert "utf-8" in answer["message"]
    assert stored_count(db_url) == 0


async def test_unpaired_surrogates_inside_properties_become_replacement_characters(
    db_url: str, receiver_factory: ReceiverFactory, daemon_factory: DaemonFactory
) -> None:
    receiver = await receiver_factory()
    daemon = await daemon_factory(settings_dict(db_url, [receiver.url]))
    message = {**TRACK, "properties": {"name": "cut \ud83d", "\udc00key": ["\ud800"]}}
    status, _ = await raw_post(daemon.port, "/v1/track", json.dumps(message).encode(), basic())
    assert status == 200
    [received] = await receiver.wait_for(1)
    received.body.decode("utf-8")  # valid UTF-8 for every receiver's parser
    assert received.json()["properties"] == {"name": "cut \ufffd", "\ufffdkey": ["\ufffd"]}
    [(body,)] = sql(db_url, "SELECT body FROM messages")
    assert json.loads(body)["properties"]["name"] == "cut \ufffd"


# -- credentials ---------------------------------------------------------------------------


# One case of the table end to end, on both backends; every case: tests/unit/test_payload.py.
@pytest.mark.parametrize("header", MALFORMED_BASIC[:1])
async def test_malformed_basic_credentials_are_401(
    db_url: str, daemon: StartedDaemon, header: str
) -> None:
    # The header's UTF-8 bytes, sent as they are (aiohttp sends header text as Latin-1).
    async with (
        aiohttp.ClientSession() as session,
        session.post(
            f"http://127.0.0.1:{daemon.port}/v1/track",
            data=json.dumps(TRACK).encode(),
            headers={"Authorization": header.encode("utf-8").decode("latin-1")},
        ) as response,
    ):
        answer = await response.json(content_type=None)
        assert (response.status, answer["code"]) == (401, "unauthorized"), header
    assert stored_count(db_url) == 0


async def test_admin_token_on_metrics_is_checked_whatever_its_form(daemon: StartedDaemon) -> None:
    async with aiohttp.ClientSession() as session:
        for header in (
            f"Bearer {ADMIN_TOKEN}x",
            f"Bearer {ADMIN_TOKEN[:-1]}",
            "Bearer ",
            "Bearer \u00e9".encode().decode("latin-1"),
            ADMIN_TOKEN,
        ):
            async with session.get(
                f"http://127.0.0.1:{daemon.port}/metrics", headers={"Authorization": header}
            ) as response:
                assert response.status == 401, header
        async with session.get(
            f"http://127.0.0.1:{daemon.port}/metrics",
            headers={"Authorization": f"Bearer {ADMIN_TOKEN}"},
        ) as response:
            assert response.status == 200


# -- the 32 KiB limit holds after merging -------------------------------------------------------


async def test_message_limit_applies_after_the_batch_context_is_merged(
    db_url: str, daemon: StartedDaemon
) -> None:
    shared = {"page": {"title": "x" * 40_000}}
    body = {"context": shared, "batch": [{**TRACK, "messageId": f"m{i}"} for i in range(100)]}
    status, answer = await raw_post(daemon.port, "/v1/batch", json.dumps(body).encode(), basic())
    assert (status, answer["code"], answer["index"]) == (400, "message_too_large", 0)
    assert str(MAX_MESSAGE_BYTES) in answer["message"]
    body["integrations"] = {"All": True, "padding": {"x": "y" * 40_000}}
    body["context"] = {}
    status, answer = await raw_post(daemon.port, "/v1/batch", json.dumps(body).encode(), basic())
    # integrations are merged too, but never delivered: they do not count.
    assert status == 200, answer
    assert stored_count(db_url) == 100
    [(longest,)] = sql(db_url, "SELECT max(length(body)) FROM messages")
    assert longest < 1000


async def test_a_message_just_under_the_limit_as_delivered_is_stored(
    db_url: str, daemon: StartedDaemon
) -> None:
    message: dict[str, Any] = {**TRACK, "messageId": "fits", "properties": {"p": ""}}
    base = len(json.dumps(message, separators=(",", ":")))
    message["properties"]["p"] = "x" * (MAX_MESSAGE_BYTES - base - 200)
    status, answer = await raw_post(daemon.port, "/v1/track", json.dumps(message).encode(), basic())
    assert status == 200, answer
    [(size,)] = sql(db_url, "SELECT length(body) FROM messages")
    assert size <= MAX_MESSAGE_BYTES


# -- gzip is read exactly -------------------------------------------------------------------


# One case of the table end to end, on both backends; every case: tests/unit/test_payload.py.
@pytest.mark.parametrize("case", list(GZIP_VARIANTS)[:1])
async def test_gzip_bodies_are_read_exactly(db_url: str, daemon: StartedDaemon, case: str) -> None:
    body = GZIP_VARIANTS[case]
    headers = {**basic(), "Content-Encoding": "gzip"}
    status, answer = await raw_post(daemon.port, "/v1/track", body, headers)
    assert (status, answer["code"]) == (400, "invalid_body"), case
    assert "gzip" in answer["message"]
    assert stored_count(db_url) == 0
    good = gzip.compress(json.dumps(TRACK).encode())
    assert (await raw_post(daemon.port, "/v1/track", good, headers))[0] == 200


# -- timestamps -----------------------------------------------------------------------------


# One case of the table end to end, on both backends; every case: tests/unit/test_payload.py.
@pytest.mark.parametrize(("message", "field"), BAD_TIMESTAMPS[:1])
async def test_every_timestamp_is_validated(
    db_url: str, daemon: StartedDaemon, message: dict[str, Any], field: str
) -> None:
    status, answer = await raw_post(daemon.port, "/v1/track", json.dumps(message).encode(), basic())
    assert (status, answer["code"], answer["field"]) == (400, "invalid_field", field)
    assert stored_count(db_url) == 0


async def test_a_batch_sent_at_is_validated_without_message_timestamps(
    db_url: str, daemon: StartedDaemon
) -> None:
    body = {"sentAt": "not a time", "batch": [TRACK]}
    status, answer = await raw_post(daemon.port, "/v1/batch", json.dumps(body).encode(), basic())
    assert (status, answer["code"], answer["field"]) == (400, "invalid_field", "sentAt")
    assert stored_count(db_url) == 0


# -- slow clients, connection limits, quiet logs ----------------------------------------------


async def _open(port: int) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
    return await asyncio.open_connection("127.0.0.1", port)


def _limited(db_url: str, receiver_url: str, **server: Any) -> dict[str, Any]:
    settings = settings_dict(db_url, [receiver_url])
    settings["server"].update(server)
    return settings


async def test_slow_headers_and_slow_bodies_get_408_while_others_are_served(
    db_url: str, receiver_factory: ReceiverFactory, daemon_factory: DaemonFactory
) -> None:
    receiver = await receiver_factory()
    daemon = await daemon_factory(_limited(db_url, receiver.url, request_timeout_seconds=1.0))
    # Headers that never finish.
    slow_head = await _open(daemon.port)
    slow_head[1].write(b"POST /v1/track HTTP/1.1\r\nHost: x\r\n")
    # A body that never finishes.
    slow_body = await _open(daemon.port)
    head = (
        f"POST /v1/track HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
        f"Authorization: {basic()['Authorization']}\r\nContent-Length: 1000\r\n\r\n"
    )
    slow_body[1].write(head.encode() + b'{"userId": "u",')
    # Meanwhile another client is served.
    assert (await post(daemon.port, "/v1/track", TRACK))[0] == 200
    for reader, writer in (slow_head, slow_body):
        answer = await asyncio.wait_for(reader.read(), timeout=30)  # until the server closes
        status_line, _, rest = answer.partition(b"\r\n")
        assert status_line.startswith(b"HTTP/1.1 408"), answer
        assert json.loads(rest.partition(b"\r\n\r\n")[2])["code"] == "request_timeout"
        writer.close()
    assert stored_count(db_url) == 1
    assert daemon.metrics.requests_timed_out == 2


async def test_connections_beyond_the_limit_are_refused_with_503(
    db_url: str, receiver_factory: ReceiverFactory, daemon_factory: DaemonFactory
) -> None:
    receiver = await receiver_factory()
    daemon = await daemon_factory(
        _limited(db_url, receiver.url, max_connections=2, max_connections_per_address=2)
    )
    held = [await _open(daemon.port) for _ in range(2)]
    for _, writer in held:  # make sure both are accepted before the third arrives
        writer.write(b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n")
    for reader, _ in held:
        assert (await reader.readuntil(b"\r\n")).startswith(b"HTTP/1.1 200")
    reader, writer = await _open(daemon.port)
    answer = await asyncio.wait_for(reader.read(), timeout=30)
    assert answer.startswith(b"HTTP/1.1 503"), answer
    assert b"too_many_connections" in answer
    writer.close()
    for _, held_writer in held:
        held_writer.close()
        await held_writer.wait_closed()
    # Once they are gone, new connections are served again.
    for _ in range(200):
        status, _answer = await post(daemon.port, "/v1/track", TRACK)
        if status != 503:
            break
        await asyncio.sleep(0.05)
    assert status == 200
    assert daemon.metrics.connections_refused >= 1


async def test_idle_keep_alive_connections_are_closed(
    db_url: str, receiver_factory: ReceiverFactory, daemon_factory: DaemonFactory
) -> None:
    receiver = await receiver_factory()
    daemon = await daemon_factory(_limited(db_url, receiver.url, keepalive_timeout_seconds=0.5))
    reader, writer = await _open(daemon.port)
    writer.write(b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n")
    await reader.readuntil(b'{"status": "ok"}')
    assert await asyncio.wait_for(reader.read(), timeout=30) == b""  # closed by the server
    writer.close()


async def test_disconnects_and_non_http_are_logged_quietly(
    db_url: str, daemon: StartedDaemon, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG)
    # A client that goes away halfway through its body.
    reader, writer = await _open(daemon.port)
    writer.write(b"POST /v1/track HTTP/1.1\r\nHost: x\r\nContent-Length: 1000\r\n\r\n" + b"{" * 10)
    await writer.drain()
    writer.transport.abort()
    # Something that is not HTTP: a TLS hello on the plain port, and random bytes.
    for garbage in (b"\x16\x03\x01\x00\xa5\x01\x00\x00\xa1\x03\x03", b"\x00\xffHELLO\r\n\r\n"):
        reader, writer = await _open(daemon.port)
        writer.write(garbage)
        answer = await asyncio.wait_for(reader.read(), timeout=30)
        assert answer.split(b"\r\n")[0].split(b" ")[1] == b"400", answer
        writer.close()
    await eventually(lambda: any("went away" in r.getMessage() for r in caplog.records))
    assert (await post(daemon.port, "/v1/track", TRACK))[0] == 200
    noisy = [r for r in caplog.records if r.levelno >= logging.WARNING or r.exc_info]
    assert noisy == [], [r.getMessage() for r in noisy]
    assert all("\n" not in r.getMessage() for r in caplog.records if r.name.startswith("aiohttp"))


async def test_every_answer_names_efd_and_no_other_software(
    db_url: str, receiver_factory: ReceiverFactory, daemon_factory: DaemonFactory
) -> None:
    receiver = await receiver_factory()
    daemon = await daemon_factory(
        _limited(db_url, receiver.url, max_connections=2, request_timeout_seconds=1.0)
    )

    async def exchange(request: bytes) -> bytes:
        reader, writer = await _open(daemon.port)
        writer.write(request)
        answer = await asyncio.wait_for(reader.read(), timeout=30)  # until the server closes
        writer.close()
        return answer

    def server_header(answer: bytes) -> str:
        head = answer.partition(b"\r\n\r\n")[0].decode("latin-1").split("\r\n")
        values = [
            line.split(":", 1)[1].strip() for line in head if line.lower().startswith("server:")
        ]
        assert len(values) == 1, answer
        return values[0]

    answers = [
        await exchange(f"GET {path} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n".encode())
        for path in ("/healthz", "/openapi.json", "/nowhere", "/admin/deliveries")
    ]
    answers.append(
        await exchange(
            b"POST /v1/track HTTP/1.1\r\nHost: x\r\nConnection: close\r\n"
            b"Content-Length: 2\r\n\r\n{}"
        )
    )
    answers.append(await exchange(b"\x00\xffHELLO\r\n\r\n"))  # aiohttp's own 400
    answers.append(await exchange(b"POST /v1/track HTTP/1.1\r\nHost: x\r\n"))  # our raw 408
    held = [await _open(daemon.port) for _ in range(2)]
    for reader, writer in held:
        writer.write(b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n")
        await reader.readuntil(b"\r\n\r\n")
    answers.append(await exchange(b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n"))  # our raw 503
    for _, writer in held:
        writer.close()
    statuses = [answer.split(b" ", 2)[1] for answer in answers]
    assert statuses == [b"200", b"200", b"404", b"403", b"401", b"400", b"408", b"503"]
    assert {server_header(answer) for answer in answers} == {f"efd/{efd.__version__}"}


# -- configuration --------------------------------------------------------------------------


async def test_start_warns_once_when_postgresql_runs_without_autovacuum(
    db_url: str,
    receiver_factory: ReceiverFactory,
    daemon_factory: DaemonFactory,
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.WARNING)
    receiver = await receiver_factory()
    await daemon_factory(settings_dict(db_url, [receiver.url]))
    warnings = [r.getMessage() for r in caplog.records if "autovacuum" in r.getMessage()]
    # The server's own setting, read independently: the warning follows it.
    off = not db_url.startswith("sqlite") and sql(db_url, "SHOW autovacuum") == [("off",)]
    assert len(warnings) == (1 if off else 0), warnings
    if off:
        assert "VACUUM ANALYZE" in warnings[0]
        assert "\n" not in warnings[0]


async def test_an_empty_token_can_no_longer_open_the_regulations_api(
    db_url: str, daemon_factory: DaemonFactory
) -> None:
    with pytest.raises(config.ConfigError):
        await daemon_factory(settings_dict(db_url, server={"admin_token": ""}))


async def test_one_hook_that_cannot_be_built_leaves_the_others_delivered(
    receiver_factory: ReceiverFactory,
) -> None:
    """A request that cannot be built fails for its own hook only: the other hooks' answers
    stand, so the round is a success and nobody gets the message again."""
    receivers = [await receiver_factory() for _ in range(5)]
    hooks: list[tuple[str, dict[str, str]]] = [(r.url, {}) for r in receivers]
    # Config validation refuses this header; the sender must survive it anyway.
    bad = receivers[2].url
    hooks[2] = (bad, {"X-Bad": "a\r\nb"})
    route = Route(name="d", hooks=tuple(hooks), secret="s", user_agent="efd/1.0")
    sender = Sender(timeout=5, allowed_networks=["127.0.0.0/8"])
    await sender.start()
    try:
        results = await sender.send_round(route, [url for url, _ in hooks], '{"a":1}', "m1")
    finally:
        await sender.close()
    verdicts = {r.hook_url: (r.verdict, r.error_class) for r in results}
    assert verdicts.pop(bad) == (Verdict.FAIL, "invalid_request")
    assert set(verdicts.values()) == {(Verdict.SUCCESS, None)}
    assert [len(r.received) for r in receivers] == [1, 1, 0, 1, 1]


async def test_the_hook_hosts_check_config_refuses_are_those_the_sender_never_reaches(
    receiver_factory: ReceiverFactory,
) -> None:
    """The load rule for numeric hosts is the sender's own: each host is sent to for real
    (127.0.0.0/8 allowed), and check-config refuses exactly those that never connect."""
    receiver = await receiver_factory()
    port = receiver.url.rsplit(":", 1)[1].split("/", 1)[0]
    hosts = NUMERIC_HOSTS_REFUSED + [h for h in NUMERIC_HOSTS_ACCEPTED if "example" not in h]
    sender = Sender(timeout=5, allowed_networks=["127.0.0.0/8"])
    await sender.start()
    seen = {}
    try:
        for host in hosts:
            url = f"http://{host}:{port}/hook"
            result = await sender.post(url, b"{}", {})
            try:
                config.HookConfig(url=url)
            except pydantic.ValidationError:
                refused = True
            else:
                refused = False
            seen[host] = (result.error_class or str(result.status_code), refused)
    finally:
        await sender.close()
    never_sent = {host for host, (outcome, _) in seen.items() if outcome == "invalid_url"}
    assert never_sent == set(NUMERIC_HOSTS_REFUSED), seen
    assert {host for host, (_, refused) in seen.items() if refused} == never_sent, seen
    # The others were tried for real: delivered on loopback, or stopped by the guard.
    assert {outcome for host, (outcome, _) in seen.items() if host not in never_sent} == {
        "200",
        "blocked",
    }, seen


async def test_a_store_failure_is_503_on_every_backend(db_url: str, daemon: StartedDaemon) -> None:
    # The store fails for real: the table efd writes to is gone. On SQLite the hot path
    # runs on the driver's cursor, whose errors must surface as the store's, not as a 500.
    sql(db_url, "ALTER TABLE messages RENAME TO messages_away")
    try:
        status, answer = await raw_post(
            daemon.port, "/v1/track", json.dumps(TRACK).encode(), basic()
        )
    finally:
        sql(db_url, "ALTER TABLE messages_away RENAME TO messages")
    assert (status, answer["code"]) == (503, "storage_unavailable")
    assert (await post(daemon.port, "/v1/track", TRACK))[0] == 200
