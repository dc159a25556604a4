"""CPU per answer read, and per POST (request written + answer read), of efd's HTTP/1.1
reader beside h11's, with no sockets: is the hand-written reader worth keeping?

    .venv/bin/python bench/experiments/http_reader.py [rounds] [variant ...]

Variants, each timed on a webhook receiver's typical 200 (a few headers, a small JSON body,
by Content-Length) and on the same answer chunked:
  reader        efd.delivery.reader.ResponseReader.feed, the whole answer in one read
  reader_plain  the same without its fast path (a whole Content-Length answer in one read,
                read at once): every read through the state machine's steps
  connection    efd.delivery.http1._Connection as the client drives it (send, then the
                answer's bytes to data_received): the adapter and the reader; this one also
                runs against an older efd checkout (PYTHONPATH) for a before/after
  post          efd's request head written and the answer read by the reader
  h11_post      h11.Connection: Request, Data and EndOfMessage sent, the answer received,
                its events taken to EndOfMessage, start_next_cycle (skipped without h11)

Each round runs every variant in turn, then again in reverse (A B C … C B A), so the
machine's drift falls on every side; the medians of µs per answer or POST are printed, with
each variant's ratio to `reader`. The time is the process's CPU time, not the wall clock: on
a shared machine the wall clock counts the other tenants' turns.
"""

from __future__ import annotations

import asyncio
import importlib
import importlib.util
import statistics
import sys
import time
import timeit
from collections.abc import Callable
from typing import Any

from efd.delivery import http1
from efd.delivery.wire import request_head

BODY = (
    b'{"version":1,"type":"track","userId":"u1","event":"Order Completed",'
    b'"properties":{"revenue":12.5,"items":3},"messageId":"abc-123",'
    b'"timestamp":"2026-01-01T00:00:00.000Z"}'
)
HEADERS = {
    "User-Agent": "efd/1",
    "Content-Type": "application/json",
    "webhook-id": "msg_" + "a" * 26,
    "webhook-timestamp": "1767225600",
    "webhook-signature": "v1," + "s" * 44,
}
_HEAD = (
    b"HTTP/1.1 200 OK\r\nServer: nginx\r\nDate: Wed, 02 Dec 2026 20:00:00 GMT\r\n"
    b"Content-Type: application/json; charset=utf-8\r\nConnection: keep-alive\r\n"
)
_ANSWER_BODY = b'{"received":true}'
ANSWERS = {
    "length": _HEAD + b"Content-Length: %d\r\n\r\n" % len(_ANSWER_BODY) + _ANSWER_BODY,
    "chunked": _HEAD
    + b"Transfer-Encoding: chunked\r\n\r\n"
    + b"%x\r\n" % len(_ANSWER_BODY)
    + _ANSWER_BODY
    + b"\r\n0\r\n\r\n",
}
LIMIT = 1 << 20


def _reader_module() -> Any:
    """efd.delivery.reader, or None in a checkout from before it."""
    if importlib.util.find_spec("efd.delivery.reader") is None:
        return None
    return importlib.import_module("efd.delivery.reader")


def _plain_reader(reader: Any) -> Any:
    """The reader without its fast path: every read through the state machine's steps."""
    base = reader.ResponseReader

    class PlainReader(base):  # type: ignore[misc, valid-type]
        def feed(self, data: bytes) -> list[Any]:
            if self._refusal is not None or self._state is reader._CLOSED:
                return list(super().feed(data))
            if self._buffer:
                self._buffer += data
                data = bytes(self._buffer)
                self._buffer.clear()
            events: list[Any] = []
            try:
                read_to = self._advance(data, events, 0)
            except reader.ProtocolError as error:
                self._refuse(events, str(error))
                return events
            if read_to < len(data) and self._state is not reader._CLOSED:
                self._buffer += memoryview(data)[read_to:]
            return events

    return PlainReader


def _check(events: list[Any], reader: Any) -> None:
    assert type(events[-1]) is reader.End, events
    assert b"".join(e.data for e in events if type(e) is reader.Data) == _ANSWER_BODY


class _NullTransport:
    def write(self, data: bytes) -> None:
        pass

    def close(self) -> None:
        pass

    def abort(self) -> None:
        pass


def variants(answer: bytes) -> dict[str, Callable[[], object]]:
    found: dict[str, Callable[[], object]] = {}
    reader = _reader_module()
    if reader is not None:
        shipped = reader.ResponseReader(LIMIT)
        plain = _plain_reader(reader)(LIMIT)
        for each in (shipped, plain):
            _check(each.feed(answer), reader)
            _check(each.feed(answer), reader)
        found["reader"] = lambda: shipped.feed(answer)
        found["reader_plain"] = lambda: plain.feed(answer)

        def post() -> object:
            request_head("/hook", "example.com", HEADERS, len(BODY)) + BODY
            return shipped.feed(answer)

        found["post"] = post

    loop = asyncio.new_event_loop()
    connection = http1._Connection(loop, 512, LIMIT)
    connection.connection_made(_NullTransport())  # type: ignore[arg-type]
    request = request_head("/hook", "example.com", HEADERS, len(BODY)) + BODY

    def drive() -> object:
        waiter = connection.send(request)
        connection.data_received(answer)
        return waiter.result()

    assert drive().status == 200  # type: ignore[attr-defined]
    found["connection"] = drive

    if importlib.util.find_spec("h11") is not None:
        found["h11_post"] = _h11_post(answer)
    return found


def _h11_post(answer: bytes) -> Callable[[], object]:
    h11: Any = importlib.import_module("h11")
    connection = h11.Connection(h11.CLIENT)
    headers = [("Host", "example.com"), *HEADERS.items(), ("Content-Length", str(len(BODY)))]
    end_of_message, need_data = h11.EndOfMessage, h11.NEED_DATA

    def post() -> object:
        out = connection.send(h11.Request(method="POST", target="/hook", headers=headers))
        out += connection.send(h11.Data(data=BODY))
        out += connection.send(h11.EndOfMessage())
        connection.receive_data(answer)
        events = []
        while True:
            event = connection.next_event()
            if event is need_data:
                raise AssertionError("the answer is whole")
            events.append(event)
            if type(event) is end_of_message:
                break
        connection.start_next_cycle()
        return events

    events: Any = post()
    assert events[0].status_code == 200
    assert b"".join(bytes(e.data) for e in events if type(e) is h11.Data) == _ANSWER_BODY
    return post


def main() -> None:
    import efd

    args = sys.argv[1:]
    rounds = int(args.pop(0)) if args and args[0].isdigit() else 5
    number = 20_000
    print(f"efd from {efd.__file__}")
    for case, answer in ANSWERS.items():
        found = variants(answer)
        names = [name for name in (args or list(found)) if name in found]
        timings: dict[str, list[float]] = {name: [] for name in names}
        for _ in range(rounds):
            for name in [*names, *reversed(names)]:
                timer = timeit.Timer(found[name], timer=time.process_time)
                timings[name].append(timer.timeit(number) / number * 1e6)
        medians = {name: statistics.median(values) for name, values in timings.items()}
        base = medians.get("reader") or medians.get("connection") or 1.0
        print(f"{case}: median µs of CPU over {2 * rounds} runs of {number:,}")
        for name, value in medians.items():
            print(f"  {name:12} {value:7.2f} µs  x{value / base:.2f}")
        if "post" in medians and "h11_post" in medians:
            print(f"  h11_post / post x{medians['h11_post'] / medians['post']:.2f}")


if __name__ == "__main__":
    main()
