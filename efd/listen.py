"""`efd listen`: a webhook receiver that prints what arrives and checks its signature."""

from __future__ import annotations

import asyncio
import json
import sys
from datetime import datetime

from aiohttp import web

from efd import webhooks


def describe(body: bytes, headers: dict[str, str], secret: str | None) -> str:
    signature = headers.get(webhooks.SIGNATURE_HEADER)
    if secret is None:
        verdict = "not checked (no --secret)" if signature else "none sent"
    elif signature is None:
        verdict = "MISSING"
    else:
        verdict = "valid" if webhooks.verify(secret, body, signature) else "INVALID"
    try:
        shown = json.dumps(json.loads(body), indent=2, ensure_ascii=False)
    except ValueError:
        shown = body.decode("utf-8", "replace")
    return (
        f"User-Agent: {headers.get('User-Agent', '')}\n"
        f"X-Signature: {signature or '-'} ({verdict})\n{shown}"
    )


async def serve(host: str, port: int, secret: str | None, status: int) -> None:
    async def receive(request: web.Request) -> web.Response:
        body = await request.read()
        stamp = datetime.now().strftime("%H:%M:%S.%f")[:-3]
        text = describe(body, dict(request.headers), secret)
        print(f"--- {stamp} {request.method} {request.path_qs}\n{text}", flush=True)
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
