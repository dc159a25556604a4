"""CPU per POST of HTTP clients on uvloop, 64 concurrent, against a raw local receiver:
is aiohttp's client the wall of delivery's CPU per event?

    .venv/bin/python bench/experiments/http_clients.py [rounds] [variant ...]

Variants (each in the same process, one after the other, A B C … then again in reverse):
  aiohttp        session.post as efd's Sender does it (ClientTimeout, str URL, dict headers)
  aiohttp_tuned  the same session with a dummy cookie jar, a parsed URL, CIMultiDict headers
  efd_sender     efd.delivery.sender.Sender.send_round (signing, header building, result objects)
  efd_sender_unsigned, efd_sender_both   the same without signing, and with X-Signature and
                 Standard Webhooks with two secrets
  http1          efd's own client (efd/delivery/http1.py) as efd's Sender calls it: the
                 deadline, the pool, the request head checked, the answer parsed in full
  raw            a minimal keep-alive HTTP/1.1 client on asyncio.Protocol (no TLS, no
                 redirects, Content-Length answers only): a floor, not a candidate
"""

from __future__ import annotations

import asyncio
import hashlib
import hmac
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import cast

sys.path.insert(0, str(Path(__file__).resolve().parent))
from senders import BODY, RECEIVER

CONCURRENCY = 64
SECRET = b"secret"


def _headers(body: bytes) -> dict[str, str]:
    return {
        "User-Agent": "efd-bench",
        "Content-Type": "application/json",
        "webhook-id": "msg_" + "a" * 26,
        "X-Signature": hmac.new(SECRET, body, hashlib.sha1).hexdigest(),
    }


async def run_aiohttp(url: str, rounds: int, tuned: bool) -> None:
    import aiohttp
    from multidict import CIMultiDict
    from yarl import URL

    session = aiohttp.ClientSession(
        connector=aiohttp.TCPConnector(limit=0),
        timeout=aiohttp.ClientTimeout(total=5, connect=None, sock_read=None, ceil_threshold=1e9),
        trust_env=False,
        auto_decompress=False,
        skip_auto_headers=("Accept-Encoding", "Accept"),
        cookie_jar=aiohttp.DummyCookieJar() if tuned else None,
    )
    target = URL(url, encoded=True) if tuned else url
    body = BODY.encode()
    left = rounds

    async def client() -> None:
        nonlocal left
        while left > 0:
            left -= 1
            headers = _headers(body)
            async with session.post(
                target,
                data=body,
                headers=CIMultiDict(headers) if tuned else headers,
                allow_redirects=False,
            ) as response:
                await response.content.read(512)

    await asyncio.gather(*(client() for _ in range(CONCURRENCY)))
    await session.close()


async def run_efd_sender(url: str, rounds: int, signing: str = "x-signature") -> None:
    from efd.delivery.sender import SenderOptions
    from efd.segment.webhooks import Route

    keys = (bytes(range(24)), bytes(range(1, 33)))  # two Standard Webhooks secrets
    route = Route(
        "d",
        ((url, {}),),
        None if signing == "none" else SECRET.decode(),
        "efd-bench",
        standard_secrets=keys if signing == "both" else (),
    )
    sender = SenderOptions(5, ("127.0.0.0/8",), None, 512).sender()
    await sender.start()
    left = rounds

    async def client() -> None:
        nonlocal left
        while left > 0:
            left -= 1
            await sender.send_round(route, [url], BODY, "msg_" + "a" * 26)

    await asyncio.gather(*(client() for _ in range(CONCURRENCY)))
    await sender.close()


async def run_http1(url: str, rounds: int) -> None:
    from efd.delivery import netguard, tls
    from efd.delivery.http1 import Client

    client = Client(
        timeout=5,
        allowed=netguard.parse_networks(["127.0.0.0/8"]),
        tls=tls.verifying(None),
        keep=512,
        limit=1 << 20,
    )
    body = BODY.encode()
    left = rounds

    async def one() -> None:
        nonlocal left
        while left > 0:
            left -= 1
            await client.post(url, body, _headers(body))

    await asyncio.gather(*(one() for _ in range(CONCURRENCY)))
    await client.close()


class _Conn(asyncio.Protocol):
    transport: asyncio.Transport

    def __init__(self) -> None:
        self.buffer = b""
        self.waiter: asyncio.Future[int] | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = cast(asyncio.Transport, transport)  # a TCP connection's: a stream

    def data_received(self, data: bytes) -> None:
        self.buffer += data
        end = self.buffer.find(b"\r\n\r\n")
        if end < 0 or self.waiter is None:
            return
        head = self.buffer[:end].lower()
        i = head.find(b"content-length:")
        length = int(head[i + 15 : head.find(b"\r\n", i) if head.find(b"\r\n", i) > 0 else None])
        if len(self.buffer) < end + 4 + length:
            return
        status = int(self.buffer[9:12])
        self.buffer = self.buffer[end + 4 + length :]
        waiter, self.waiter = self.waiter, None
        waiter.set_result(status)


async def run_raw(url: str, rounds: int) -> None:
    loop = asyncio.get_running_loop()
    port = int(url.split(":")[2].split("/")[0])
    body = BODY.encode()
    left = rounds

    async def client() -> None:
        nonlocal left
        _, conn = await loop.create_connection(_Conn, "127.0.0.1", port)
        while left > 0:
            left -= 1
            headers = _headers(body)
            head = "".join(f"{k}: {v}\r\n" for k, v in headers.items())
            request = (
                f"POST /hook HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\n{head}"
                f"Content-Length: {len(body)}\r\n\r\n"
            ).encode() + body
            conn.waiter = loop.create_future()
            conn.transport.write(request)
            await conn.waiter
        conn.transport.close()

    await asyncio.gather(*(client() for _ in range(CONCURRENCY)))


VARIANTS = {
    "aiohttp": lambda url, n: run_aiohttp(url, n, tuned=False),
    "aiohttp_tuned": lambda url, n: run_aiohttp(url, n, tuned=True),
    "efd_sender": run_efd_sender,
    "efd_sender_unsigned": lambda url, n: run_efd_sender(url, n, "none"),
    "efd_sender_both": lambda url, n: run_efd_sender(url, n, "both"),
    "http1": run_http1,
    "raw": run_raw,
}


def main() -> None:
    import uvloop

    args = sys.argv[1:]
    rounds = int(args.pop(0)) if args and args[0].isdigit() else 20_000
    names = args or list(VARIANTS)
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    receiver = subprocess.Popen([sys.executable, "-c", RECEIVER, str(port)])
    url = f"http://127.0.0.1:{port}/hook"
    results: dict[str, list[float]] = {name: [] for name in names}
    try:
        time.sleep(0.5)
        for name in [*names, *reversed(names)]:
            cpu, wall = time.process_time(), time.perf_counter()
            uvloop.run(VARIANTS[name](url, rounds))
            cpu, wall = time.process_time() - cpu, time.perf_counter() - wall
            results[name].append(cpu / rounds * 1e6)
            print(
                f"{name:14} {rounds / wall:8,.0f} POST/s  {cpu / rounds * 1e6:6.1f} µs CPU a POST"
            )
    finally:
        receiver.kill()
    print(
        "mean µs CPU a POST: " + ", ".join(f"{k} {sum(v) / len(v):.1f}" for k, v in results.items())
    )


if __name__ == "__main__":
    main()
