"""efd.segment.webhooks: outbound bodies (spec 2.2), headers (4.1) and signatures (5.1). Pure."""

from __future__ import annotations

import base64
import hashlib
import hmac
import json
import re
import time
from datetime import UTC, datetime, timedelta, timezone
from pathlib import Path
from typing import Any

import pytest
from standardwebhooks.webhooks import Webhook, WebhookVerificationError

from efd import jsonjs
from efd.segment.messages import Message, normalise
from efd.segment.webhooks import (
    RESERVED_HEADERS,
    SIGNATURE_HEADER,
    Route,
    body_for,
    delete_body,
    encode,
    failed_labels,
    hook_labels,
    redact_url,
    redact_urls,
    request_headers,
    route_webhook_id,
    scrub,
    sign,
    standard_secret,
    verify,
    webhook_id,
)

NOW = datetime(2026, 3, 1, 12, 0, 0, tzinfo=UTC)
TS = "2026-02-28T10:00:00.276Z"
TIMESTAMP_FORM = re.compile(r"^\d{4}-\d{2}-\d{2}T\d{2}:\d{2}:\d{2}\.\d{3}Z$")
VECTORS = {
    v["name"]: v
    for v in json.loads((Path(__file__).parent / "data" / "signing_vectors.json").read_text())
}


def message(raw: dict[str, Any]) -> Message:
    return normalise({"messageId": "m-1", "timestamp": TS} | raw, received_at=NOW)


# -- bodies per type, exactly --------------------------------------------------------------

CASES: list[tuple[str, dict[str, Any], dict[str, Any]]] = [
    (
        "identify",
        {"type": "identify", "userId": "u1", "traits": {"name": "Zoë", "age": 30}},
        {"traits": {"name": "Zoë", "age": 30}},
    ),
    (
        "track",
        {"type": "track", "userId": "u1", "event": "Bought", "properties": {"revenue": 39.95}},
        {"event": "Bought", "properties": {"revenue": 39.95}},
    ),
    (
        "track-no-properties",
        {"type": "track", "userId": "u1", "event": "E"},
        {"event": "E", "properties": {}},
    ),
    (
        "page",
        {
            "type": "page",
            "userId": "u1",
            "properties": {"path": "/a", "referrer": "r", "title": "A", "url": "https://x.test/a"},
        },
        {"properties": {"path": "/a", "referrer": "r", "title": "A", "url": "https://x.test/a"}},
    ),
    (
        "page-name",
        {"type": "page", "userId": "u1", "name": "Home", "category": "Docs"},
        {"properties": {"name": "Home", "category": "Docs"}},
    ),
    ("screen", {"type": "screen", "userId": "u1", "name": "Home"}, {"name": "Home", "context": {}}),
    (
        "group",
        {"type": "group", "userId": "u1", "groupId": "g1", "traits": {"name": "Initech"}},
        {"groupId": "g1", "traits": {"name": "Initech"}},
    ),
    (
        "alias",
        {"type": "alias", "userId": "u1", "previousId": "anon-1"},
        {"Previous ID": "anon-1", "User ID": "u1", "previousId": "anon-1"},
    ),
]


@pytest.mark.parametrize(
    ("raw", "extra"), [(raw, extra) for _, raw, extra in CASES], ids=[c[0] for c in CASES]
)
def test_body_per_type(raw: dict[str, Any], extra: dict[str, Any]) -> None:
    expected = {
        "version": 1,
        "type": raw["type"],
        "userId": "u1",
        "messageId": "m-1",
        "timestamp": TS,
    } | extra
    assert body_for(message(raw)) == expected


@pytest.mark.parametrize("raw", [raw for _, raw, _ in CASES], ids=[c[0] for c in CASES])
def test_version_is_the_number_1(raw: dict[str, Any]) -> None:
    body = body_for(message(raw))
    assert type(body["version"]) is int
    assert body["version"] == 1
    assert encode(body).startswith(b'{"version":1,')


def test_alias_body_bytes() -> None:
    body = body_for(
        message({"type": "alias", "userId": "u-1", "previousId": "anon-1", "messageId": "m-4"})
    )
    assert encode(body) == (
        b'{"version":1,"type":"alias","Previous ID":"anon-1","User ID":"u-1",'
        b'"previousId":"anon-1","userId":"u-1","messageId":"m-4","timestamp":"'
        + TS.encode()
        + b'"}'
    )


