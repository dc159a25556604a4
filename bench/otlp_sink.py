"""An OTLP/HTTP trace collector for benchmarking efd with `[telemetry]` on: takes POST
/v1/traces on 127.0.0.1, decodes each request with opentelemetry-proto, counts the spans and
prints the count each time it changes (and at SIGINT/SIGTERM), so a run shows that the spans
arrived. Usage: python bench/otlp_sink.py [PORT] (default 4318), then run the bench with
EFD_TELEMETRY__OTLP_ENDPOINT=http://127.0.0.1:PORT/v1/traces.
"""

from __future__ import annotations

import asyncio
import signal
import sys

from aiohttp import web
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
    ExportTraceServiceRequest,
    ExportTraceServiceResponse,
)

_ANSWER = ExportTraceServiceResponse().SerializeToString()


async def main(port: int) -> None:
    spans = 0

    async def export(request: web.Request) -> web.Response:
        nonlocal spans
        decoded = ExportTraceServiceRequest()
        decoded.ParseFromString(await request.read())
        spans += sum(
            len(scope.spans)
            for resource in decoded.resource_spans
            for scope in resource.scope_spans
        )
        print(f"spans {spans}", flush=True)
        return web.Response(body=_ANSWER, content_type="application/x-protobuf")

    app = web.Application()
    app.router.add_post("/v1/traces", export)
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    await web.TCPSite(runner, "127.0.0.1", port).start()
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    print(f"listening on http://127.0.0.1:{port}/v1/traces", flush=True)
    await stop.wait()
    await runner.cleanup()
    print(f"spans {spans} in all", flush=True)


if __name__ == "__main__":
    asyncio.run(main(int(sys.argv[1]) if len(sys.argv) > 1 else 4318))
