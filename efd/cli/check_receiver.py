"""`efd check-receiver URL`: sends the cases of efd/cli/receiver_check.py to a receiver
through efd's own sender (the same timeout, TLS and client certificate, no redirects, no
proxy) and prints how it answered each. For a broker's URL (amqp://, nats://, redis://,
mqtt://, their TLS forms) it publishes one test message and prints what the broker answered.

The address guard is off: an operator names the URL, and a receiver being set up is often
on a private network or on this host."""

from __future__ import annotations

import secrets as random_tokens
import time
from collections.abc import Sequence

from efd.brokers.targets import Target
from efd.cli import receiver_check
from efd.cli.receiver_check import Answer, Row
from efd.delivery.retry import AttemptResult, Verdict
from efd.delivery.sender import Sender
from efd.segment import webhooks
from efd.segment.webhooks import ClientCert

ANYWHERE = ("0.0.0.0/0", "::/0")


async def check(
    url: str,
    secrets: Sequence[str],
    keys: Sequence[bytes],
    *,
    timeout: float,
    user_agent: str,
    ca_file: str | None = None,
    client: ClientCert | None = None,
) -> list[Row]:
    """Send each case in turn, each request after the answer to the one before; the rows
    of the table, the answer-time row last."""
    cases = receiver_check.cases(
        secrets,
        keys,
        now=int(time.time()),
        run=random_tokens.token_hex(6),
        user_agent=user_agent,
    )
    sender = Sender(
        timeout=timeout, allowed_networks=ANYWHERE, ca_file=ca_file, response_head_bytes=0
    )
    await sender.start()
    rows: list[Row] = []
    every: list[Answer] = []
    try:
        for case in cases:
            answers = []
            for request in case.requests:
                result = await sender.post(url, request.body, dict(request.headers), client)
                answers.append(
                    Answer(result.status_code, result.duration, result.error_class, result.error)
                )
            every += answers
            rows.append(receiver_check.judge(case, answers))
    finally:
        await sender.close()
    rows.append(receiver_check.timing(every, timeout))
    return rows


def report(url: str, rows: Sequence[Row]) -> str:
    sent = sum(1 for row in rows if row.verdict != receiver_check.SKIPPED) - 1
    verdict = (
        "the receiver answers as docs/delivery.md#receivers asks"
        if receiver_check.passed(rows)
        else "the receiver does NOT answer as docs/delivery.md#receivers asks"
    )
    return (
        f"efd check-receiver {webhooks.redact_url(url)}: {sent} cases\n\n"
        f"{receiver_check.table(rows)}\n\n{verdict}"
    )


async def publish(
    target: Target,
    secrets: Sequence[str],
    keys: Sequence[bytes],
    *,
    timeout: float,
    user_agent: str,
    ca_file: str | None = None,
    client: ClientCert | None = None,
) -> AttemptResult:
    """Publish one signed test message to a broker target through efd's own sender (the
    daemon's publish path, its timeout and TLS), and what the broker answered."""
    request = receiver_check.broker_message(
        secrets, keys, now=int(time.time()), run=random_tokens.token_hex(6), user_agent=user_agent
    )
    sender = Sender(
        timeout=timeout, allowed_networks=ANYWHERE, ca_file=ca_file, response_head_bytes=512
    )
    await sender.start()
    try:
        return await sender.publish(target, target.url, request.body, request.headers, client)
    finally:
        await sender.close()


def broker_report(target: Target, result: AttemptResult) -> str:
    what = target.name.rule.what
    head = f"efd check-receiver {target.label}: one test message to the {what} "
    head += repr(target.name.source)
    if result.verdict is Verdict.SUCCESS:
        return f"{head}\n\nthe broker confirmed it: {result.response_head}"
    return (
        f"{head}\n\nthe broker did not confirm it ({result.error_class}): {result.error}\n"
        f"efd would {'retry' if result.verdict is Verdict.RETRY else 'give up on this hook'}"
    )
