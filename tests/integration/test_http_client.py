"""efd's HTTP/1.1 client (efd/delivery/http1.py) against raw servers on 127.0.0.1, each
scenario on the default asyncio loop and on uvloop (the sender processes' loop)."""

from __future__ import annotations

import asyncio
import base64
import pathlib
import ssl
from collections.abc import Awaitable, Callable, Coroutine
from dataclasses import dataclass, field
from typing import Any, cast

import pytest
import trustme
import uvloop

from efd.delivery import netguard, tls
from efd.delivery.http1 import Answer, Client, RequestFailed

LOOPBACK = netguard.parse_networks(["127.0.0.0/8"])
Runner = Callable[[Coroutine[Any, Any, Any]], Any]
RUNNERS = pytest.mark.parametrize("run", [asyncio.run, uvloop.run], ids=["asyncio", "uvloop"])


@dataclass
class Request:
    head: bytes
    body: bytes

    def header(self, name: str) -> str | None:
        for line in self.head.split(b"\r\n")[1:]:
            key, _, value = line.partition(b":")
            if key.strip().lower() == name.lower().encode():
                return value.strip().decode("latin-1")
        return None


Handler = Callable[[Request, int, asyncio.StreamWriter], Awaitable[bool]]


@dataclass
class Server:
    """Reads requests (Content-Length bodies) off each connection and lets `handler`
    answer the n-th request of the server (1-based) however it likes; the handler returns
    False to stop reading that connection."""

    handler: Handler
    connections: int = 0
    requests: list[Request] = field(default_factory=list)
    closed_by_client: int = 0
    port: int = 0
    _server: asyncio.base_events.Server | None = None
    _serving: set[asyncio.Task[None]] = field(default_factory=set)

    async def start(self) -> Server:
        self._server = await asyncio.start_server(self._serve, "127.0.0.1", 0)
        self.port = self._server.sockets[0].getsockname()[1]
        return self

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}/hook?q=1"

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.connections += 1
        task = asyncio.current_task()
        assert task is not None
        self._serving.add(task)
        try:
            while True:
                try:
                    head = await reader.readuntil(b"\r\n\r\n")
                except (asyncio.IncompleteReadError, ConnectionError):
                    self.closed_by_client += 1
                    return
                request = Request(head[:-4], b"")
                length = int(request.header("Content-Length") or 0)
                request.body = await reader.readexactly(length)
                self.requests.append(request)
                if not await self.handler(request, len(self.requests), writer):
                    return
        finally:
            writer.close()

    async def stop(self) -> None:
        if self._server is not None:
            self._server.close()
        for task in self._serving:
            task.cancel()
        await asyncio.gather(*self._serving, return_exceptions=True)


def answer(text: bytes) -> Handler:
    async def handler(_request: Request, _n: int, writer: asyncio.StreamWriter) -> bool:
        writer.write(text)
        await writer.drain()
        return True

    return handler


OK = b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok"


def client(**options: Any) -> Client:
    settings: dict[str, Any] = {
        "timeout": 5.0,
        "allowed": LOOPBACK,
        "tls": tls.verifying(None),
        "keep": 512,
        "limit": 1 << 20,
    }
    return Client(**{**settings, **options})


async def posting(
    handler: Handler, count: int = 1, headers: dict[str, str] | None = None, **options: Any
) -> tuple[Server, list[Answer | RequestFailed]]:
    """`count` POSTs one after the other through one client; each answer or failure."""
    server = await Server(handler).start()
    http = client(**options)
    results: list[Answer | RequestFailed] = []
    try:
        for i in range(count):
            try:
                results.append(await http.post(server.url, b"body %d" % i, headers or {}))
            except RequestFailed as failure:
                results.append(failure)
    finally:
        await http.close()
        await server.stop()
    return server, results


def statuses(results: list[Answer | RequestFailed]) -> list[int | str]:
    return [r.status if isinstance(r, Answer) else r.error_class for r in results]


@RUNNERS
def test_keep_alive_carries_every_request_on_one_connection(run: Runner) -> None:
    server, results = run(posting(answer(OK), 5, {"X-Test": "yes"}))
    assert statuses(results) == [200] * 5
    assert server.connections == 1
    assert [r.body for r in server.requests] == [b"body %d" % i for i in range(5)]
    first = server.requests[0]
    assert first.head.split(b"\r\n")[0] == b"POST /hook?q=1 HTTP/1.1"
    assert first.header("Host") == f"127.0.0.1:{server.port}"
    assert first.header("X-Test") == "yes"
    assert first.header("Content-Length") == "6"
    assert [r.head for r in results if isinstance(r, Answer)] == [b"ok"] * 5


