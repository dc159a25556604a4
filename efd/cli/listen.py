"""`efd listen`: a webhook receiver that prints what arrives and does what
docs/delivery.md asks of receivers: it verifies, refuses what does not verify, and
acknowledges a repeated webhook-id without processing it again."""

from __future__ import annotations

import asyncio
import hmac
import json
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime

from aiohttp import web

from efd.observe import logs
from efd.segment import webhooks

# How far a webhook-timestamp may be from now, as the Standard Webhooks libraries allow.
TOLERANCE_SECONDS = 300
# The answer to a request that does not verify: a 4xx efd does not retry.
REFUSED = 401
# webhook-ids remembered as processed; the oldest are forgotten first.
_REMEMBERED_IDS = 100_000


def verify_standard(
    keys: list[bytes], body: bytes, headers: dict[str, str], now: float
) -> str | None:
    """None when one of the webhook-signature's v1 signatures is by one of `keys` and the
    timestamp is within the tolerance; otherwise what is wrong."""
    lower = {k.lower(): v for k, v in headers.items()}
    msg_id = lower.get(webhooks.WEBHOOK_ID)
    stamp = lower.get(webhooks.WEBHOOK_TIMESTAMP)
    given = lower.get(webhooks.WEBHOOK_SIGNATURE)
    if not (msg_id and stamp and given):
        return "MISSING headers"
    if not (msg_id.isascii() and msg_id.isprintable()):
        # efd's ids are ASCII: Node.js reads header bytes as Latin-1, so verifiers there
        # would sign other bytes than a sender that wrote UTF-8.
        return "INVALID webhook-id (not printable ASCII)"
    if not stamp.isdigit() or abs(now - int(stamp)) > TOLERANCE_SECONDS:
        return "INVALID timestamp (more than 5 minutes off)"
    expected = set(webhooks.standard_signature(keys, msg_id, int(stamp), body).split(" "))
    for signature in given.split(" "):
        if any(hmac.compare_digest(signature, e) for e in expected):
            return None
    return "INVALID"


@dataclass(frozen=True, slots=True)
class Verdicts:
    """What efd listen found of one request's signatures."""

    x_signature: str
    standard: str
    # Why the request is refused; None: accepted. A request is accepted when a signature
    # efd listen holds a secret for verifies and none that it holds a secret for fails.
    refused: str | None


def verify(
    body: bytes,
    headers: dict[str, str],
    secrets: Sequence[str],
    keys: list[bytes],
    now: float,
) -> Verdicts:
    lower = {k.lower(): v for k, v in headers.items()}
    signature = lower.get(webhooks.SIGNATURE_HEADER.lower())
    standard = lower.get(webhooks.WEBHOOK_SIGNATURE)
    checked: dict[str, str] = {}
    if not secrets:
        x_signature = "not checked (no --secret)" if signature else "none sent"
    elif signature is None:
        x_signature = checked["X-Signature"] = "MISSING"
    else:
        valid = any(webhooks.verify(secret, body, signature) for secret in secrets)
        x_signature = checked["X-Signature"] = "valid" if valid else "INVALID"
    if not keys:
        standard_verdict = (
            "not checked (no --standard-webhooks-secret)" if standard else "none sent"
        )
    else:
        standard_verdict = verify_standard(keys, body, headers, now) or "valid"
        checked["webhook-signature"] = standard_verdict
    refused = None
    if checked:
        invalid = [f"{name} {v}" for name, v in checked.items() if v.startswith("INVALID")]
        if invalid:
            refused = "; ".join(invalid)
        elif "valid" not in checked.values():
            refused = " and ".join(f"{name} {v}" for name, v in checked.items())
    return Verdicts(x_signature, standard_verdict, refused)


def describe(body: bytes, headers: dict[str, str], verdicts: Verdicts) -> str:
    lower = {k.lower(): v for k, v in headers.items()}
    try:
        shown = json.dumps(json.loads(body), indent=2, ensure_ascii=False)
    except ValueError:
        shown = body.decode("utf-8", "replace")
    return (
        f"User-Agent: {lower.get('user-agent', '')}\n"
        f"X-Signature: {lower.get(webhooks.SIGNATURE_HEADER.lower()) or '-'} "
        f"({verdicts.x_signature})\n"
        f"webhook-id: {lower.get(webhooks.WEBHOOK_ID, '-')}, "
        f"webhook-signature: ({verdicts.standard})\n{shown}"
    )


class _Processed:
    """The webhook-ids answered 2xx, the oldest forgotten past a bound."""

    def __init__(self) -> None:
        self._ids: dict[str, None] = {}

    def __contains__(self, webhook_id: str) -> bool:
        return webhook_id in self._ids

    def add(self, webhook_id: str) -> None:
        self._ids[webhook_id] = None
        if len(self._ids) > _REMEMBERED_IDS:
            del self._ids[next(iter(self._ids))]


def _print(text: str) -> None:
    # What a sender put in its path, headers or body must not drive the terminal.
    print("\n".join(logs.escape(line) for line in text.split("\n")), flush=True)


async def serve(
    host: str,
    port: int,
    secrets: Sequence[str],
    status: int,
    standard: Sequence[str] = (),
) -> None:
    keys = [webhooks.standard_secret(s) for s in standard]
    processed = _Processed()

    async def receive(request: web.Request) -> web.Response:
        body = await request.read()
        headers = dict(request.headers)
        stamp = datetime.now().strftime("%H:%M:%S.%f")[:-3]
        head = f"--- {stamp} {request.method} {request.path_qs}"
        verdicts = verify(body, headers, secrets, keys, time.time())
        if verdicts.refused is not None:
            _print(f"{head}\n{describe(body, headers, verdicts)}\nrefused ({REFUSED})")
            return web.json_response({"received": False, "error": verdicts.refused}, status=REFUSED)
        webhook_id = request.headers.get(webhooks.WEBHOOK_ID)
        if webhook_id and webhook_id in processed:
            repeat = f"repeat of webhook-id {webhook_id}: acknowledged ({status})"
            _print(f"{head}\n{repeat}, not processed again")
            return web.json_response({"received": True, "repeat": True}, status=status)
        _print(f"{head}\n{describe(body, headers, verdicts)}")
        if webhook_id and 200 <= status < 300:
            processed.add(webhook_id)
        return web.json_response({"received": True}, status=status)

    app = web.Application(client_max_size=16 * 1024**2)
    app.router.add_route("*", "/{tail:.*}", receive)
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    await web.TCPSite(runner, host, port).start()
    print(
        f"efd listen: printing webhooks sent to http://{host}:{port}/", file=sys.stderr, flush=True
    )
    try:
        await asyncio.Event().wait()
    finally:
        await runner.cleanup()
