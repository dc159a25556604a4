"""efd check-receiver's cases: each request is what efd would send, signed (or mis-signed)
as the case says, as the stock verifiers find it; the verdicts follow docs/delivery.md's
rules for receivers."""

from __future__ import annotations

import base64
import json
import time

import pytest
from standardwebhooks.webhooks import Webhook, WebhookVerificationError

from efd.cli import receiver_check
from efd.cli.receiver_check import ACCEPT, FAIL, OK, REFUSE, SKIPPED, WARN, Answer, Case
from efd.segment import webhooks

NEW = "whsec_" + base64.b64encode(b"n" * 32).decode()
OLD = "whsec_" + base64.b64encode(b"o" * 24).decode()
KEYS = [webhooks.standard_secret(NEW), webhooks.standard_secret(OLD)]


def by_name(secrets: list[str], keys: list[bytes], now: int | None = None) -> dict[str, Case]:
    # The time of the call: a receiver refuses a webhook-timestamp 5 minutes off its clock,
    # and a loaded suite may run this test long after it was collected.
    now = int(time.time()) if now is None else now
    found = receiver_check.cases(secrets, keys, now=now, run="r1", user_agent="efd/1.0")
    return {case.name: case for case in found}


def x_signature_verifies(case: Case, secret: str) -> bool:
    [request] = case.requests
    return webhooks.verify(secret, request.body, request.headers["X-Signature"])


def standard_verifies(case: Case, secret: str) -> bool:
    [request] = case.requests
    try:
        Webhook(secret).verify(request.body, request.headers)
    except WebhookVerificationError:
        return False
    return True


def test_x_signature_cases() -> None:
    cases = by_name(["new", "old"], [])
    assert list(cases) == [
        "valid X-Signature",
        "wrong X-Signature",
        "rotated X-Signature secret",
        "no signature",
        "the same webhook-id twice",
    ]
    assert x_signature_verifies(cases["valid X-Signature"], "new")
    assert not x_signature_verifies(cases["wrong X-Signature"], "new")
    assert not x_signature_verifies(cases["wrong X-Signature"], "old")
    assert x_signature_verifies(cases["rotated X-Signature secret"], "old")
    assert not x_signature_verifies(cases["rotated X-Signature secret"], "new")
    for case in cases.values():
        for request in case.requests:
            assert "webhook-signature" not in request.headers


def test_standard_webhooks_cases_as_the_library_finds_them() -> None:
    now = int(time.time())
    cases = by_name([], KEYS, now)
    assert list(cases) == [
        "valid Standard Webhooks",
        "wrong webhook-signature",
        "stale webhook-timestamp",
        "future webhook-timestamp",
        "rotated Standard Webhooks secret",
        "no signature",
        "the same webhook-id twice",
    ]
    assert standard_verifies(cases["valid Standard Webhooks"], NEW)
    assert not standard_verifies(cases["wrong webhook-signature"], NEW)
    assert not standard_verifies(cases["wrong webhook-signature"], OLD)
    for name in ("stale webhook-timestamp", "future webhook-timestamp"):
        assert not standard_verifies(cases[name], NEW)
        [request] = cases[name].requests
        # Refused for its time alone: the signature is by the receiver's key.
        stamp = int(request.headers["webhook-timestamp"])
        assert abs(stamp - now) == receiver_check.SKEW_SECONDS
        signature = webhooks.standard_signature(
            KEYS[:1], request.headers["webhook-id"], stamp, request.body
        )
        assert request.headers["webhook-signature"] == signature
    assert standard_verifies(cases["rotated Standard Webhooks secret"], OLD)
    assert not standard_verifies(cases["rotated Standard Webhooks secret"], NEW)
    for case in cases.values():
        for request in case.requests:
            assert "X-Signature" not in request.headers


def test_the_unsigned_and_repeated_requests() -> None:
    cases = by_name(["new"], KEYS[:1])
    [unsigned] = cases["no signature"].requests
    assert unsigned.headers["webhook-id"].startswith("msg_")
    assert not {"X-Signature", "webhook-signature", "webhook-timestamp"} & set(unsigned.headers)
    first, second = cases["the same webhook-id twice"].requests
    assert first == second  # a resend: the same id, body and signatures
    assert webhooks.verify("new", first.body, first.headers["X-Signature"])
    Webhook(NEW).verify(first.body, first.headers)


