"""Rounds per second, and the CPU per round of this process and of its sender processes:
sending in-process vs sender processes.

    .venv/bin/python bench/experiments/senders.py [processes ...]   # default: 0 1 2

A raw HTTP/1.1 receiver runs in its own process; 64 concurrent rounds of one signed POST each.
"""

from __future__ import annotations

import asyncio
import socket
import subprocess
import sys
import time
from pathlib import Path

from efd.delivery.sender import SenderOptions, SenderPool
from efd.segment.webhooks import Route

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from efdbench.procstats import own_cpu_seconds

RECEIVER = r"""
import asyncio, sys, uvloop

class Answer(asyncio.Protocol):
    def connection_made(self, transport):
        self.transport, self.buffer = transport, b""

    def data_received(self, data):
        self.buffer += data
        while (end := self.buffer.find(b"\r\n\r\n")) >= 0:
            length = 0
            for line in self.buffer[:end].split(b"\r\n"):
                if line.lower().startswith(b"content-length:"):
                    length = int(line.split(b":")[1])
            if len(self.buffer) < end + 4 + length:
                return
            self.buffer = self.buffer[end + 4 + length :]
            self.transport.write(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok")

async def main():
    loop = asyncio.get_running_loop()
    await loop.create_server(Answer, "127.0.0.1", int(sys.argv[1]))
    await asyncio.sleep(3600)

uvloop.run(main())
"""
BODY = (
    '{"version":1,"type":"track","userId":"u1","event":"Order Completed",'
    '"properties":{"revenue":12.5,"items":3},"messageId":"abc-123",'
    '"timestamp":"2026-01-01T00:00:00.000Z"}'
)
ROUNDS = 100_000
CONCURRENCY = 64


async def measure(processes: int, port: int) -> None:
    url = f"http://127.0.0.1:{port}/hook"
    route = Route("d", ((url, {}),), "secret", "efd-bench")
    options = SenderOptions(5, ("127.0.0.0/8",), None, 512)
    pool = (
        SenderPool(
            processes=processes,
            options=options,
            routes=[route],
            log_level="WARNING",
            log_format="text",
        )
        if processes
        else options.sender()
    )
    await pool.start()
    sent = 0

    async def client() -> None:
        nonlocal sent
        while sent < ROUNDS:
            sent += 1
            await pool.start_round(route, [url], BODY, (sent, "web", "bench", 0.0))

    pids = pool.pids if isinstance(pool, SenderPool) else []
    children = sum(own_cpu_seconds(pid) for pid in pids)
    cpu, wall = time.process_time(), time.perf_counter()
    await asyncio.gather(*(client() for _ in range(CONCURRENCY)))
    wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
    children = sum(own_cpu_seconds(pid) for pid in pids) - children
    print(
        f"sender_processes={processes}: {ROUNDS / wall:8,.0f} rounds/s, "
        f"this process {cpu / ROUNDS * 1e6:6.1f} µs CPU a round, "
        f"sender processes {children / ROUNDS * 1e6:6.1f}"
    )
    if isinstance(pool, SenderPool):
        await pool.close(5)
    else:
        await pool.close()


def main() -> None:
    import uvloop

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    receiver = subprocess.Popen([sys.executable, "-c", RECEIVER, str(port)])
    try:
        time.sleep(0.5)
        for processes in [int(a) for a in sys.argv[1:]] or [0, 1, 2]:
            uvloop.run(measure(processes, port))
    finally:
        receiver.kill()


if __name__ == "__main__":
    main()
