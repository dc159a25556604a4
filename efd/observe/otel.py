"""efd's spans, made with OpenTelemetry's SDK and exported by OTLP over HTTP/protobuf.
Imported only when telemetry is on (efd/observe/tracing.py).

- The ingestion request: a SERVER span, the child of the request's `traceparent` when it
  has a valid one. Its context is stored with each message it accepted
  (messages.trace_context).
- Routing: an INTERNAL child of it, over parsing, validation and the routes' choice.
- Each delivery attempt: a CLIENT span (PRODUCER for a broker's hook) in the message's
  trace, the child of the stored ingestion context and linked to it, however much later or
  from whichever daemon it is sent. Its context goes out as the request's `traceparent`
  (and `tracestate`), so the receiver's trace continues it.

Attempt spans are made in the daemon, around the round as the dispatcher hands it to the
senders: a sender process sends the headers it is given and makes no span, so nothing is
exported from the child processes. A span begins as the round is handed over and ends at
the attempt's own end (its start plus its duration as the sender measured it).
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Iterator, Mapping, Sequence
from typing import Any, Protocol
from urllib.parse import urlsplit

from opentelemetry import context as otel_context
from opentelemetry import trace
from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor
from opentelemetry.sdk.trace.sampling import ParentBased, TraceIdRatioBased
from opentelemetry.trace import Link, SpanContext, SpanKind, Status, StatusCode, TraceFlags

from efd.observe import tracecontext
from efd.observe.tracecontext import RoundTrace, TraceParent
from efd.segment.webhooks import redact_url

# How long the exporter waits for the collector, and how long shutdown waits for the last
# export: a collector that is down costs the daemon nothing but the spans.
EXPORT_TIMEOUT_SECONDS = 5.0
_HTTP = ("http", "https")

Headers = Mapping[str, Mapping[str, str]]  # hook URL -> the trace headers its request carries


class Result(Protocol):
    """What an attempt span records of an attempt (efd/delivery/retry.py's AttemptResult)."""

    @property
    def hook_url(self) -> str: ...
    @property
    def started_at(self) -> float: ...  # UNIX seconds
    @property
    def duration(self) -> float: ...  # seconds
    @property
    def verdict(self) -> str: ...  # "success", "retry" or "fail"
    @property
    def status_code(self) -> int | None: ...
    @property
    def error_class(self) -> str | None: ...


def _parent(stored: str | None) -> tuple[otel_context.Context | None, SpanContext | None, str]:
    """A stored (or received) context as the SDK's parent context, the span context to link
    to, and the tracestate to pass on ("" when none)."""
    found = tracecontext.from_stored(stored)
    if found is None:
        return None, None, ""
    parent, state = found
    members = tracecontext.parse_tracestate(state) if state else None
    span_context = SpanContext(
        parent.trace_id,
        parent.span_id,
        is_remote=True,
        trace_flags=TraceFlags(parent.flags & 0xFF),
        trace_state=trace.TraceState(list(members or ())),
    )
    context = trace.set_span_in_context(trace.NonRecordingSpan(span_context))
    return context, span_context, tracecontext.format_tracestate(members) if members else ""


def _stored(span: trace.Span, state: str) -> str:
    context = span.get_span_context()
    return tracecontext.stored(
        TraceParent(context.trace_id, context.span_id, int(context.trace_flags)), state or None
    )


def _ns(seconds: float) -> int:
    return int(seconds * 1e9)


class Tracer:
    """The tracer provider (sampler, batching processor, OTLP/HTTP exporter) and the spans
    efd makes. Owns the exporter's thread; `shutdown` flushes and stops it."""

    def __init__(self, *, endpoint: str, service_name: str, ratio: float, version: str) -> None:
        resource = Resource.create({"service.name": service_name, "service.version": version})
        # A request's traceparent decides for its trace (sampled or not); the ratio decides
        # for the traces efd starts.
        self._provider = TracerProvider(
            resource=resource, sampler=ParentBased(TraceIdRatioBased(ratio))
        )
        exporter = OTLPSpanExporter(endpoint=endpoint, timeout=EXPORT_TIMEOUT_SECONDS)
        self._provider.add_span_processor(
            BatchSpanProcessor(exporter, export_timeout_millis=EXPORT_TIMEOUT_SECONDS * 1000)
        )
        self._tracer = self._provider.get_tracer("efd", version)

    def shutdown(self) -> None:
        """Export what is queued and stop (blocking: run it in a thread)."""
        self._provider.shutdown()

    def flush(self, timeout_seconds: float = EXPORT_TIMEOUT_SECONDS) -> bool:
        """Export what is queued now (blocking); whether it all went."""
        return self._provider.force_flush(int(timeout_seconds * 1000))

    # -- ingestion ---------------------------------------------------------------------------

    def ingestion(
        self, method: str, route: str, traceparent: Sequence[str], tracestate: Sequence[str]
    ) -> Ingestion:
        """The span of one ingestion request, the child of its `traceparent` when it has
        exactly one valid one (its `tracestate` passed on when valid too)."""
        stored = None
        if len(traceparent) == 1:
            parent = tracecontext.parse_traceparent(traceparent[0])
            if parent is not None:
                members = tracecontext.parse_tracestate(list(tracestate)) if tracestate else None
                state = tracecontext.format_tracestate(members) if members else None
                stored = tracecontext.stored(parent, state)
        context, _, state = _parent(stored)
        span = self._tracer.start_span(
            f"{method} {route}",
            context=context,
            kind=SpanKind.SERVER,
            attributes={"http.request.method": method, "http.route": route, "url.path": route},
        )
        return Ingestion(self._tracer, span, _stored(span, state))

    # -- delivery attempts -------------------------------------------------------------------

    def round(
        self,
        destination: str,
        method: str,
        hooks: Sequence[str],
        labels: Mapping[str, str],
        url: str | None,
        trace_: RoundTrace,
    ) -> Attempts:
        """Begin the spans of one round, one per hook; their headers go with the requests."""
        context, linked, state = _parent(trace_.context)
        links = [Link(linked)] if linked is not None else []
        spans: dict[str, trace.Span] = {}
        headers: dict[str, dict[str, str]] = {}
        for hook in hooks:
            target = url or hook
            scheme = urlsplit(target).scheme
            full = labels.get(hook) if url is None else None
            attributes: dict[str, Any] = {
                "efd.destination": destination,
                "efd.delivery.id": trace_.delivery_id,
                "efd.hook": labels.get(hook) or redact_url(hook),
            }
            if trace_.retries:
                attributes["http.request.resend_count"] = trace_.retries
            if scheme in _HTTP:
                parts = urlsplit(target)
                attributes["http.request.method"] = method
                attributes["url.full"] = full or redact_url(target)
                if parts.hostname:
                    attributes["server.address"] = parts.hostname
                attributes["server.port"] = parts.port or (443 if scheme == "https" else 80)
                kind, name = SpanKind.CLIENT, method
            else:
                attributes["messaging.system"] = scheme
                attributes["messaging.operation.type"] = "send"
                kind, name = SpanKind.PRODUCER, f"send {destination}"
            span = self._tracer.start_span(
                name, context=context, kind=kind, attributes=attributes, links=links
            )
            spans[hook] = span
            sent = span.get_span_context()
            parent = TraceParent(sent.trace_id, sent.span_id, int(sent.trace_flags))
            pair = {"traceparent": tracecontext.format_traceparent(parent)}
            if state:
                pair["tracestate"] = state
            headers[hook] = pair
        return Attempts(self._tracer, spans, headers, context, links)


class Ingestion:
    """One ingestion request's span, and the context its messages are stored with."""

    def __init__(self, tracer: trace.Tracer, span: trace.Span, stored: str) -> None:
        self._tracer = tracer
        self.span = span
        self.stored = stored  # messages.trace_context of what this request stores

    @contextlib.contextmanager
    def routing(self) -> Iterator[trace.Span]:
        """The routing span, a child of the request's, around parsing and routing."""
        context = trace.set_span_in_context(self.span)
        with self._tracer.start_as_current_span("route", context=context) as span:
            yield span

    def answered(self, status: int, source: str | None = None) -> None:
        """The answer's status (5xx: the span's status is an error); and the source."""
        self.span.set_attribute("http.response.status_code", status)
        if source is not None:
            self.span.set_attribute("efd.source", source)
        if status >= 500:
            self.span.set_attribute("error.type", str(status))
            self.span.set_status(Status(StatusCode.ERROR))

    def end(self) -> None:
        self.span.end()


class Attempts:
    """A round's attempt spans: `headers` for the requests, ended by `finish` with the
    round's results (or `abandon` when the round never answered)."""

    def __init__(
        self,
        tracer: trace.Tracer,
        spans: dict[str, trace.Span],
        headers: dict[str, dict[str, str]],
        context: otel_context.Context | None,
        links: list[Link],
    ) -> None:
        self._tracer = tracer
        self._spans = spans
        self.headers: Headers = headers
        self._context = context
        self._links = links

    def finish(self, results: Sequence[Result]) -> None:
        """End each hook's span with its result. A hook answered twice (an OAuth2 token
        renewed after a 401) has a span for its first request and one more, a sibling, for
        the second."""
        spans = self._spans
        for result in results:
            span = spans.pop(result.hook_url, None)
            if span is None:
                span = self._tracer.start_span(
                    "POST",
                    context=self._context,
                    kind=SpanKind.CLIENT,
                    links=self._links,
                    start_time=_ns(result.started_at),
                )
            _describe(span, result)
            span.end(end_time=max(_ns(result.started_at + result.duration), _start_of(span)))
        for span in spans.values():  # a hook the round sent nothing to
            span.end()
        spans.clear()

    def finish_task(self, task: asyncio.Future[Any]) -> None:
        """`finish` as a round's done callback."""
        if task.cancelled() or task.exception() is not None:
            for span in self._spans.values():
                span.set_status(Status(StatusCode.ERROR, "the round did not finish"))
                span.end()
            self._spans.clear()
            return
        self.finish(task.result())


def _start_of(span: trace.Span) -> int:
    start = getattr(span, "start_time", None)
    return start if isinstance(start, int) else 0


def _describe(span: trace.Span, result: Result) -> None:
    if result.status_code is not None:
        span.set_attribute("http.response.status_code", result.status_code)
    span.set_attribute("efd.attempt.outcome", str(result.verdict))
    if result.verdict != "success":
        error_type = result.error_class or (
            str(result.status_code) if result.status_code is not None else "failed"
        )
        span.set_attribute("error.type", error_type)
        span.set_status(Status(StatusCode.ERROR, error_type))