def test_track_body_bytes() -> None:
    raw = {
        "type": "track",
        "userId": "019mr8mf4r",
        "event": "Purchased an Item",
        "properties": {"revenue": "39.95", "shippingMethod": "2-day"},
        "timestamp": "2012-12-02T00:30:08.276Z",
    }
    assert encode(body_for(message(raw))) == (
        b'{"version":1,"type":"track","userId":"019mr8mf4r","event":"Purchased an Item",'
        b'"properties":{"revenue":"39.95","shippingMethod":"2-day"},"messageId":"m-1",'
        b'"timestamp":"2012-12-02T00:30:08.276Z"}'
    )


def test_corrected_timestamp_body_keeps_the_client_time_as_original_timestamp() -> None:
    # The device's clock is 1 hour and 2 minutes behind: sent at its 10:58, received at 12:00.
    raw = {
        "type": "track",
        "userId": "u1",
        "event": "E",
        "timestamp": "2026-03-01T10:57:30.123456+00:00",
        "sentAt": "2026-03-01T10:58:00Z",
    }
    assert encode(body_for(normalise(raw | {"messageId": "m-1"}, received_at=NOW))) == (
        b'{"version":1,"type":"track","userId":"u1","event":"E","properties":{},'
        b'"messageId":"m-1","timestamp":"2026-03-01T11:59:30.123Z",'
        b'"originalTimestamp":"2026-03-01T10:57:30.123Z"}'
    )


@pytest.mark.parametrize("raw", [raw for _, raw, _ in CASES], ids=[c[0] for c in CASES])
def test_original_timestamp_only_when_corrected(raw: dict[str, Any]) -> None:
    assert "originalTimestamp" not in body_for(message(raw))  # a timestamp, no sentAt
    assert "originalTimestamp" not in body_for(normalise(raw, received_at=NOW))  # neither
    corrected = body_for(message(raw | {"sentAt": "2026-02-28T10:00:01.276Z"}))
    assert corrected["originalTimestamp"] == TS
    assert corrected["timestamp"] == "2026-03-01T11:59:59.000Z"
    assert list(corrected)[-2:] == ["timestamp", "originalTimestamp"]


@pytest.mark.parametrize("raw", [raw for _, raw, _ in CASES], ids=[c[0] for c in CASES])
def test_anonymous_id_only_when_present(raw: dict[str, Any]) -> None:
    assert "anonymousId" not in body_for(message(raw))
    assert body_for(message(raw | {"anonymousId": "a-9"}))["anonymousId"] == "a-9"


@pytest.mark.parametrize("type_", ["identify", "track", "page", "group"])
def test_anonymous_only_message_has_null_user_id(type_: str) -> None:
    raw = {k: v for _, r, _ in CASES if r["type"] == type_ for k, v in r.items() if k != "userId"}
    body = body_for(message(raw | {"anonymousId": "a-9"}))
    assert body["userId"] is None
    assert body["anonymousId"] == "a-9"


@pytest.mark.parametrize(
    "raw",
    [raw for _, raw, _ in CASES if raw["type"] != "screen"],
    ids=[name for name, raw, _ in CASES if raw["type"] != "screen"],
)
def test_context_only_when_present(raw: dict[str, Any]) -> None:
    assert "context" not in body_for(message(raw))
    context = {"ip": "1.2.3.4", "device": {"model": "m", "type": "ios"}}
    assert body_for(message(raw | {"context": context}))["context"] == context
    assert body_for(message(raw | {"context": {}}))["context"] == {}


SCREEN_CONTEXT = {
    "device": {"model": "iPhone15,2", "type": "ios"},
    "os": {"name": "iOS", "version": "17.2"},
    "app": {"build": "42", "name": "Shop", "version": "1.2.3"},
}


@pytest.mark.parametrize(
    ("raw", "context"),
    [
        ({}, {}),
        ({"context": SCREEN_CONTEXT}, SCREEN_CONTEXT),
    ],
)
def test_screen_always_has_context(raw: dict[str, Any], context: dict[str, Any]) -> None:
    body = body_for(message({"type": "screen", "userId": "u1", "name": "Home"} | raw))
    assert body["context"] == context
    assert body["name"] == "Home"


