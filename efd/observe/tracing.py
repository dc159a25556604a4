"""OpenTelemetry traces (docs/telemetry.md): the one place the rest of efd asks whether
tracing is on, and the tracer when it is.

Off (no `[telemetry] otlp_endpoint`), `current()` is None and the OpenTelemetry SDK is never
imported: the ingestion handler and the senders test one global and go on as before. On,
`start` imports efd/observe/otel.py, which holds the SDK's tracer provider and its exporter.
"""

from __future__ import annotations

import asyncio
import logging
from typing import TYPE_CHECKING

from efd.observe.tracecontext import RoundTrace

if TYPE_CHECKING:
    from efd.observe.otel import Tracer

log = logging.getLogger(__name__)

__all__ = ["RoundTrace", "current", "start", "stop"]

_current: Tracer | None = None


def current() -> Tracer | None:
    """The daemon's tracer; None when telemetry is off."""
    return _current


def start(endpoint: str, *, service_name: str, ratio: float, version: str) -> Tracer:
    """Make a tracer that exports to `endpoint` (`[telemetry]`) this process's current one."""
    global _current
    from efd.observe.otel import Tracer  # the SDK only when telemetry is on

    tracer = Tracer(endpoint=endpoint, service_name=service_name, ratio=ratio, version=version)
    _current = tracer
    log.info(
        "tracing to %s as %s, %g of the traces efd starts sampled", endpoint, service_name, ratio
    )
    return tracer


async def stop(tracer: Tracer) -> None:
    """Stop tracing: spans still queued are exported (within the exporter's timeout), in a
    thread, so the event loop goes on meanwhile."""
    global _current
    if _current is tracer:
        _current = None
    await asyncio.to_thread(tracer.shutdown)
