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

Attempt spans are made in the daemon: as the dispatcher hands a round to the senders, each
hook's span gets its ids (and the request its headers); when the results come back, each
span is made finished, from the attempt's own start and duration as the sender measured
them, and queued for export. A sender process sends the headers it is given and makes no
span, so nothing is exported from the child processes. The attempt spans are the SDK's
spans written as protobuf bytes where their results arrive (efd/observe/otlpwire.py) and
queued in the SDK's batching processor: the SDK's live spans and its generic encoding cost
more than the rest of a delivery (bench/LOG.md).
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import random
from collections.abc import Iterator, Mapping, Sequence
from typing import Any, Protocol, cast
from urllib.parse import urlsplit

from opentelemetry import trace
from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor, SpanExportResult
from opentelemetry.sdk.trace.sampling import Decision, ParentBased, TraceIdRatioBased
from opentelemetry.sdk.util.instrumentation import InstrumentationScope
from opentelemetry.trace import SpanContext, SpanKind, Status, StatusCode, TraceFlags

from efd.observe import otlpwire, tracecontext
from efd.observe.tracecontext import RoundTrace, TraceParent
from efd.segment.webhooks import redact_url

log = logging.getLogger(__name__)

# How long the exporter waits for the collector, and how long shutdown waits for the last
# export: a collector that is down costs the daemon nothing but the spans.
EXPORT_TIMEOUT_SECONDS = 5.0
# Spans waiting for export at most (more are dropped), and the most in one request.
QUEUE_SPANS = 8192
BATCH_SPANS = 2048
_HTTP = ("http", "https")

# A round's trace headers: each hook's traceparent, in the order of the round's hooks, and
# the tracestate they all carry ("" when none). Plain strings: they cross the sender
# processes' pipe with each round.
Wire = tuple[tuple[str, ...], str]


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


@functools.lru_cache(maxsize=1024)
def _remote(stored: str | None) -> tuple[SpanContext | None, str]:
    """A stored (or received) context as the span context of a remote parent, and the
    tracestate to pass on ("" when none); (None, "") for none. Cached: the messages of one
    request share theirs, and so do a message's deliveries."""
    found = tracecontext.from_stored(stored)
    if found is None:
        return None, ""
    parent, state = found
    members = tracecontext.parse_tracestate(state) if state else None
    span_context = SpanContext(
        parent.trace_id,
        parent.span_id,
        is_remote=True,
        trace_flags=TraceFlags(parent.flags & 0xFF),
        trace_state=trace.TraceState(list(members or ())),
    )
    return span_context, tracecontext.format_tracestate(members) if members else ""


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
        self.resource = Resource.create({"service.name": service_name, "service.version": version})
        self.scope = InstrumentationScope("efd", version)
        # A request's traceparent decides for its trace (sampled or not); the ratio decides
        # for the traces efd starts.
        self._sampler = ParentBased(TraceIdRatioBased(ratio))
        self._provider = TracerProvider(resource=self.resource, sampler=self._sampler)
        exporter = _Exporter(endpoint=endpoint, timeout=EXPORT_TIMEOUT_SECONDS)
        # Larger batches than the SDK's 512: one span per delivered event, and each export's
        # HTTP request costs as much as a few hundred spans' encoding.
        self._processor = BatchSpanProcessor(
            exporter,
            max_queue_size=QUEUE_SPANS,
            max_export_batch_size=BATCH_SPANS,
            export_timeout_millis=EXPORT_TIMEOUT_SECONDS * 1000,
        )
        self._provider.add_span_processor(self._processor)
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
        remote, state = _remote(stored)
        context = (
            trace.set_span_in_context(trace.NonRecordingSpan(remote))
            if remote is not None
            else None
        )
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
        """The ids of one round's attempt spans, one per hook, and their headers for the
        requests; the spans themselves are made by `Attempts.finish`, from the results."""
        parent, state = _remote(trace_.context)
        if parent is not None:
            trace_id, sampled = parent.trace_id, parent.trace_flags.sampled
        else:
            trace_id = _random_id(128)
            decision = self._sampler.should_sample(None, trace_id, method)
            sampled = decision.decision is Decision.RECORD_AND_SAMPLE
        ids = {hook: _random_id(64) for hook in hooks}
        # format_traceparent's text, its trace id and flags written once for the round.
        head, tail = f"{tracecontext.VERSION}-{trace_id:032x}-", "-01" if sampled else "-00"
        traceparents = tuple(f"{head}{ids[hook]:016x}{tail}" for hook in hooks)
        return Attempts(
            self if sampled else None,
            trace_id,
            parent,
            ids,
            (traceparents, state),
            (destination, method, labels, url, trace_),
        )

    def record(self, span: ReadableSpan | otlpwire.Encoded) -> None:
        """Hand a finished span to the exporter's queue."""
        self._processor.on_end(span)  # type: ignore[arg-type]  # it reads only the context