def test_each_request_is_a_message_of_its_own_as_efd_sends_it() -> None:
    cases = by_name(["new", "old"], KEYS)
    requests = [r for case in cases.values() for r in case.requests]
    ids = [r.headers["webhook-id"] for r in requests]
    assert len(set(ids)) == len(ids) - 1  # only the repeat shares one
    for request in requests:
        body = json.loads(request.body)
        assert body["type"] == "track"
        assert body["event"] == "efd check-receiver"
        assert request.headers["User-Agent"] == "efd/1.0"
        assert request.headers["Content-Type"] == "application/json"
    other_run = receiver_check.cases(
        ["new"], [], now=int(time.time()), run="r2", user_agent="efd/1.0"
    )
    assert other_run[0].requests[0].headers["webhook-id"] not in ids


def test_rotation_is_skipped_with_one_secret() -> None:
    cases = by_name(["new"], KEYS[:1])
    for name, option in (
        ("rotated X-Signature secret", "--secret"),
        ("rotated Standard Webhooks secret", "--standard-webhooks-secret"),
    ):
        row = receiver_check.judge(cases[name], [])
        assert (row.verdict, row.note) == (SKIPPED, f"give a second {option} to check it")
    assert receiver_check.passed([receiver_check.judge(cases["rotated X-Signature secret"], [])])


def test_no_secrets_no_cases() -> None:
    assert by_name([], []) == {}


def answer(status: int | None) -> Answer:
    if status is None:
        return Answer(None, 0.1, "connect", "Connection refused")
    return Answer(status, 0.01)


@pytest.mark.parametrize(
    ("expect", "status", "verdict", "words"),
    [
        (ACCEPT, 200, OK, ""),
        (ACCEPT, 204, OK, ""),
        (ACCEPT, 401, FAIL, "refused a request signed with the secrets given here"),
        (ACCEPT, 500, FAIL, "would retry a request that was valid"),
        (ACCEPT, 302, FAIL, "follows no redirect"),
        (ACCEPT, None, FAIL, "no answer (connect: Connection refused)"),
        (REFUSE, 401, OK, ""),
        (REFUSE, 400, OK, ""),
        (REFUSE, 403, OK, ""),
        (REFUSE, 200, FAIL, "accepted a request it should refuse"),
        (REFUSE, 429, FAIL, "would retry it"),
        (REFUSE, 408, FAIL, "would retry it"),
        (REFUSE, 503, FAIL, "would retry it"),
        (REFUSE, 301, FAIL, "follows no redirect"),
    ],
)
def test_verdicts(expect: str, status: int | None, verdict: str, words: str) -> None:
    case = Case("a case", expect, (), "the rule")
    row = receiver_check.judge(case, [answer(status)])
    assert row.verdict == verdict
    assert words in row.note
    if verdict == FAIL:
        assert row.note.startswith("the rule; ")


def test_every_request_of_a_case_must_answer_as_expected() -> None:
    case = Case("twice", ACCEPT, (), "the rule")
    row = receiver_check.judge(case, [answer(200), answer(409)])
    assert (row.expected, row.got, row.verdict) == ("2xx, 2xx", "200, 409", FAIL)
    assert "answered 409" in row.note


@pytest.mark.parametrize(
    ("seconds", "timed_out", "verdict"),
    [(0.05, False, OK), (3.9, False, OK), (4.2, False, WARN), (0.05, True, FAIL)],
)
def test_answer_time(seconds: float, timed_out: bool, verdict: str) -> None:
    answers = [Answer(200, 0.01), Answer(200, seconds)]
    if timed_out:
        answers.append(Answer(None, 5.0, "timeout", "no complete answer in 5 s"))
    row = receiver_check.timing(answers, 5.0)
    assert row.verdict == verdict
    assert row.expected == "under 4 s"
    assert row.got.startswith(f"slowest {seconds:.2f} s")
    assert receiver_check.passed([row]) is (verdict != FAIL)


def test_the_table_aligns_and_explains_what_is_not_ok() -> None:
    rows = [
        receiver_check.judge(Case("valid", ACCEPT, (), "accept it"), [answer(200)]),
        receiver_check.judge(Case("wrong signature", REFUSE, (), "refuse it"), [answer(200)]),
    ]
    lines = receiver_check.table(rows).splitlines()
    assert lines[0].split() == ["case", "expected", "got", "verdict"]
    assert lines[1].split() == ["valid", "2xx", "200", "ok"]
    assert lines[2].split() == ["wrong", "signature", "4xx", "200", "FAIL"]
    assert lines[0].index("expected") == lines[1].index("2xx") == lines[2].index("4xx")
    assert lines[3:] == [
        "",
        "wrong signature: refuse it; answered 200: it accepted a request it should refuse",
    ]
    assert not receiver_check.passed(rows)
