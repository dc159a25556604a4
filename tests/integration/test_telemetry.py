"""OpenTelemetry traces end to end: a real daemon exporting by OTLP/HTTP to a real receiver on
127.0.0.1 (tests/support/otlp.py, decoding the protobuf with opentelemetry-proto), a real
webhook receiver, SQLite and PostgreSQL; with and without a sender process."""

from __future__ import annotations

import asyncio
import logging
import secrets
import subprocess
import sys
import time
from collections.abc import AsyncIterator
from typing import Any

import aiohttp
import pytest
import redis.asyncio as aioredis
from aiohttp import web

from efd.delivery.retry import AttemptResult, Verdict
from efd.observe import tracing
from efd.observe.otel import QUEUE_SPANS, Tracer
from efd.observe.tracecontext import RoundTrace
from tests.conftest import (
    DaemonFactory,
    ReceiverFactory,
    basic,
    eventually,
    free_port,
    post,
    settings_dict,
    sql,
)
from tests.support.otlp import CLIENT, INTERNAL, PRODUCER, SERVER, OtlpReceiver

TRACE = "4bf92f3577b34da6a3ce929d0e0e4736"
CALLER = "00f067aa0ba902b7"
TRACEPARENT = f"00-{TRACE}-{CALLER}-01"
TRACK = {"userId": "u-1", "event": "Order Completed", "messageId": "m-1"}


@pytest.fixture
async def otlp() -> AsyncIterator[OtlpReceiver]:
    receiver = await OtlpReceiver().start()
    yield receiver
    await receiver.stop()


def traced(db_url: str, hook: str, otlp: OtlpReceiver, **telemetry: Any) -> dict[str, Any]:
    settings = settings_dict(db_url, [hook])
    settings["telemetry"] = {"otlp_endpoint": otlp.url, "service_name": "efd-test", **telemetry}
    return settings


async def flush() -> None:
    tracer = tracing.current()
    assert tracer is not None
    assert await asyncio.to_thread(tracer.flush)


def delivered(db_url: str) -> bool:
    return sql(db_url, "SELECT status FROM deliveries") == [("delivered",)]


def parse(traceparent: str) -> tuple[str, str, str, str]:
    version, trace_id, span_id, flags = traceparent.split("-")
    return version, trace_id, span_id, flags


@pytest.mark.parametrize("sender_processes", [0, 1])
async def test_a_message_is_traced_from_the_request_to_the_receivers_answer(
    db_url: str,
    receiver_factory: ReceiverFactory,
    daemon_factory: DaemonFactory,
    otlp: OtlpReceiver,
    sender_processes: int,
) -> None:
    async def fail_once(_request: web.Request, n: int) -> web.StreamResponse:
        return web.json_response({}, status=503 if n == 1 else 200)

    receiver = await receiver_factory(fail_once)
    hook = receiver.url.replace("http://", "http://user:p4ssw0rd@") + "?token=s3cr3t-v4lue"
    settings = traced(db_url, hook, otlp)
    settings["delivery"]["sender_processes"] = sender_processes
    daemon = await daemon_factory(settings)
    headers = {"traceparent": TRACEPARENT, "tracestate": "congo=t61rcWkgMzE"}
    assert (await post(daemon.port, "/v1/track", TRACK, headers))[0] == 200
    await receiver.wait_for(2)
    await eventually(lambda: delivered(db_url))
    await flush()
    await otlp.wait_for(1, SERVER)
    await otlp.wait_for(2, CLIENT)
    assert otlp.content_types[0] == "application/x-protobuf"

    # The ingestion span continues the caller's trace, its tracestate passed on.
    [ingestion] = otlp.of_kind(SERVER)
    assert ingestion.trace_id == TRACE
    assert ingestion.parent_span_id == CALLER
    assert ingestion.trace_state == "congo=t61rcWkgMzE"
    assert ingestion.name == "POST /v1/track"
    assert ingestion.attributes["http.request.method"] == "POST"
    assert ingestion.attributes["http.route"] == "/v1/track"
    assert ingestion.attributes["http.response.status_code"] == 200
    assert ingestion.attributes["efd.source"] == "web"
    assert ingestion.resource["service.name"] == "efd-test"
    [routing] = otlp.of_kind(INTERNAL)
    assert (routing.trace_id, routing.parent_span_id) == (TRACE, ingestion.span_id)
    assert routing.attributes["efd.messages"] == 1

    # The stored context is the ingestion span's.
    [(stored,)] = sql(db_url, "SELECT trace_context FROM messages")
    assert stored == f"00-{TRACE}-{ingestion.span_id}-01 congo=t61rcWkgMzE"

    # Each attempt: in the same trace, a child of and linked to the ingestion span, with
    # HTTP's attributes and no secret of the URL.
    first, second = sorted(otlp.of_kind(CLIENT), key=lambda span: span.start_ns)
    for attempt in (first, second):
        assert attempt.trace_id == TRACE
        assert attempt.parent_span_id == ingestion.span_id
        assert [(link.trace_id, link.span_id) for link in attempt.links] == [
            (TRACE, ingestion.span_id)
        ]
        assert attempt.name == "POST"
        assert attempt.attributes["http.request.method"] == "POST"
        url = attempt.attributes["url.full"]
        assert url == receiver.url.replace("http://", "http://***@") + "?token=***"
        assert "p4ssw0rd" not in repr(attempt)
        assert "s3cr3t" not in repr(attempt)
        assert attempt.attributes["server.address"] == "127.0.0.1"
        assert attempt.attributes["efd.destination"] == "hooks"
        assert attempt.end_ns >= attempt.start_ns
    assert first.attributes["http.response.status_code"] == 503
    assert first.attributes["error.type"] == "503"
    assert first.status_code == 2  # ERROR
    assert "http.request.resend_count" not in first.attributes
    assert second.attributes["http.response.status_code"] == 200
    assert second.attributes["http.request.resend_count"] == 1
    assert second.status_code == 0
    assert "error.type" not in second.attributes

    # The receiver's requests carry the attempt spans' contexts: its trace continues efd's.
    sent = [request.headers["traceparent"] for request in receiver.received]
    assert [parse(value)[1] for value in sent] == [TRACE, TRACE]
    assert [parse(value)[2] for value in sent] == [first.span_id, second.span_id]
    assert [parse(value)[3] for value in sent] == ["01", "01"]
    assert all(r.headers["tracestate"] == "congo=t61rcWkgMzE" for r in receiver.received)