@RUNNERS
def test_a_pooled_connection_the_server_closed_is_retried_once_on_a_new_one(run: Runner) -> None:
    async def close_the_first_connection_at_its_second_request(
        _request: Request, n: int, writer: asyncio.StreamWriter
    ) -> bool:
        if n == 2:  # the server's idle close crossing the request: no byte of answer
            return False
        writer.write(OK)
        await writer.drain()
        return True

    server, results = run(posting(close_the_first_connection_at_its_second_request, 3))
    assert statuses(results) == [200, 200, 200]
    assert server.connections == 2
    # The second POST reached the server twice: once on the closed connection, once again.
    assert [r.body for r in server.requests] == [b"body 0", b"body 1", b"body 1", b"body 2"]


@RUNNERS
def test_a_new_connection_closed_without_an_answer_is_a_reset_not_retried(run: Runner) -> None:
    async def close(_request: Request, _n: int, _writer: asyncio.StreamWriter) -> bool:
        return False

    server, results = run(posting(close, 1))
    assert statuses(results) == ["reset"]
    assert len(server.requests) == 1


class SpeaksFirst(asyncio.Protocol):
    """A receiver that writes a 200 the moment a connection opens, before any request,
    and answers each request it reads with a 500."""

    requests = 0

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = cast(asyncio.Transport, transport)
        self.transport.write(OK)
        self.buffer = b""

    def data_received(self, data: bytes) -> None:
        self.buffer += data
        while b"\r\n\r\n" in self.buffer:  # efd's test bodies: shorter than a read
            _, _, self.buffer = self.buffer.partition(b"\r\n\r\n")
            SpeaksFirst.requests += 1
            self.transport.write(b"HTTP/1.1 500 No\r\nContent-Length: 2\r\n\r\nno")


@RUNNERS
def test_bytes_the_receiver_sends_before_the_request_are_a_protocol_error(run: Runner) -> None:
    async def scenario() -> list[Answer | RequestFailed]:
        SpeaksFirst.requests = 0
        server = await asyncio.get_running_loop().create_server(SpeaksFirst, "127.0.0.1", 0)
        port = server.sockets[0].getsockname()[1]
        http = client()
        results: list[Answer | RequestFailed] = []
        try:
            for _ in range(3):
                try:
                    results.append(await http.post(f"http://127.0.0.1:{port}/", b"x", {}))
                except RequestFailed as failure:
                    results.append(failure)
        finally:
            await http.close()
            server.close()
        return results

    results = run(scenario())
    # Neither the early 200 taken for the answer, nor a reset retried on a new connection.
    assert statuses(results) == ["protocol"] * 3
    assert {r.message for r in results if isinstance(r, RequestFailed)} == {
        "the receiver sent bytes before the request was written"
    }
    assert SpeaksFirst.requests == 0  # the request was never written


@RUNNERS
def test_bytes_a_pooled_connection_gets_while_idle_end_it(run: Runner) -> None:
    async def then_unasked(_request: Request, n: int, writer: asyncio.StreamWriter) -> bool:
        if n == 1:
            writer.write(OK)
            await writer.drain()
            await asyncio.sleep(0.02)
            writer.write(OK)  # while the connection is idle in efd's pool
        else:
            writer.write(b"HTTP/1.1 503 No\r\nContent-Length: 2\r\n\r\nno")
        await writer.drain()
        return True

    async def scenario() -> tuple[Server, list[Answer | RequestFailed]]:
        server = await Server(then_unasked).start()
        http = client()
        try:
            first = await http.post(server.url, b"x", {})
            await asyncio.sleep(0.1)
            return server, [first, await http.post(server.url, b"y", {})]
        finally:
            await http.close()
            await server.stop()

    server, results = run(scenario())
    assert statuses(results) == [200, 503]  # the unasked 200 is not the second's answer
    assert server.connections == 2


@RUNNERS
def test_a_chunked_answer_is_read_whole_and_the_connection_reused(run: Runner) -> None:
    chunked = (
        b"HTTP/1.1 202 Accepted\r\nTransfer-Encoding: chunked\r\n\r\n"
        b"5;ext=1\r\nhello\r\n7\r\n, world\r\n0\r\nX-Trailer: t\r\n\r\n"
    )

    async def in_pieces(_request: Request, _n: int, writer: asyncio.StreamWriter) -> bool:
        for i in range(0, len(chunked), 7):  # heads and chunk lines split across reads
            writer.write(chunked[i : i + 7])
            await writer.drain()
            await asyncio.sleep(0)
        return True

    server, results = run(posting(in_pieces, 2))
    assert statuses(results) == [202, 202]
    assert [r.head for r in results if isinstance(r, Answer)] == [b"hello, world"] * 2
    assert server.connections == 1