def test_screen_context_from_batch_context() -> None:
    msg = normalise(
        {"type": "screen", "anonymousId": "a", "timestamp": TS, "messageId": "m"},
        received_at=NOW,
        batch_context=SCREEN_CONTEXT,
    )
    assert body_for(msg) == {
        "version": 1,
        "type": "screen",
        "userId": None,
        "anonymousId": "a",
        "name": "",
        "context": SCREEN_CONTEXT,
        "messageId": "m",
        "timestamp": TS,
    }


def test_screen_properties_travel_when_given() -> None:
    body = body_for(message({"type": "screen", "userId": "u", "name": "S", "properties": {"a": 1}}))
    assert body["properties"] == {"a": 1}


@pytest.mark.parametrize("raw", [raw for _, raw, _ in CASES], ids=[c[0] for c in CASES])
def test_message_id_on_every_body(raw: dict[str, Any]) -> None:
    msg = message(raw | {"messageId": "stable-id"})
    assert body_for(msg)["messageId"] == "stable-id"
    assert encode(body_for(msg)) == encode(body_for(msg))  # the same bytes on every retry


def test_generated_message_id_is_stable_across_bodies() -> None:
    msg = normalise({"type": "track", "userId": "u", "event": "E"}, received_at=NOW)
    assert body_for(msg)["messageId"] == body_for(msg)["messageId"] == msg.message_id


def test_integrations_do_not_travel() -> None:
    body = body_for(
        message({"type": "track", "userId": "u", "event": "E", "integrations": {"All": False}})
    )
    assert "integrations" not in body


@pytest.mark.parametrize(
    ("timestamp", "expected"),
    [
        ("2026-02-28T10:00:00Z", "2026-02-28T10:00:00.000Z"),
        ("2026-02-28T10:00:00.5+00:00", "2026-02-28T10:00:00.500Z"),
        ("2026-02-28T12:00:00.123456+0200", "2026-02-28T10:00:00.123Z"),
        ("2026-02-28T10:00:00", "2026-02-28T10:00:00.000Z"),
        ("2026-02-28T10:00:00.999999Z", "2026-02-28T10:00:00.999Z"),
    ],
)
def test_timestamp_in_milliseconds_and_z(timestamp: str, expected: str) -> None:
    body = body_for(message({"type": "track", "userId": "u", "event": "E", "timestamp": timestamp}))
    assert body["timestamp"] == expected
    assert TIMESTAMP_FORM.match(body["timestamp"])


def test_receipt_time_as_timestamp_when_absent() -> None:
    msg = normalise({"type": "track", "userId": "u", "event": "E"}, received_at=NOW)
    assert body_for(msg)["timestamp"] == "2026-03-01T12:00:00.000Z"


# -- delete ----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("when", "stamp"),
    [
        (datetime(2012, 12, 2, 0, 30, 8, 276_000, tzinfo=UTC), "2012-12-02T00:30:08.276Z"),
        (
            datetime(2026, 1, 1, 1, 0, tzinfo=timezone(timedelta(hours=1))),
            "2026-01-01T00:00:00.000Z",
        ),
    ],
)
def test_delete_body_is_exactly_type_user_id_timestamp(when: datetime, stamp: str) -> None:
    body = delete_body("019mr8mf4r", when)
    assert body == {"type": "delete", "userId": "019mr8mf4r", "timestamp": stamp}
    assert list(body) == ["type", "userId", "timestamp"]
    assert "version" not in body
    assert "messageId" not in body


def test_delete_body_matches_the_signing_vector() -> None:
    vector = VECTORS["delete"]
    body = encode(delete_body("019mr8mf4r", datetime(2012, 12, 2, 0, 30, 8, 276_000, tzinfo=UTC)))
    assert body == vector["body"].encode()
    assert sign(vector["secret"], body) == vector["x_signature"]


# -- encoding, signing and verifying ---------------------------------------------------------


