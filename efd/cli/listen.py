"""`efd listen`: a webhook receiver that prints what arrives and checks its signature."""

from __future__ import annotations

import asyncio
import hmac
import json
import sys
import time
from datetime import datetime

from aiohttp import web

from efd.observe import logs
from efd.rules import webhooks

# How far a webhook-timestamp may be from now, as the Standard Webhooks libraries allow.
TOLERANCE_SECONDS = 300


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


def describe(
    body: bytes, headers: dict[str, str], secret: str | None, keys: list[bytes] | None = None
) -> str:
    signature = headers.get(webhooks.SIGNATURE_HEADER)
    if secret is None:
        verdict = "not checked (no --secret)" if signature else "none sent"
    elif signature is None:
        verdict = "MISSING"
    else:
        verdict = "valid" if webhooks.verify(secret, body, signature) else "INVALID"
    lower = {k.lower(): v for k, v in headers.items()}
    standard = lower.get(webhooks.WEBHOOK_SIGNATURE)
    if not keys:
        checked = "not checked (no --standard-webhooks-secret)" if standard else "none sent"
    else:
        checked = verify_standard(keys, body, headers, time.time()) or "valid"
    try:
        shown = json.dumps(json.loads(body), indent=2, ensure_ascii=False)
    except ValueError:
        shown = body.decode("utf-8", "replace")
    return (
        f"User-Agent: {headers.get('User-Agent', '')}\n"
        f"X-Signature: {signature or '-'} ({verdict})\n"
        f"webhook-id: {lower.get(webhooks.WEBHOOK_ID, '-')}, "
        f"webhook-signature: ({checked})\n{shown}"
    )


async def serve(
    host: str, port: int, secret: str | None, status: int, standard: list[str] | None = None
) -> None:
    keys = [webhooks.standard_secret(s) for s in standard or []]

    async def receive(request: web.Request) -> web.Response:
        body = await request.read()
        stamp = datetime.now().strftime("%H:%M:%S.%f")[:-3]
        text = describe(body, dict(request.headers), secret, keys)
        shown = f"--- {stamp} {request.method} {request.path_qs}\n{text}"
        # What a sender put in its path, headers or body must not drive the terminal.
        print("\n".join(logs.escape(line) for line in shown.split("\n")), flush=True)
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
