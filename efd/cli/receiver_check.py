"""`efd check-receiver`'s cases (pure): the signed test deliveries it sends a receiver, built
as efd builds its own, and what docs/delivery.md#receivers asks a receiver to answer to each.
The command sends them (efd/cli/check_receiver.py)."""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import UTC, datetime

from efd.brokers.targets import SCHEMES
from efd.segment import webhooks
from efd.segment.messages import Message

ACCEPT = "2xx"
REFUSE = "4xx"  # other than 408 and 429, which efd retries
OK, WARN, FAIL, SKIPPED = "ok", "WARN", "FAIL", "skipped"
# Twice the five minutes receivers allow either way: a receiver's clock a little off still
# refuses these, as it should.
SKEW_SECONDS = 600
# An answer slower than this share of the timeout is too close to it.
SLOW_SHARE = 0.8
SOURCE = "efd-check-receiver"

_VALID = "a request signed as efd signs it is accepted (2xx)"
_WRONG = "a signature that does not verify is refused with a 4xx other than 408 and 429"
_ROTATED = "while a secret changes, a signature by the old or the new one is accepted (2xx)"
_SKEWED = "a webhook-timestamp more than 5 minutes off is refused (4xx)"
_UNSIGNED = "a request without a signature is refused (4xx)"
_REPEAT = "a repeated webhook-id is acknowledged (2xx) and not processed again"


@dataclass(frozen=True, slots=True)
class Request:
    body: bytes
    headers: dict[str, str]


@dataclass(frozen=True, slots=True)
class Case:
    name: str
    expect: str  # ACCEPT or REFUSE, for each of its requests, sent in order
    requests: tuple[Request, ...]
    rule: str  # what the docs ask of a receiver here
    skipped: str | None = None  # why the case cannot be run with the secrets given


@dataclass(frozen=True, slots=True)
class Answer:
    """What the receiver did with one request."""

    status: int | None
    seconds: float
    error_class: str | None = None  # no answer: timeout, connect, tls...
    error: str | None = None


@dataclass(frozen=True, slots=True)
class Row:
    case: str
    expected: str
    got: str
    verdict: str  # OK, WARN, FAIL or SKIPPED
    note: str = ""


class _Builder:
    """Requests for one run: each a track message of its own, with its own webhook-id."""

    def __init__(self, run: str, now: int, user_agent: str) -> None:
        self.run, self.now, self.user_agent = run, now, user_agent
        self.count = 0

    def body(self, case: str) -> tuple[bytes, str]:
        self.count += 1
        message_id = f"{SOURCE}-{self.run}-{self.count}"
        message = Message(
            type="track",
            message_id=message_id,
            user_id=SOURCE,
            anonymous_id=None,
            timestamp=datetime.fromtimestamp(self.now, UTC),
            context=None,
            integrations={},
            fields={"event": "efd check-receiver", "properties": {"case": case}},
        )
        body = webhooks.encode(webhooks.body_for(message))
        return body, webhooks.webhook_id(self.count, SOURCE, message_id, self.now)

    def signed(
        self,
        case: str,
        *,
        secret: str | None = None,
        keys: Sequence[bytes] = (),
        timestamp: int | None = None,
    ) -> Request:
        body, webhook_id = self.body(case)
        return self.request(body, webhook_id, secret=secret, keys=keys, timestamp=timestamp)

    def request(
        self,
        body: bytes,
        webhook_id: str,
        *,
        secret: str | None = None,
        keys: Sequence[bytes] = (),
        timestamp: int | None = None,
    ) -> Request:
        headers = webhooks.request_headers(
            user_agent=self.user_agent,
            secret=secret,
            body=body,
            static={},
            webhook_id=webhook_id,
            timestamp=self.now if timestamp is None else timestamp,
            standard_secrets=keys,
        )
        return Request(body, headers)


def cases(
    secrets: Sequence[str], keys: Sequence[bytes], *, now: int, run: str, user_agent: str
) -> list[Case]:
    """The cases for a receiver holding `secrets` (X-Signature) and `keys` (Standard
    Webhooks); `run` makes this run's messageIds and webhook-ids its own."""
    make = _Builder(run, now, user_agent)
    # Secrets nobody holds: their signatures have the right form and do not verify.
    wrong_secret = f"{SOURCE}-wrong-{run}"
    wrong_key = hashlib.sha256(wrong_secret.encode()).digest()
    found: list[Case] = []
    if secrets:
        found += [
            Case("valid X-Signature", ACCEPT, (make.signed("valid", secret=secrets[0]),), _VALID),
            Case(
                "wrong X-Signature",
                REFUSE,
                (make.signed("wrong", secret=wrong_secret),),
                _WRONG,
            ),
            _rotated(
                "X-Signature",
                "--secret",
                make.signed("rotated", secret=secrets[1]) if len(secrets) > 1 else None,
            ),
        ]
    if keys:
        stale, future = now - SKEW_SECONDS, now + SKEW_SECONDS
        found += [
            Case("valid Standard Webhooks", ACCEPT, (make.signed("valid", keys=keys[:1]),), _VALID),
            Case(
                "wrong webhook-signature",
                REFUSE,
                (make.signed("wrong", keys=[wrong_key]),),
                _WRONG,
            ),
            Case(
                "stale webhook-timestamp",
                REFUSE,
                (make.signed("stale", keys=keys[:1], timestamp=stale),),
                _SKEWED,
            ),
            Case(
                "future webhook-timestamp",
                REFUSE,
                (make.signed("future", keys=keys[:1], timestamp=future),),
                _SKEWED,
            ),
            _rotated(
                "Standard Webhooks",
                "--standard-webhooks-secret",
                make.signed("rotated", keys=keys[1:2]) if len(keys) > 1 else None,
            ),
        ]
    if secrets or keys:
        found.append(Case("no signature", REFUSE, (make.signed("unsigned"),), _UNSIGNED))
        # A retry: the same id and body; Standard Webhooks signs each attempt (same second).
        body, webhook_id = make.body("repeat")
        again = make.request(
            body, webhook_id, secret=secrets[0] if secrets else None, keys=keys[:1]
        )
        found.append(Case("the same webhook-id twice", ACCEPT, (again, again), _REPEAT))
    return found


