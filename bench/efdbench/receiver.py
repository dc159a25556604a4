"""The webhook receiver (own process): raw asyncio HTTP/1.1 on uvloop. Answers 200 or 503,
records the first receipt of each messageId, counts duplicates, checks sampled signatures."""

from __future__ import annotations

import asyncio
import hashlib
import hmac
import os
import socket
import time
from typing import Any, cast

from efdbench.bodies import SECRET

_OK = b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: 2\r\n\r\n{}"
_UNAVAILABLE = (
    b"HTTP/1.1 503 Service Unavailable\r\nContent-Type: application/json\r\n"
    b"Content-Length: 2\r\n\r\n{}"
)
_MID = b'"messageId":"'


class _ReceiverState:
    def __init__(self, received: Any) -> None:
        self.received = received  # shared counter: unique messageIds answered 200
        self.status = 200
        self.seen: dict[str, float] = {}
        self.duplicates = 0
        self.hook_200 = 0
        self.hook_503 = 0
        self.bare = 0
        self.bad_signatures = 0
        self.checked_signatures = 0
        self.no_id = 0
        self.requests = 0

    def reset(self) -> None:
        self.seen.clear()
        self.duplicates = self.hook_200 = self.hook_503 = self.bare = 0
        self.bad_signatures = self.checked_signatures = self.no_id = 0
        self.received.value = 0

    def handle(self, path: bytes, head: bytes, body: bytes) -> bytes:
        self.requests += 1
        if path == b"/bare":
            self.bare += 1
            return _OK
        if self.status != 200:
            self.hook_503 += 1
            return _UNAVAILABLE
        now = time.monotonic()
        self.hook_200 += 1
        if self.hook_200 % 101 == 1:  # verify a sample of signatures: efd signs correctly
            self.checked_signatures += 1
            i = head.lower().find(b"\r\nx-signature:")
            sig = b""
            if i < 0:  # an unsigned destination (bench/run.py --signing none)
                self.checked_signatures -= 1
            else:
                j = head.find(b"\r\n", i + 2)
                sig = head[i + 14 : j if j >= 0 else len(head)].strip()
            expected = hmac.new(SECRET.encode(), body, hashlib.sha1).hexdigest().encode()
            if i >= 0 and not hmac.compare_digest(sig, expected):
                self.bad_signatures += 1
        i = body.find(_MID)
        if i < 0:
            self.no_id += 1
            return _OK
        j = body.find(b'"', i + 13)
        mid = body[i + 13 : j].decode()
        if mid in self.seen:
            self.duplicates += 1
        else:
            self.seen[mid] = now
            self.received.value += 1
        return _OK

    def stats(self) -> dict[str, Any]:
        return {
            "unique": len(self.seen),
            "duplicates": self.duplicates,
            "hook_200": self.hook_200,
            "hook_503": self.hook_503,
            "bare": self.bare,
            "requests": self.requests,
            "checked_signatures": self.checked_signatures,
            "bad_signatures": self.bad_signatures,
            "no_id": self.no_id,
        }


class _ReceiverProtocol(asyncio.Protocol):
    def __init__(self, state: _ReceiverState) -> None:
        self.state = state
        self.buf = bytearray()
        self.transport: asyncio.Transport | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = cast(asyncio.Transport, transport)  # a TCP connection's: a stream

    def data_received(self, data: bytes) -> None:
        buf = self.buf
        buf += data
        out = []
        while True:
            end = buf.find(b"\r\n\r\n")
            if end < 0:
                break
            head = bytes(buf[:end])
            i = head.lower().find(b"\r\ncontent-length:")
            length = 0
            if i >= 0:
                j = head.find(b"\r\n", i + 2)
                length = int(head[i + 17 : j if j >= 0 else len(head)])
            total = end + 4 + length
            if len(buf) < total:
                break
            body = bytes(buf[end + 4 : total])
            del buf[:total]
            first = head.find(b" ")
            path = head[first + 1 : head.find(b" ", first + 1)]
            out.append(self.state.handle(path, head, body))
        if out and self.transport is not None:
            self.transport.write(b"".join(out))


async def _receiver_serve(conn: Any, received: Any, blackhole_backlog: int) -> None:
    loop = asyncio.get_running_loop()
    state = _ReceiverState(received)
    server = await loop.create_server(
        lambda: _ReceiverProtocol(state), "127.0.0.1", 0, backlog=1024
    )
    port = server.sockets[0].getsockname()[1]
    # The blackhole: a listening socket that is never accepted from. A request to it
    # connects (the kernel completes the handshake) and then waits forever.
    blackhole = socket.socket()
    blackhole.bind(("127.0.0.1", 0))
    blackhole.listen(blackhole_backlog)
    conn.send({"port": port, "blackhole_port": blackhole.getsockname()[1], "pid": os.getpid()})
    stop = asyncio.Event()

    def on_command() -> None:
        os.set_blocking(conn.fileno(), True)  # the event loop made it non-blocking
        while conn.poll():
            cmd, *args = conn.recv()
            if cmd == "status":
                state.status = args[0]
                conn.send(True)
            elif cmd == "stats":
                conn.send(state.stats())
            elif cmd == "receipts":
                prefix = args[0]
                conn.send({k: v for k, v in state.seen.items() if k.startswith(prefix)})
            elif cmd == "missing":
                conn.send([mid for mid in args[0] if mid not in state.seen])
            elif cmd == "reset":
                state.reset()
                conn.send(True)
            elif cmd == "close_blackhole":
                blackhole.close()
                conn.send(True)
            elif cmd == "stop":
                stop.set()
                conn.send(True)

    loop.add_reader(conn.fileno(), on_command)
    await stop.wait()
    server.close()


def receiver_main(conn: Any, received: Any, blackhole_backlog: int) -> None:
    import uvloop

    uvloop.run(_receiver_serve(conn, received, blackhole_backlog))