@RUNNERS
def test_an_answer_without_a_length_ends_when_the_server_closes(run: Runner) -> None:
    async def until_close(_request: Request, _n: int, writer: asyncio.StreamWriter) -> bool:
        writer.write(b"HTTP/1.1 200 OK\r\n\r\nall of ")
        await writer.drain()
        writer.write(b"it")
        return False

    server, results = run(posting(until_close, 2))
    assert statuses(results) == [200, 200]
    assert [r.head for r in results if isinstance(r, Answer)] == [b"all of it"] * 2
    assert server.connections == 2


@RUNNERS
def test_connection_close_is_honoured_even_if_the_server_keeps_the_socket(run: Runner) -> None:
    closing = b"HTTP/1.1 200 OK\r\nConnection: close\r\nContent-Length: 2\r\n\r\nok"
    server, results = run(posting(answer(closing), 3))
    assert statuses(results) == [200, 200, 200]
    assert server.connections == 3  # each answer's connection closed by the client


@RUNNERS
def test_an_oversize_answer_is_cut_at_the_limit_and_its_connection_dropped(run: Runner) -> None:
    async def endless(_request: Request, _n: int, writer: asyncio.StreamWriter) -> bool:
        writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: 100000000\r\n\r\n")
        try:
            while True:
                writer.write(b"x" * 4096)
                await writer.drain()
        except ConnectionError:
            return False

    server, results = run(posting(endless, 2, keep=10, limit=50_000))
    assert statuses(results) == [200, 200]
    assert [r.head for r in results if isinstance(r, Answer)] == [b"x" * 10] * 2
    assert server.connections == 2  # the first connection was not reused


@RUNNERS
def test_interim_answers_are_skipped(run: Runner) -> None:
    interim = (
        b"HTTP/1.1 100 Continue\r\n\r\n"
        b"HTTP/1.1 103 Early Hints\r\nLink: </style.css>; rel=preload\r\n\r\n"
        b"HTTP/1.1 201 Created\r\nContent-Length: 4\r\n\r\ndone"
    )
    _, results = run(posting(answer(interim), 2))
    assert statuses(results) == [201, 201]
    assert [r.head for r in results if isinstance(r, Answer)] == [b"done"] * 2


@RUNNERS
def test_retry_after_and_the_head_of_the_body_are_read(run: Runner) -> None:
    busy = b"HTTP/1.1 503 Busy\r\nRetry-After:  120 \r\nContent-Length: 9\r\n\r\nbusy, sry"
    _, results = run(posting(answer(busy), 1, keep=4))
    [result] = results
    assert isinstance(result, Answer)
    assert (result.status, result.retry_after, result.head) == (503, "120", b"busy")


@RUNNERS
@pytest.mark.parametrize(
    "status_line",
    [b"HTTP/1.1 2000 OK", b"HTTP/2 200 OK", b"ICY 200 OK", b"HTTP/1.1 OK", b"<html>"],
)
def test_a_malformed_status_line_is_a_protocol_error(run: Runner, status_line: bytes) -> None:
    _, results = run(posting(answer(status_line + b"\r\nContent-Length: 2\r\n\r\nok"), 1))
    assert statuses(results) == ["protocol"]


@RUNNERS
@pytest.mark.parametrize(
    "head",
    [
        b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\nTransfer-Encoding: chunked",
        b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\nContent-Length: 3",
        b"HTTP/1.1 200 OK\r\nContent-Length: -2",
        b"HTTP/1.1 200 OK\r\nBad Header: x",
        b"HTTP/1.1 200 OK\r\n folded: x",
        b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\nzz",
        b"HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket",
    ],
)
def test_answers_framed_ambiguously_are_protocol_errors(run: Runner, head: bytes) -> None:
    _, results = run(posting(answer(head + b"\r\n\r\n"), 1))
    assert statuses(results) == ["protocol"]


@RUNNERS
def test_a_server_that_never_answers_hits_the_deadline(run: Runner) -> None:
    async def silent(_request: Request, _n: int, _writer: asyncio.StreamWriter) -> bool:
        await asyncio.sleep(30)
        return False

    _, results = run(posting(silent, 1, timeout=0.5))
    [failure] = results
    assert isinstance(failure, RequestFailed)
    assert (failure.error_class, failure.message) == ("timeout", "no complete answer in 0.5 s")


@RUNNERS
def test_a_server_that_trickles_its_answer_hits_the_deadline(run: Runner) -> None:
    async def trickle(_request: Request, _n: int, writer: asyncio.StreamWriter) -> bool:
        writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: 1000\r\n\r\n")
        try:
            while True:  # a byte at a time, each well within any read timeout
                writer.write(b"x")
                await writer.drain()
                await asyncio.sleep(0.05)
        except ConnectionError:
            return False

    _, results = run(posting(trickle, 1, timeout=0.5))
    assert statuses(results) == ["timeout"]