def test_encode_is_jsonjs() -> None:
    body = {"version": 1, "n": 10.0, "t": 1e-7, "s": "é\u2028"}
    assert (
        encode(body) == jsonjs.dumps(body) == '{"version":1,"n":10,"t":1e-7,"s":"é\u2028"}'.encode()
    )


@pytest.mark.parametrize("raw", [raw for _, raw, _ in CASES], ids=[c[0] for c in CASES])
def test_encoded_body_survives_a_reparse(raw: dict[str, Any]) -> None:
    """What a Node receiver re-stringifies equals what was signed."""
    body = encode(
        body_for(
            message(raw | {"properties": {"f": 2.0, "g": 5e-7}} if raw["type"] == "track" else raw)
        )
    )
    assert jsonjs.dumps(jsonjs.loads(body)) == body


@pytest.mark.parametrize("name", sorted(VECTORS))
def test_sign_matches_the_vectors(name: str) -> None:
    vector = VECTORS[name]
    body = vector["body"].encode("utf-8")
    assert sign(vector["secret"], body) == vector["x_signature"]
    assert verify(vector["secret"], body, vector["x_signature"])


def test_sign_is_hex_hmac_sha1() -> None:
    expected = hmac.new(b"k", b'{"a":1}', hashlib.sha1).hexdigest()
    assert sign("k", b'{"a":1}') == expected
    assert re.fullmatch(r"[0-9a-f]{40}", expected)
    assert sign("clé", b"x") == hmac.new("clé".encode(), b"x", hashlib.sha1).hexdigest()


@pytest.mark.parametrize(
    ("secret", "body", "signature", "ok"),
    [
        ("s3cr3t", b"body", sign("s3cr3t", b"body"), True),
        ("s3cr3t", b"body", sign("s3cr3t", b"body").upper(), True),
        ("s3cr3t", b"body", f"  {sign('s3cr3t', b'body')}\n", True),
        ("s3cr3t", b"body", sign("other", b"body"), False),
        ("s3cr3t", b"body ", sign("s3cr3t", b"body"), False),
        ("s3cr3t", b"body", sign("s3cr3t", b"body")[:-1], False),
        ("s3cr3t", b"body", "", False),
        ("s3cr3t", b"body", "sha1=" + sign("s3cr3t", b"body"), False),
        pytest.param(
            "s3cr3t",
            b"body",
            "é" * 40,
            False,
        ),
    ],
)
def test_verify(secret: str, body: bytes, signature: str, ok: bool) -> None:
    assert verify(secret, body, signature) is ok


# -- headers ---------------------------------------------------------------------------------


def test_headers_without_secret() -> None:
    headers = request_headers(user_agent="efd/1.0", secret=None, body=b"{}", static={})
    assert headers == {"User-Agent": "efd/1.0", "Content-Type": "application/json"}


def test_an_actions_form_body_is_sent_as_a_form_and_signed_the_same() -> None:
    body = b"a=1&b=x+y"
    form = "application/x-www-form-urlencoded"
    headers = request_headers(
        user_agent="efd/1.0", secret="k", body=body, static={}, content_type=form
    )
    assert headers["Content-Type"] == form
    json_headers = request_headers(user_agent="efd/1.0", secret="k", body=body, static={})
    assert headers[SIGNATURE_HEADER] == json_headers[SIGNATURE_HEADER]


def test_headers_with_empty_secret_are_unsigned() -> None:
    headers = request_headers(user_agent="efd/1.0", secret="", body=b"{}", static={})
    assert SIGNATURE_HEADER not in headers


def test_headers_with_secret() -> None:
    body = VECTORS["track"]["body"].encode()
    headers = request_headers(user_agent="efd/1.0", secret="s3cr3t", body=body, static={})
    assert headers == {
        "User-Agent": "efd/1.0",
        "Content-Type": "application/json",
        "X-Signature": VECTORS["track"]["x_signature"],
    }
    assert SIGNATURE_HEADER == "X-Signature"


def test_static_headers_are_added() -> None:
    static = {"X-Env": "prod", "Authorization": "Bearer t"}
    headers = request_headers(user_agent="Segment.io/1.0", secret="k", body=b"{}", static=static)
    assert headers == {
        "X-Env": "prod",
        "Authorization": "Bearer t",
        "User-Agent": "Segment.io/1.0",
        "Content-Type": "application/json",
        "X-Signature": sign("k", b"{}"),
    }
    assert static == {"X-Env": "prod", "Authorization": "Bearer t"}  # not modified


