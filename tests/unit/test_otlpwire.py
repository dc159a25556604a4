"""efd's OTLP protobuf writer (efd/observe/otlpwire.py) against the SDK's encoder: the same
spans, written by both, decode to the same ExportTraceServiceRequest."""

from __future__ import annotations

from typing import Any

import pytest
from opentelemetry.exporter.otlp.proto.common.trace_encoder import encode_spans
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import Event, ReadableSpan
from opentelemetry.sdk.util.instrumentation import InstrumentationScope
from opentelemetry.trace import (
    Link,
    SpanContext,
    SpanKind,
    Status,
    StatusCode,
    TraceFlags,
    TraceState,
)

from efd.observe import otlpwire

RESOURCE = Resource.create({"service.name": "efd", "service.version": "1.2.3"})
SCOPE = InstrumentationScope("efd", "1.2.3")
PARENT = SpanContext(
    0x4BF92F3577B34DA6A3CE929D0E0E4736,
    0x00F067AA0BA902B7,
    is_remote=True,
    trace_flags=TraceFlags(1),
    trace_state=TraceState([("congo", "t61rcWkgMzE")]),
)


def a_span(**changes: Any) -> ReadableSpan:
    fields: dict[str, Any] = {
        "name": "POST",
        "context": SpanContext(
            PARENT.trace_id, 0x1122334455667788, False, TraceFlags(1), PARENT.trace_state
        ),
        "parent": PARENT,
        "resource": RESOURCE,
        "attributes": {
            "http.request.method": "POST",
            "url.full": "https://***@hooks.example/in?token=***",
            "server.port": 443,
            "http.response.status_code": 503,
            "efd.delivery.id": 2**40 + 7,
            "negative": -5,
            "ratio": 0.25,
            "flag": True,
            "off": False,
            "raw": b"\x00\xff",
            "list": ["a", "b"],
            "numbers": (1, 2, 3),
            "ünïcode": "värde",
        },
        "links": (Link(PARENT),),
        "kind": SpanKind.CLIENT,
        "status": Status(StatusCode.ERROR, "503"),
        "start_time": 1_700_000_000_123_456_789,
        "end_time": 1_700_000_000_223_456_789,
        "instrumentation_scope": SCOPE,
    }
    fields.update(changes)
    return ReadableSpan(**fields)


def decoded(data: bytes) -> ExportTraceServiceRequest:
    request = ExportTraceServiceRequest()
    request.ParseFromString(data)
    return request


def same(spans: list[ReadableSpan]) -> None:
    ours = decoded(otlpwire.request(spans))
    theirs = decoded(encode_spans(spans).SerializePartialToString())
    assert ours == theirs, f"{ours}\n---\n{theirs}"


def test_an_attempt_span_is_written_as_the_sdk_writes_it() -> None:
    same([a_span()])


@pytest.mark.parametrize(
    "changes",
    [
        {"parent": None, "links": ()},  # a root
        {"kind": SpanKind.SERVER, "status": Status(StatusCode.UNSET)},
        {"kind": SpanKind.PRODUCER, "status": Status(StatusCode.OK)},
        {"kind": SpanKind.INTERNAL, "attributes": {}},
        {"attributes": None},
        {"context": SpanContext(2**128 - 1, 2**64 - 1, False, TraceFlags(0))},
        {"parent": SpanContext(1, 2, is_remote=False), "links": (Link(PARENT, {"k": "v"}),)},
        {"name": ""},
        {"start_time": 0, "end_time": 1},
    ],
)
def test_every_field_efd_uses_is_written_as_the_sdk_writes_it(changes: dict[str, Any]) -> None:
    same([a_span(**changes)])


def test_spans_are_grouped_by_resource_and_scope() -> None:
    other = Resource.create({"service.name": "other"})
    spans = [
        a_span(),
        a_span(resource=other),
        a_span(instrumentation_scope=InstrumentationScope("other", None)),
        a_span(name="second"),
    ]
    same(spans)
    assert len(decoded(otlpwire.request(spans)).resource_spans) == 2


def test_an_empty_batch_and_strings_seen_again_are_written_the_same() -> None:
    assert otlpwire.request([]) == b""
    assert otlpwire.request([a_span()]) == otlpwire.request([a_span()])


def test_a_span_with_events_is_left_to_the_sdk() -> None:
    span = a_span(events=(Event("exception", {"exception.type": "ValueError"}),))
    assert not otlpwire.writable([a_span(), span])
    assert otlpwire.writable([a_span()])


@pytest.mark.parametrize("value", [0, 1, 127, 128, 300, 2**63 - 1, -1, -(2**63)])
def test_integers_are_varints_as_protobuf_writes_them(value: int) -> None:
    same([a_span(attributes={"n": value})])


@pytest.mark.parametrize(
    ("parent", "status"),
    [
        (PARENT, Status(StatusCode.UNSET)),
        (PARENT, Status(StatusCode.ERROR, "timeout")),
        (None, Status(StatusCode.UNSET)),
        (SpanContext(PARENT.trace_id, 5, is_remote=False), Status(StatusCode.ERROR, "503")),
    ],
)
def test_an_attempt_span_written_from_its_parts_reads_as_the_sdk_writes_it(
    parent: SpanContext | None, status: Status
) -> None:
    fixed_attributes = {"efd.destination": "hooks", "http.request.method": "POST"}
    attributes = {"efd.delivery.id": 42, "http.response.status_code": 200}
    trace_id, span_id = PARENT.trace_id, 0x1122334455667788
    sdk = a_span(
        context=SpanContext(trace_id, span_id, False, TraceFlags(1), PARENT.trace_state),
        parent=parent,
        attributes={**fixed_attributes, **attributes},
        links=(Link(parent),) if parent is not None else (),
        status=status,
    )
    encoded = otlpwire.attempt_span(
        otlpwire.prefix("POST", SpanKind.CLIENT.value, fixed_attributes),
        trace_id,
        span_id,
        (parent.span_id, parent.is_remote) if parent is not None else None,
        "congo=t61rcWkgMzE",
        sdk.start_time or 0,
        sdk.end_time or 0,
        attributes,
        otlpwire.link(parent.trace_id, parent.span_id, parent.is_remote) if parent else b"",
        status.status_code.value,
        status.description or "",
    )
    ours = decoded(otlpwire.request([otlpwire.Encoded(encoded, RESOURCE, SCOPE), a_span()]))
    theirs = decoded(encode_spans([sdk, a_span()]).SerializePartialToString())
    assert ours == theirs, f"{ours}\n---\n{theirs}"