class _Exporter(OTLPSpanExporter):
    """The SDK's OTLP/HTTP exporter (its transport, retries, headers, TLS and compression,
    the environment's OTEL_EXPORTER_OTLP_TRACES_* included), the request written by
    efd/observe/otlpwire.py instead of the SDK's encoder, which cost more per span than a
    delivery. What otlpwire does not write (spans with events), or an exporter without the
    client it sends with, goes through the SDK's own path."""

    def export(self, spans: Sequence[ReadableSpan]) -> SpanExportResult:
        client = getattr(self, "_client", None)
        if client is None or getattr(self, "_shutdown", False) or not otlpwire.writable(spans):
            # The attempts' spans are written already (Attempts.finish): only otlpwire sends them.
            if any(isinstance(cast(Any, span), otlpwire.Encoded) for span in spans):
                log.error(
                    "cannot export %d spans: the exporter is shut down, or has no client",
                    len(spans),
                )
                return SpanExportResult.FAILURE
            return super().export(spans)
        try:
            data = otlpwire.request(spans)
        except Exception:
            log.exception("cannot write %d spans; the SDK's encoder takes them", len(spans))
            return super().export(spans)
        result = client.export(data)
        return SpanExportResult.SUCCESS if result.success else SpanExportResult.FAILURE


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
        # No exception event: a refused request is the ingestion span's status code.
        with self._tracer.start_as_current_span(
            "route", context=context, record_exception=False
        ) as span:
            yield span

    def answered(self, status: int) -> None:
        """The answer's status (5xx: the span's status is an error, a client's 4xx not)."""
        self.span.set_attribute("http.response.status_code", status)
        if status >= 500:
            self.span.set_attribute("error.type", str(status))
            self.span.set_status(Status(StatusCode.ERROR))

    def end(self) -> None:
        self.span.end()


class Attempts:
    """A round's attempt spans: `wire`, the requests' trace headers; `finish` makes and
    records the spans from the round's results (nothing when the trace is not sampled)."""

    def __init__(
        self,
        tracer: Tracer | None,
        trace_id: int,
        parent: SpanContext | None,
        ids: dict[str, int],
        wire: Wire,
        round_: tuple[str, str, Mapping[str, str], str | None, RoundTrace],
    ) -> None:
        self._tracer = tracer
        self._trace_id = trace_id
        self._parent = parent
        self._ids = ids
        self.wire = wire
        self._round = round_

    def finish(self, results: Sequence[Result]) -> None:
        """Record each result's span: from its start for its duration. A hook answered twice
        (an action's OAuth2 token renewed after a 401) has a span for each request."""
        tracer = self._tracer
        if tracer is None:
            return
        destination, method, labels, url, trace_ = self._round
        parent = self._parent
        # Written as protobuf bytes here (efd/observe/otlpwire.py), the fixed part once per
        # hook: a ReadableSpan and its generic encoding cost twice as much.
        if parent is not None:
            links = otlpwire.link(parent.trace_id, parent.span_id, parent.is_remote)
            above: tuple[int, bool] | None = (parent.span_id, parent.is_remote)
        else:
            links, above = b"", None
        state = self.wire[1]
        ids = self._ids
        for result in results:
            hook = result.hook_url
            span_id = ids.pop(hook, None) or _random_id(64)
            fixed = _prefix(destination, method, hook, labels.get(hook), url)
            attributes: dict[str, Any] = {"efd.delivery.id": trace_.delivery_id}
            if trace_.retries:
                attributes["http.request.resend_count"] = trace_.retries
            if result.status_code is not None:
                attributes["http.response.status_code"] = result.status_code
            code, message = 0, ""
            if result.verdict != "success":
                message = result.error_class or (
                    str(result.status_code) if result.status_code is not None else "failed"
                )
                attributes["error.type"] = message
                code = StatusCode.ERROR.value
            start = _ns(result.started_at)
            encoded = otlpwire.attempt_span(
                fixed,
                self._trace_id,
                span_id,
                above,
                state,
                start,
                start + max(0, _ns(result.duration)),
                attributes,
                links,
                code,
                message,
            )
            tracer.record(otlpwire.Encoded(encoded, tracer.resource, tracer.scope))

    def finish_task(self, task: asyncio.Future[Any]) -> None:
        """`finish` as a round's done callback: a round cancelled at shutdown records
        nothing."""
        if not task.cancelled() and task.exception() is None:
            self.finish(task.result())


def _random_id(bits: int) -> int:
    while True:
        value = random.getrandbits(bits)
        if value:  # an all-zero id is invalid
            return value


@functools.lru_cache(maxsize=4096)
def _static_attributes(
    destination: str, method: str, hook: str, label: str | None, url: str | None
) -> tuple[tuple[tuple[str, Any], ...], SpanKind, str]:
    """What an attempt span of this hook says whatever the attempt: computed once."""
    target = url or hook
    parts = urlsplit(target)
    scheme = parts.scheme
    attributes: list[tuple[str, Any]] = [("efd.destination", destination)]
    if scheme in _HTTP:
        attributes += [
            ("http.request.method", method),
            ("url.full", label if url is None and label else redact_url(target)),
        ]
        if parts.hostname:
            attributes.append(("server.address", parts.hostname))
        attributes.append(("server.port", parts.port or (443 if scheme == "https" else 80)))
        return tuple(attributes), SpanKind.CLIENT, method
    attributes += [
        ("messaging.system", scheme),
        ("messaging.operation.type", "send"),
        ("efd.hook", label or redact_url(hook)),
    ]
    return tuple(attributes), SpanKind.PRODUCER, f"send {destination}"


@functools.lru_cache(maxsize=4096)
def _prefix(destination: str, method: str, hook: str, label: str | None, url: str | None) -> bytes:
    fixed, kind, name = _static_attributes(destination, method, hook, label, url)
    return otlpwire.prefix(name, kind.value, dict(fixed))