def test_static_headers_cannot_override_owned_headers() -> None:
    static = {"User-Agent": "evil", "Content-Type": "text/plain", "X-Signature": "forged"}
    headers = request_headers(user_agent="efd/1.0", secret="k", body=b"{}", static=static)
    assert headers == {
        "User-Agent": "efd/1.0",
        "Content-Type": "application/json",
        "X-Signature": sign("k", b"{}"),
    }


def test_reserved_headers() -> None:
    # efd's own headers, the framing and routing ones, and Standard Webhooks' three.
    assert {
        "content-type",
        "content-length",
        "transfer-encoding",
        "host",
        "connection",
        "user-agent",
        "x-signature",
        "webhook-id",
        "webhook-timestamp",
        "webhook-signature",
    } == RESERVED_HEADERS


# -- redact_url ------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("url", "expected"),
    [
        ("https://hooks.example.com/segment", "https://hooks.example.com/segment"),
        ("https://hooks.example.com", "https://hooks.example.com"),
        ("http://127.0.0.1:9000/webhook", "http://127.0.0.1:9000/webhook"),
        ("https://user:pass@hooks.example.com/x", "https://***@hooks.example.com/x"),
        ("https://token@hooks.example.com/x", "https://***@hooks.example.com/x"),
        ("https://h.example.com/x?token=abc&v=2", "https://h.example.com/x?token=***&v=***"),
        ("https://h.example.com/x?flag", "https://h.example.com/x?flag"),
        ("https://h.example.com/x?a=1=2", "https://h.example.com/x?a=***"),
        ("https://h.example.com/x?a=1#frag", "https://h.example.com/x?a=***"),
        ("http://[::1]:8080/hook", "http://[::1]:8080/hook"),
        ("https://u:p@[2001:db8::1]/h?k=v", "https://***@[2001:db8::1]/h?k=***"),
        ("https://Hooks.Example.COM:443/P", "https://hooks.example.com:443/P"),
    ],
)
def test_redact_url(url: str, expected: str) -> None:
    assert redact_url(url) == expected


# -- hook labels and scrubbing ---------------------------------------------------------------

KEYED_1 = "https://hooks.example.com/in?api_key=k3y-number-one"
KEYED_2 = "https://hooks.example.com/in?api_key=k3y-number-two"
LOGIN = "https://hookuser:pa55word@hooks.example.com/in?api_key=k3y-number-one"
LABEL = "https://hooks.example.com/in?api_key=***"


def test_hooks_that_read_alike_get_numbered_labels_in_configuration_order() -> None:
    assert hook_labels([KEYED_1, "https://other.example/x", KEYED_2, LOGIN, KEYED_2]) == {
        KEYED_1: LABEL,
        "https://other.example/x": "https://other.example/x",
        KEYED_2: f"{LABEL} #2",
        LOGIN: "https://***@hooks.example.com/in?api_key=***",
    }
    route = Route("d", ((KEYED_2, {}), (KEYED_1, {})), None, "efd")
    assert route.labels == {KEYED_2: LABEL, KEYED_1: f"{LABEL} #2"}


def test_failed_labels_reads_labels_and_the_urls_of_older_rows() -> None:
    route = Route("d", ((KEYED_1, {}), (KEYED_2, {}), (LOGIN, {})), None, "efd")
    assert failed_labels(route, {f"{LABEL} #2"}) == {f"{LABEL} #2"}
    assert failed_labels(route, {KEYED_1, LOGIN}) == {LABEL, route.labels[LOGIN]}
    # A hook no longer configured: kept when it reveals nothing, dropped otherwise.
    gone = "https://gone.example/in?token=s3cret-value"
    assert failed_labels(route, {"https://gone.example/in?token=***", gone}) == {
        "https://gone.example/in?token=***"
    }


