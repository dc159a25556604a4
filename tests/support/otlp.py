"""A real OTLP/HTTP trace receiver for the tests: an aiohttp server on 127.0.0.1 that takes
POST /v1/traces (protobuf), decodes each ExportTraceServiceRequest with opentelemetry-proto
and keeps the spans, flattened."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field
from typing import Any

from aiohttp import web
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
    ExportTraceServiceRequest,
    ExportTraceServiceResponse,
)
from opentelemetry.proto.common.v1.common_pb2 import AnyValue, KeyValue
from opentelemetry.proto.trace.v1.trace_pb2 import Span


def _value(value: AnyValue) -> Any:
    kind = value.WhichOneof("value")
    return getattr(value, kind) if kind is not None else None


def attributes(pairs: Any) -> dict[str, Any]:
    found: dict[str, Any] = {}
    for pair in pairs:
        assert isinstance(pair, KeyValue)
        found[pair.key] = _value(pair.value)
    return found


@dataclass(frozen=True)
class Link:
    trace_id: str
    span_id: str


@dataclass(frozen=True)
class Received:
    """One span as the collector got it; ids as lowercase hex."""

    name: str
    kind: int  # Span.SpanKind: SERVER 2, CLIENT 3, PRODUCER 4, INTERNAL 1
    trace_id: str
    span_id: str
    parent_span_id: str  # "" for a root
    trace_state: str
    attributes: dict[str, Any]
    links: tuple[Link, ...]
    start_ns: int
    end_ns: int
    status_code: int  # Status.StatusCode: UNSET 0, OK 1, ERROR 2
    resource: dict[str, Any]


SERVER = Span.SPAN_KIND_SERVER
CLIENT = Span.SPAN_KIND_CLIENT
PRODUCER = Span.SPAN_KIND_PRODUCER
INTERNAL = Span.SPAN_KIND_INTERNAL


@dataclass
class OtlpReceiver:
    spans: list[Received] = field(default_factory=list)
    requests: int = 0
    content_types: list[str] = field(default_factory=list)
    url: str = ""
    _runner: web.AppRunner | None = None

    async def start(self) -> OtlpReceiver:
        app = web.Application()
        app.router.add_post("/v1/traces", self._export)
        self._runner = web.AppRunner(app, access_log=None, shutdown_timeout=0.5)
        await self._runner.setup()
        site = web.TCPSite(self._runner, "127.0.0.1", 0)
        await site.start()
        port = int(self._runner.addresses[0][1])
        self.url = f"http://127.0.0.1:{port}/v1/traces"
        return self

    async def stop(self) -> None:
        if self._runner is not None:
            await self._runner.cleanup()

    async def _export(self, request: web.Request) -> web.Response:
        self.requests += 1
        self.content_types.append(request.content_type)
        export = ExportTraceServiceRequest()
        export.ParseFromString(await request.read())
        for resource_spans in export.resource_spans:
            resource = attributes(resource_spans.resource.attributes)
            for scope in resource_spans.scope_spans:
                for span in scope.spans:
                    self.spans.append(
                        Received(
                            name=span.name,
                            kind=span.kind,
                            trace_id=span.trace_id.hex(),
                            span_id=span.span_id.hex(),
                            parent_span_id=span.parent_span_id.hex(),
                            trace_state=span.trace_state,
                            attributes=attributes(span.attributes),
                            links=tuple(
                                Link(link.trace_id.hex(), link.span_id.hex()) for link in span.links
                            ),
                            start_ns=span.start_time_unix_nano,
                            end_ns=span.end_time_unix_nano,
                            status_code=span.status.code,
                            resource=resource,
                        )
                    )
        return web.Response(
            body=ExportTraceServiceResponse().SerializeToString(),
            content_type="application/x-protobuf",
        )

    def of_kind(self, kind: int) -> list[Received]:
        return [span for span in self.spans if span.kind == kind]

    async def wait_for(self, count: int, kind: int | None = None, timeout: float = 15.0) -> None:
        """Until `count` spans (of `kind`) arrived; the exporter sends every few seconds."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        while len(self.spans if kind is None else self.of_kind(kind)) < count:
            if loop.time() > deadline:
                raise AssertionError(f"expected {count} spans, got {self.spans!r}")
            await asyncio.sleep(0.05)