def _rotated(scheme: str, option: str, request: Request | None) -> Case:
    """Signed by the second secret only: a receiver still holding the old one with the new
    accepts it."""
    name = f"rotated {scheme} secret"
    if request is None:
        return Case(name, ACCEPT, (), _ROTATED, skipped=f"give a second {option} to check it")
    return Case(name, ACCEPT, (request,), _ROTATED)


def _matches(expect: str, status: int | None) -> bool:
    if status is None:
        return False
    if expect == ACCEPT:
        return 200 <= status < 300
    return 400 <= status < 500 and status not in (408, 429)


def _why(expect: str, answer: Answer) -> str:
    status = answer.status
    if status is None:
        return f"no answer ({answer.error_class}: {answer.error})"
    if 300 <= status < 400:
        return f"answered {status}: efd follows no redirect, and would give up on this hook"
    if expect == REFUSE and 200 <= status < 300:
        return f"answered {status}: it accepted a request it should refuse"
    if expect == REFUSE:
        return f"answered {status}: efd would retry it until the retry window closes"
    if status in (408, 429) or status >= 500:
        return f"answered {status}: efd would retry a request that was valid"
    return (
        f"answered {status}: it refused a request signed with the secrets given here (does "
        "it hold them?), and efd would give up on this hook for the message"
    )


def judge(case: Case, answers: Sequence[Answer]) -> Row:
    if case.skipped is not None:
        return Row(case.name, case.expect, "-", SKIPPED, case.skipped)
    got = ", ".join(str(a.status) if a.status is not None else str(a.error_class) for a in answers)
    expected = ", ".join(case.expect for _ in answers)
    wrong = [a for a in answers if not _matches(case.expect, a.status)]
    if not wrong:
        return Row(case.name, expected, got, OK)
    return Row(case.name, expected, got, FAIL, f"{case.rule}; {_why(case.expect, wrong[0])}")


def timing(answers: Sequence[Answer], timeout: float) -> Row:
    """The answer-time row: a FAIL when an answer did not come within `timeout`, a WARN when
    one took more than SLOW_SHARE of it."""
    name, expected = "answer time", f"under {timeout * SLOW_SHARE:g} s"
    timed_out = [a for a in answers if a.error_class == "timeout"]
    answered = [a.seconds for a in answers if a.status is not None]
    slowest = max(answered, default=0.0)
    got = f"slowest {slowest:.2f} s" if answered else "no answer"
    if timed_out:
        return Row(
            name,
            expected,
            f"{got}, {len(timed_out)} timed out",
            FAIL,
            f"no complete answer within {timeout:g} s: efd records a timeout and sends the "
            "message again; queue the work and answer at once",
        )
    if slowest > timeout * SLOW_SHARE:
        return Row(
            name,
            expected,
            got,
            WARN,
            f"close to efd's {timeout:g} s limit: a busier moment makes it a timeout, and the "
            "message comes again",
        )
    return Row(name, expected, got, OK)


def passed(rows: Sequence[Row]) -> bool:
    return all(row.verdict != FAIL for row in rows)


def table(rows: Sequence[Row]) -> str:
    """The rows as an aligned table, then a note for each row that is not ok."""
    header = Row("case", "expected", "got", "verdict")
    cells = [(r.case, r.expected, r.got, r.verdict) for r in (header, *rows)]
    widths = [max(len(row[i]) for row in cells) for i in range(3)]
    lines = [
        "  ".join(
            (*(cell.ljust(width) for cell, width in zip(row[:3], widths, strict=True)), row[3])
        ).rstrip()
        for row in cells
    ]
    notes = [f"{r.case}: {r.note}" for r in rows if r.verdict != OK and r.note]
    return "\n".join(lines + (["", *notes] if notes else []))


# -- a broker target -------------------------------------------------------------------------

# A broker hook's keys whose values are whole numbers; the others are text.
_NUMBER_KEYS = frozenset({"maxlen", "qos"})


def broker_kind(url: str) -> str | None:
    """The destination type whose hooks take `url`'s scheme, None for another scheme."""
    scheme = url.split("://", 1)[0].lower() if "://" in url else ""
    for kind, schemes in SCHEMES.items():
        if scheme in schemes:
            return kind
    return None


def broker_keys(pairs: Sequence[str]) -> dict[str, object]:
    """`--key NAME=VALUE` options as a broker hook's keys (maxlen and qos as numbers);
    ValueError naming the option that is not NAME=VALUE."""
    keys: dict[str, object] = {}
    for pair in pairs:
        name, equals, value = pair.partition("=")
        if not equals or not name:
            raise ValueError(f"--key {pair!r}: write it as NAME=VALUE, e.g. routing_key=efd.test")
        if name in _NUMBER_KEYS:
            if not (value.isascii() and value.isdigit()):
                raise ValueError(f"--key {name}: must be a whole number")
            keys[name] = int(value)
        else:
            keys[name] = value
    return keys


def broker_message(
    secrets: Sequence[str], keys: Sequence[bytes], *, now: int, run: str, user_agent: str
) -> Request:
    """The one test message published to a broker target: a track message signed as a
    broker destination with these secrets signs (the first of each), or unsigned."""
    make = _Builder(run, now, user_agent)
    return make.signed("broker", secret=secrets[0] if secrets else None, keys=keys[:1])