def test_redact_urls_hides_every_url_in_a_text() -> None:
    text = (
        "400, message='bad', url='https://u:p@h.example/p?a=1&b=two'; "
        "see URL('http://h2.example:81/x?k=v') or https://plain.example/ok."
    )
    assert redact_urls(text) == (
        "400, message='bad', url='https://***@h.example/p?a=***&b=***'; "
        "see URL('http://h2.example:81/x?k=***') or https://plain.example/ok."
    )
    assert redact_urls("http://h.example:99999999/x?k=v and more") == "http://*** and more"


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        # aiohttp quoting the URL in an error
        (f"400, message='x', url='{KEYED_1}'", f"400, message='x', url='{LABEL}'"),
        # a receiver echoing its path and query, or a value alone
        ("no hook at /in?api_key=k3y-number-one", "no hook at /in?api_key=***"),
        ("key k3y-number-one is revoked", "key *** is revoked"),
        ("login hookuser:pa55word refused", "login *** refused"),
        ("password pa55word wrong for hookuser", "password *** wrong for ***"),
        # short words are left alone, the pairs they are part of are not
        ("api_key=k3y-number-one&v=2, version 2", "api_key=***&v=***, version 2"),
    ],
)
def test_scrub_hides_a_hooks_secrets_wherever_they_appear(text: str, expected: str) -> None:
    url = "https://hookuser:pa55word@hooks.example.com/in?api_key=k3y-number-one&v=2"
    assert scrub(text, url) == expected


def test_scrub_leaves_text_alone_when_the_url_hides_nothing() -> None:
    text = "see https://elsewhere.example/x?k=v"
    assert scrub(text, "https://hooks.example.com/in") == text


# -- Standard Webhooks ---------------------------------------------------------------------------

WHSEC_OLD = "whsec_" + base64.b64encode(b"o" * 32).decode()
WHSEC_NEW = "whsec_" + base64.b64encode(b"n" * 24).decode()


def _standard(body: bytes, when: int, *secrets: str) -> dict[str, str]:
    return request_headers(
        user_agent="efd/1.0",
        secret=None,
        body=body,
        static={},
        webhook_id="msg_1",
        timestamp=when,
        standard_secrets=[standard_secret(s) for s in secrets],
    )


def test_standard_webhooks_headers_verify_with_the_stock_library_for_every_secret() -> None:
    body = b'{"type":"track","messageId":"msg-1"}'
    headers = _standard(body, int(time.time()), WHSEC_NEW, WHSEC_OLD)
    assert headers["webhook-id"] == "msg_1"
    assert len(headers["webhook-signature"].split(" ")) == 2
    for secret in (WHSEC_NEW, WHSEC_OLD):  # receivers still on the old secret verify too
        assert Webhook(secret).verify(body, headers) == json.loads(body)


def test_standard_webhooks_refuse_a_changed_body_an_old_time_and_another_secret() -> None:
    body = b'{"type":"track","messageId":"msg-1"}'
    headers = _standard(body, int(time.time()), WHSEC_NEW)
    with pytest.raises(WebhookVerificationError):
        Webhook(WHSEC_NEW).verify(body.replace(b"track", b"trace"), headers)
    with pytest.raises(WebhookVerificationError):
        Webhook(WHSEC_OLD).verify(body, headers)
    stale = _standard(body, int(time.time()) - 3600, WHSEC_NEW)
    with pytest.raises(WebhookVerificationError):
        Webhook(WHSEC_NEW).verify(body, stale)


def test_no_standard_webhooks_signature_without_keys() -> None:
    headers = request_headers(user_agent="efd/1.0", secret="k", body=b"{}", static={})
    assert not {"webhook-id", "webhook-timestamp", "webhook-signature"} & set(headers)
    # The id is every receiver's deduplication key, sent whatever the signing.
    headers = request_headers(
        user_agent="efd/1.0", secret="k", body=b"{}", static={}, webhook_id="msg_1"
    )
    assert headers["webhook-id"] == "msg_1"
    assert not {"webhook-timestamp", "webhook-signature"} & set(headers)


# -- webhook-id ----------------------------------------------------------------------------------

WEBHOOK_ID_FORM = re.compile(r"msg_[a-z2-7]{26}")
RECEIVED = 1_790_000_000.123456