async def test_at_ratio_zero_efd_records_no_span_and_still_passes_the_context_on(
    sqlite_url: str,
    receiver_factory: ReceiverFactory,
    daemon_factory: DaemonFactory,
    otlp: OtlpReceiver,
) -> None:
    receiver = await receiver_factory()
    daemon = await daemon_factory(traced(sqlite_url, receiver.url, otlp, sampling_ratio=0))
    assert (await post(daemon.port, "/v1/track", TRACK))[0] == 200
    [request] = await receiver.wait_for(1)
    await eventually(lambda: delivered(sqlite_url))
    await flush()
    assert otlp.spans == []
    assert otlp.requests == 0
    # The trace efd started is not sampled, and says so downstream (bit 1, set too, says
    # its trace id is random: W3C Trace Context Level 2).
    version, trace_id, _, flags = parse(request.headers["traceparent"])
    assert (version, int(flags, 16) & 1) == ("00", 0)
    [(stored,)] = sql(sqlite_url, "SELECT trace_context FROM messages")
    assert parse(stored)[1] == trace_id
    assert int(parse(stored)[3], 16) & 1 == 0


async def test_a_callers_sampled_trace_is_recorded_whatever_the_ratio(
    sqlite_url: str,
    receiver_factory: ReceiverFactory,
    daemon_factory: DaemonFactory,
    otlp: OtlpReceiver,
) -> None:
    receiver = await receiver_factory()
    daemon = await daemon_factory(traced(sqlite_url, receiver.url, otlp, sampling_ratio=0))
    assert (await post(daemon.port, "/v1/track", TRACK, {"traceparent": TRACEPARENT}))[0] == 200
    await receiver.wait_for(1)
    await eventually(lambda: delivered(sqlite_url))
    await flush()
    await otlp.wait_for(1, CLIENT)
    assert {span.trace_id for span in otlp.spans} == {TRACE}
    # ... and one that says not sampled is not, whatever the ratio.
    otlp.spans.clear()
    daemon2 = await daemon_factory(traced(sqlite_url + "-2", receiver.url, otlp))
    unsampled = TRACEPARENT[:-2] + "00"
    message = {**TRACK, "messageId": "m-2"}
    assert (await post(daemon2.port, "/v1/track", message, {"traceparent": unsampled}))[0] == 200
    [_, request] = await receiver.wait_for(2)
    await flush()
    assert otlp.spans == []
    assert parse(request.headers["traceparent"])[1::2] == (TRACE, "00")


async def test_telemetry_off_stores_no_context_and_sends_no_trace_header(
    db_url: str, receiver_factory: ReceiverFactory, daemon_factory: DaemonFactory
) -> None:
    receiver = await receiver_factory()
    daemon = await daemon_factory(settings_dict(db_url, [receiver.url]))
    assert tracing.current() is None
    headers = {"traceparent": TRACEPARENT, "tracestate": "congo=t61rcWkgMzE"}
    assert (await post(daemon.port, "/v1/track", TRACK, headers))[0] == 200
    [request] = await receiver.wait_for(1)
    await eventually(lambda: delivered(db_url))
    assert sql(db_url, "SELECT trace_context FROM messages") == [(None,)]
    names = {name.lower() for name in request.headers}
    assert "traceparent" not in names
    assert "tracestate" not in names