@RUNNERS
@pytest.mark.parametrize(
    "headers",
    [
        {"X-Bad": "a\r\nX-Injected: b"},
        {"X-Bad": "a\nb"},
        {"X-Bad": "é ok, but ☃ is not Latin-1"},
        {"X Bad": "a"},
        {"Content-Length": "0"},
        {"transfer-encoding": "chunked"},
    ],
)
def test_headers_that_cannot_be_sent_are_never_sent(run: Runner, headers: dict[str, str]) -> None:
    server, results = run(posting(answer(OK), 1, headers))
    assert statuses(results) == ["invalid_request"]
    assert server.connections == 0


@RUNNERS
def test_latin_1_header_values_are_sent_as_latin_1(run: Runner) -> None:
    server, results = run(posting(answer(OK), 1, {"X-Name": "Zoë"}))
    assert statuses(results) == [200]
    assert server.requests[0].header("X-Name") == "Zoë"


@RUNNERS
def test_the_address_guard_refuses_before_connecting(run: Runner) -> None:
    server, results = run(posting(answer(OK), 1, allowed=()))
    [failure] = results
    assert isinstance(failure, RequestFailed)
    assert (failure.error_class, failure.message) == (
        "blocked",
        "efd address guard: loopback address 127.0.0.1 is not allowed",
    )
    assert server.connections == 0


@RUNNERS
def test_userinfo_in_the_url_is_sent_as_basic_credentials(run: Runner) -> None:
    async def scenario() -> tuple[Server, Answer]:
        server = await Server(answer(OK)).start()
        http = client()
        try:
            url = f"http://us%40er:p%3Ass@127.0.0.1:{server.port}/hook"
            return server, await http.post(url, b"{}", {})
        finally:
            await http.close()
            await server.stop()

    server, result = run(scenario())
    assert result.status == 200
    expected = "Basic " + base64.b64encode(b"us@er:p:ss").decode()
    assert server.requests[0].header("Authorization") == expected


@RUNNERS
@pytest.mark.parametrize(
    ("url", "error_class"),
    [
        ("ftp://127.0.0.1/hook", "invalid_url"),
        ("http:///hook", "invalid_url"),
        ("http://127.1:9/hook", "invalid_url"),
        ("http://127.0.0.1:99999/hook", "invalid_url"),
        ("http://does-not-exist.invalid/hook", "dns"),
    ],
)
def test_urls_that_lead_nowhere(run: Runner, url: str, error_class: str) -> None:
    async def scenario() -> RequestFailed:
        http = client()
        try:
            await http.post(url, b"{}", {})
        except RequestFailed as failure:
            return failure
        finally:
            await http.close()
        raise AssertionError("no failure")

    assert run(scenario()).error_class == error_class


@RUNNERS
def test_a_closed_port_is_a_connect_error(run: Runner) -> None:
    async def scenario() -> RequestFailed:
        server = await Server(answer(OK)).start()
        await server.stop()  # the port is free again: nothing listens
        http = client()
        try:
            await http.post(server.url, b"{}", {})
        except RequestFailed as failure:
            return failure
        finally:
            await http.close()
        raise AssertionError("no failure")

    assert run(scenario()).error_class == "connect"


@RUNNERS
@pytest.mark.parametrize("trusted", [True, False], ids=["trusted", "untrusted"])
def test_tls_verifies_the_receivers_certificate(
    run: Runner, trusted: bool, tmp_path: pathlib.Path
) -> None:
    authority = trustme.CA()
    ca_file = tmp_path / "ca.pem"
    authority.cert_pem.write_to_path(str(ca_file))
    server_context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    authority.issue_cert("localhost").configure_cert(server_context)

    async def scenario() -> tuple[Server, Answer | RequestFailed]:
        server = Server(answer(OK))
        server._server = await asyncio.start_server(
            server._serve, "127.0.0.1", 0, ssl=server_context
        )
        server.port = server._server.sockets[0].getsockname()[1]
        http = client(tls=tls.verifying(str(ca_file) if trusted else None))
        try:
            return server, await http.post(f"https://localhost:{server.port}/hook", b"{}", {})
        except RequestFailed as failure:
            return server, failure
        finally:
            await http.close()
            await server.stop()

    server, result = run(scenario())
    if trusted:
        assert isinstance(result, Answer)
        assert result.status == 200
        assert len(server.requests) == 1
    else:
        assert isinstance(result, RequestFailed)
        assert result.error_class == "tls"
        assert result.message.startswith("certificate rejected: ")
        assert "certificate verify failed" in result.message
        assert server.requests == []