def test_webhook_id_is_stable() -> None:
    # Pinned: a derivation that changed would give every pending delivery a new id after an
    # upgrade, and receivers would take its retries for new messages. The value is the
    # documented derivation done by coreutils: printf '42\0web\0m-1\0%s' "$(python3 -c
    # 'print((1_790_000_000.123456).hex())')" | b2sum -l 128, as base32, lower case, no "=".
    assert webhook_id(42, "web", "m-1", RECEIVED) == "msg_73psnsl5hhzgcyuypxzs7amqka"
    assert webhook_id(42, "web", "m-1", RECEIVED) == webhook_id(42, "web", "m-1", RECEIVED)


@pytest.mark.parametrize(
    "message_id",
    ["m-1", "é" * 100, "emoji-\U0001f600", "\u2028", "x" * 100, "delete:0a1b:7", "a\x00b"],
)
def test_webhook_id_is_ascii_whatever_the_message_id(message_id: str) -> None:
    assert WEBHOOK_ID_FORM.fullmatch(webhook_id(1, "web", message_id, RECEIVED))


def test_webhook_id_differs_for_every_part_of_the_row() -> None:
    ids = {
        webhook_id(1, "web", "m-1", RECEIVED),
        webhook_id(2, "web", "m-1", RECEIVED),  # another row
        webhook_id(1, "app", "m-1", RECEIVED),  # the same messageId from another source
        webhook_id(1, "web", "m-2", RECEIVED),
        webhook_id(1, "web", "m-1", RECEIVED + 86_400),  # a row id reused a day later
        webhook_id(1, "web", "m-1", RECEIVED + 1e-6),
        webhook_id(1, "we", "bm-1", RECEIVED),  # the parts cannot run into each other
    }
    assert len(ids) == 7


def test_an_actions_request_has_a_webhook_id_of_its_own_route() -> None:
    # Pinned as the message's: printf '42\0web\0m-1\0%s\0crm/orders' … | b2sum -l 128.
    assert webhook_id(42, "web", "m-1", RECEIVED, route="crm/orders") == "msg_" + _b2sum32(
        b"42\0web\0m-1\0" + RECEIVED.hex().encode() + b"\0crm/orders"
    )
    message = (42, "web", "m-1", RECEIVED)
    action = Route("crm/orders", (("http://h/o", {}),), None, "efd/1.0", action=True)
    other = Route("crm/audit", (("http://h/a", {}),), None, "efd/1.0", action=True)
    hook = Route("hooks", (("http://h/x", {}),), None, "efd/1.0")
    assert route_webhook_id(hook, message) == webhook_id(*message)  # unchanged for webhooks
    ids = {route_webhook_id(r, message) for r in (action, other, hook)}
    assert len(ids) == 3


def _b2sum32(data: bytes) -> str:
    """b2sum -l 128 as base32, lower case, unpadded: the documented derivation, done here
    with the standard library's own codecs."""
    digest = hashlib.blake2b(data, digest_size=16).digest()
    return base64.b32encode(digest).decode().rstrip("=").lower()


def test_every_header_is_ascii_for_a_non_ascii_message_id() -> None:
    body = encode(body_for(message({"type": "track", "userId": "u", "event": "E"})))
    headers = request_headers(
        user_agent="efd/1.0",
        secret="k",
        body=body,
        static={"X-Env": "prod"},
        webhook_id=webhook_id(7, "web", "zoë-✓-\U0001f600", RECEIVED),
        timestamp=int(time.time()),
        standard_secrets=[standard_secret(WHSEC_NEW)],
    )
    for name, value in headers.items():
        assert name.isascii()
        assert value.isascii()
        assert value.isprintable()
    assert Webhook(WHSEC_NEW).verify(body, headers) == json.loads(body)


@pytest.mark.parametrize(
    ("secret", "words"),
    [
        ("c2VjcmV0c2VjcmV0c2VjcmV0c2VjcmV0", "whsec_"),
        ("whsec_not base64!", "base64"),
        ("whsec_" + base64.b64encode(b"short").decode(), "24 to 64 bytes"),
        ("whsec_" + base64.b64encode(b"x" * 65).decode(), "24 to 64 bytes"),
        ("whsec_", "24 to 64 bytes"),
    ],
)
def test_malformed_whsec_secrets_say_what_is_wrong(secret: str, words: str) -> None:
    with pytest.raises(ValueError, match=words):
        standard_secret(secret)