@pytest.mark.parametrize(
    "headers",
    [
        {"traceparent": TRACEPARENT.upper()},
        {"traceparent": f"00-{'0' * 32}-{CALLER}-01"},
        {"traceparent": "garbage", "tracestate": "congo=t61rcWkgMzE"},
    ],
)
async def test_an_invalid_traceparent_is_ignored_and_a_trace_of_its_own_begins(
    sqlite_url: str,
    receiver_factory: ReceiverFactory,
    daemon_factory: DaemonFactory,
    otlp: OtlpReceiver,
    headers: dict[str, str],
) -> None:
    receiver = await receiver_factory()
    daemon = await daemon_factory(traced(sqlite_url, receiver.url, otlp))
    assert (await post(daemon.port, "/v1/track", TRACK, headers))[0] == 200
    [request] = await receiver.wait_for(1)
    await flush()
    await otlp.wait_for(1, CLIENT)
    [ingestion] = otlp.of_kind(SERVER)
    assert ingestion.parent_span_id == ""
    assert ingestion.trace_id not in (TRACE, "0" * 32)
    assert ingestion.trace_state == ""
    [attempt] = otlp.of_kind(CLIENT)
    assert (attempt.trace_id, attempt.parent_span_id) == (ingestion.trace_id, ingestion.span_id)
    assert parse(request.headers["traceparent"])[1:3] == (attempt.trace_id, attempt.span_id)
    assert "tracestate" not in {name.lower() for name in request.headers}


async def test_two_traceparent_headers_are_ignored(
    sqlite_url: str,
    receiver_factory: ReceiverFactory,
    daemon_factory: DaemonFactory,
    otlp: OtlpReceiver,
) -> None:
    receiver = await receiver_factory()
    daemon = await daemon_factory(traced(sqlite_url, receiver.url, otlp))
    async with aiohttp.ClientSession() as session:
        response = await session.post(
            f"http://127.0.0.1:{daemon.port}/v1/track",
            json=TRACK,
            headers=[
                ("Authorization", basic()["Authorization"]),
                ("traceparent", TRACEPARENT),
                ("traceparent", f"00-{TRACE}-{'1' * 16}-01"),
            ],
        )
        assert response.status == 200
    await receiver.wait_for(1)
    await flush()
    await otlp.wait_for(1, SERVER)
    [ingestion] = otlp.of_kind(SERVER)
    assert ingestion.trace_id != TRACE
    assert ingestion.parent_span_id == ""


async def test_a_refused_request_is_traced_with_its_status_and_stores_nothing(
    sqlite_url: str, daemon_factory: DaemonFactory, otlp: OtlpReceiver
) -> None:
    daemon = await daemon_factory(traced(sqlite_url, "http://127.0.0.1:9/unused", otlp))
    status, _ = await post(
        daemon.port, "/v1/track", TRACK, {"traceparent": TRACEPARENT, **basic("wrong-key")}
    )
    assert status == 401
    await flush()
    await otlp.wait_for(1, SERVER)
    [ingestion] = otlp.of_kind(SERVER)
    assert ingestion.attributes["http.response.status_code"] == 401
    assert ingestion.status_code == 0  # a client's error is not the server's
    assert (ingestion.trace_id, ingestion.parent_span_id) == (TRACE, CALLER)


async def test_a_later_attempt_from_another_daemon_links_to_the_ingestion_span(
    db_url: str,
    receiver_factory: ReceiverFactory,
    daemon_factory: DaemonFactory,
    otlp: OtlpReceiver,
) -> None:
    answer = {"status": 503}

    async def behaviour(_request: web.Request, _n: int) -> web.StreamResponse:
        return web.json_response({}, status=answer["status"])

    receiver = await receiver_factory(behaviour)
    settings = traced(db_url, receiver.url, otlp)
    first = await daemon_factory(settings)
    assert (await post(first.port, "/v1/track", TRACK, {"traceparent": TRACEPARENT}))[0] == 200
    await receiver.wait_for(1)
    await first.stop()  # its spans exported at its stop
    [ingestion] = otlp.of_kind(SERVER)
    assert tracing.current() is None
    # Another daemon, with a tracer of its own, finds the delivery in the store.
    answer["status"] = 200
    second = await daemon_factory(settings)
    assert second.owner != first.owner
    await eventually(lambda: delivered(db_url), timeout=20)
    await flush()
    later = [
        span
        for span in otlp.of_kind(CLIENT)
        if span.attributes.get("http.response.status_code") == 200
    ]
    assert len(later) == 1
    [attempt] = later
    assert attempt.trace_id == TRACE
    assert [(link.trace_id, link.span_id) for link in attempt.links] == [(TRACE, ingestion.span_id)]
    assert attempt.attributes["http.request.resend_count"] >= 1
    assert parse(receiver.received[-1].headers["traceparent"])[2] == attempt.span_id


def test_telemetry_off_never_imports_the_tracing_sdk() -> None:
    """Off, it costs nothing: the daemon, ingestion and the senders load without efd's
    tracer, the SDK's tracing or the exporter. (The Redis client loads OpenTelemetry's
    metrics by itself when the package is installed.)"""
    code = (
        "import sys, efd.daemon, efd.http.ingest, efd.delivery.sender, efd.delivery.dispatcher;"
        "loaded = sorted(m for m in sys.modules if m == 'efd.observe.otel'"
        " or m.startswith(('opentelemetry.sdk.trace', 'opentelemetry.exporter')));"
        "print(loaded); sys.exit(1 if loaded else 0)"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert done.returncode == 0, done.stdout + done.stderr


async def test_a_broker_message_carries_the_attempt_spans_context_as_headers(
    sqlite_url: str, daemon_factory: DaemonFactory, otlp: OtlpReceiver
) -> None:
    client = aioredis.Redis(host="127.0.0.1", port=6379)
    try:
        await client.ping()
    except (OSError, aioredis.ConnectionError):
        pytest.fail("no Redis answers on 127.0.0.1:6379: start it, then run again")
    stream = f"efd-test-{secrets.token_hex(6)}"
    settings = traced(sqlite_url, "http://127.0.0.1:9/unused", otlp)
    settings["destinations"] = [
        {
            "name": "hooks",
            "type": "redis_streams",
            "shared_secret": "a-shared-secret",
            "hooks": [{"url": "redis://127.0.0.1:6379/0", "stream": stream}],
        }
    ]
    daemon = await daemon_factory(settings)
    try:
        assert (await post(daemon.port, "/v1/track", TRACK, {"traceparent": TRACEPARENT}))[0] == 200
        await eventually(lambda: delivered(sqlite_url))
        entries: list[tuple[bytes, dict[bytes, bytes]]] = await client.xrange(stream)  # type: ignore[assignment]
    finally:
        await client.delete(stream)
        await client.aclose()
    await flush()
    await otlp.wait_for(1, PRODUCER)
    [attempt] = otlp.of_kind(PRODUCER)
    [ingestion] = otlp.of_kind(SERVER)
    assert (attempt.trace_id, attempt.parent_span_id) == (TRACE, ingestion.span_id)
    assert attempt.attributes["messaging.system"] == "redis"
    [(_, fields)] = entries
    assert fields[b"traceparent"].decode() == f"00-{TRACE}-{attempt.span_id}-01"


async def test_a_collector_that_is_down_costs_deliveries_nothing(
    sqlite_url: str, receiver_factory: ReceiverFactory, daemon_factory: DaemonFactory
) -> None:
    receiver = await receiver_factory()
    settings = settings_dict(sqlite_url, [receiver.url])
    settings["telemetry"] = {"otlp_endpoint": f"http://127.0.0.1:{free_port()}/v1/traces"}
    daemon = await daemon_factory(settings)
    for n in range(3):
        message = {**TRACK, "messageId": f"m-{n}"}
        status, _ = await post(daemon.port, "/v1/track", message, {"traceparent": TRACEPARENT})
        assert status == 200
    await receiver.wait_for(3)
    started = time.monotonic()
    await daemon.stop()
    # The last export is given up within the exporter's timeout.
    assert time.monotonic() - started < 15
    assert tracing.current() is None


@pytest.mark.slow
async def test_spans_dropped_while_the_collector_is_down_are_logged_once_not_each(
    caplog: pytest.LogCaptureFixture,
) -> None:
    tracer = Tracer(
        endpoint=f"http://127.0.0.1:{free_port()}/v1/traces",
        service_name="efd",
        ratio=1.0,
        version="test",
    )
    try:
        labels = {"http://127.0.0.1:9/hook": "http://127.0.0.1:9/hook"}
        result = AttemptResult("http://127.0.0.1:9/hook", time.time(), 0.001, Verdict.SUCCESS, 200)
        with caplog.at_level(logging.WARNING):
            for n in range(QUEUE_SPANS + 5000):
                trace = RoundTrace(TRACEPARENT, 0, n)
                tracer.round("hooks", "POST", list(labels), labels, None, trace).finish([result])
        # The SDK's batching processor logs the same line at most once in 20 seconds.
        full = [r for r in caplog.records if r.getMessage().startswith("Queue full")]
        assert len(full) == 1
    finally:
        await asyncio.to_thread(tracer.shutdown)
