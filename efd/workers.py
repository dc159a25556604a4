"""Child processes for the CPU-heavy, stateless work: sending rounds and parsing requests.

One Python process runs on one core at a time. The daemon's own process holds the HTTP
server, the store and the dispatcher's bookkeeping (claims, retry decisions, outcomes).
Two kinds of children take work that needs no state off it, so that work uses the
machine's other cores:

- sender processes (`delivery.sender_processes`) sign and POST the rounds they are handed
  (aiohttp, TLS, the address guard) and report what each receiver did;
- parser processes (`server.parse_processes`) turn large ingestion bodies into rows:
  JSON, validation, routing and the exact webhook body.

Children hold nothing durable. The dispatcher leases a delivery before handing its round
to a child and records the outcome the child reports, exactly as when it sends itself;
the daemon stores the rows a parser returns in its own transaction. A child that dies
takes only the answers it owed: a sender's rounds become attempts with error class
`interrupted` (outcome unknown, retried like a reset connection); a parser's requests are
parsed again in the daemon (parsing is pure). Either child is then started again.

The pipe carries length-prefixed pickle frames between trusted ends of one program:
parent → child, first the set-up, then lists of (request id, *request); child → parent,
first ("ready", pid), then lists of (request id, result).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import pickle
import signal
import struct
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from efd import logs
from efd.retry import AttemptResult, Verdict
from efd.sender import Route, Sender

log = logging.getLogger(__name__)

_HEADER = struct.Struct("<I")
_READY_TIMEOUT = 60.0  # seconds for a child to import efd and answer
_INTERRUPTED = "the sender process exited before the answer; the outcome is unknown"

ResultTuple = tuple[
    str, float, float, str, int | None, str | None, str | None, str | None, float | None
]


def _frame(value: Any) -> bytes:
    data = pickle.dumps(value, protocol=pickle.HIGHEST_PROTOCOL)
    return _HEADER.pack(len(data)) + data


async def _read_frame(reader: asyncio.StreamReader) -> Any:
    (size,) = _HEADER.unpack(await reader.readexactly(_HEADER.size))
    # Both ends are this program, over a pipe to its own child: never outside input.
    return pickle.loads(await reader.readexactly(size))  # noqa: S301


def _to_tuple(r: AttemptResult) -> ResultTuple:
    return (
        r.hook_url,
        r.started_at,
        r.duration,
        r.verdict.value,
        r.status_code,
        r.error_class,
        r.error,
        r.response_head,
        r.retry_after,
    )


def _from_tuple(t: ResultTuple) -> AttemptResult:
    url, started_at, duration, verdict, status, error_class, error, head, retry_after = t
    return AttemptResult(
        url, started_at, duration, Verdict(verdict), status, error_class, error, head, retry_after
    )


@dataclass(frozen=True, slots=True)
class SenderOptions:
    timeout: float
    allowed_networks: tuple[str, ...]
    ca_file: str | None
    response_head_bytes: int

    def sender(self) -> Sender:
        return Sender(
            timeout=self.timeout,
            allowed_networks=self.allowed_networks,
            ca_file=self.ca_file,
            response_head_bytes=self.response_head_bytes,
        )


LOST: Any = object()  # the result of a request whose child died before answering


class _Pool:
    """Children of one kind; each request goes to the least busy running one."""

    def __init__(self, kind: str, processes: int, setup: dict[str, Any]) -> None:
        setup = {"role": kind, **setup}  # which main the child runs (_child_main)
        self._children = [_Child(kind, index, setup) for index in range(processes)]

    @property
    def pids(self) -> list[int]:
        """The running children's process ids (for operators' tools and tests)."""
        return [child.pid for child in self._children if child.pid is not None]

    async def start(self) -> None:
        """Start the children and wait until each has answered; if one cannot start, stop
        the others."""
        try:
            async with asyncio.TaskGroup() as group:
                for child in self._children:
                    group.create_task(child.start())
        except BaseExceptionGroup as errors:
            raise errors.exceptions[0] from None

    def _request(self, request: tuple[Any, ...]) -> asyncio.Future[Any]:
        # One being restarted queues its requests until it is back.
        child = min(self._children, key=lambda c: (not c.running, len(c.pending)))
        return child.send(request)

    async def close(self, timeout: float) -> None:
        """Stop the children (after the daemon's own drain); kill any that takes longer
        than `timeout`."""
        await asyncio.gather(*(child.close(timeout) for child in self._children))


class SenderPool(_Pool):
    """The dispatcher's `Rounds` when rounds are sent by child processes."""

    def __init__(
        self,
        *,
        processes: int,
        options: SenderOptions,
        routes: Sequence[Route],
        log_level: str,
        log_format: str,
    ) -> None:
        setup = {
            "options": options,
            "routes": list(routes),
            "log_level": log_level,
            "log_format": log_format,
        }
        super().__init__("sender", processes, setup)

    async def send_round(self, route: Route, urls: Sequence[str], body: str) -> list[AttemptResult]:
        sent_at = time.time()
        results = await self._request((route.name, tuple(urls), body))
        if results is LOST:
            duration = time.time() - sent_at
            return [
                AttemptResult(
                    url,
                    sent_at,
                    duration,
                    Verdict.RETRY,
                    error_class="interrupted",
                    error=_INTERRUPTED,
                )
                for url in urls
            ]
        return [_from_tuple(r) for r in results]


class ParserPool(_Pool):
    """Parses ingestion bodies in child processes (see `efd.ingest.parse_request`)."""

    def __init__(
        self,
        *,
        processes: int,
        sources: Sequence[tuple[str, str, tuple[str, ...]]],  # (write key, name, destinations)
        log_level: str,
        log_format: str,
    ) -> None:
        setup = {
            "sources": list(sources),
            "log_level": log_level,
            "log_format": log_format,
        }
        super().__init__("parser", processes, setup)

    async def parse(
        self, data: bytes, source: str | None, type_: str | None, received_at: float
    ) -> Any:
        """("ok", source name, row tuples), ("rejected", code, message, field, index,
        status), or LOST when the child died: then the caller parses it itself."""
        return await self._request((data, source, type_, received_at))


class _Child:
    """The parent's end of one child process; restarts it when it dies."""

    def __init__(self, kind: str, index: int, setup: dict[str, Any]) -> None:
        self.name = f"{kind} process {index}"
        self._setup = _frame(setup)
        self._proc: asyncio.subprocess.Process | None = None
        self._ready = False
        self._closing = False
        self._next_id = 0
        # request id -> future: sent to the current process (or queued), not answered
        self.pending: dict[int, asyncio.Future[Any]] = {}
        self._outbox: list[tuple[Any, ...]] = []
        self._flush_scheduled = False
        self._reader_task: asyncio.Task[None] | None = None
        self._restarts = 0

    @property
    def running(self) -> bool:
        return self._ready

    @property
    def pid(self) -> int | None:
        proc = self._proc
        return proc.pid if proc is not None and proc.returncode is None else None

    async def start(self) -> None:
        proc = await asyncio.create_subprocess_exec(
            sys.executable,
            "-c",
            "from efd.workers import main; main()",
            stdin=asyncio.subprocess.PIPE,
            stdout=asyncio.subprocess.PIPE,
        )
        try:
            assert proc.stdin is not None
            assert proc.stdout is not None
            proc.stdin.write(self._setup)
            async with asyncio.timeout(_READY_TIMEOUT):
                hello = await _read_frame(proc.stdout)
            if not (isinstance(hello, tuple) and hello[0] == "ready"):
                raise pickle.UnpicklingError(f"unexpected first frame {hello!r:.80}")
        except BaseException as error:  # cancelled too: never leave a child behind
            with contextlib.suppress(ProcessLookupError):
                proc.kill()
            await asyncio.shield(proc.wait())
            if isinstance(error, TimeoutError | asyncio.IncompleteReadError | pickle.PickleError):
                raise RuntimeError(
                    f"{self.name} did not start (exit status "
                    f"{proc.returncode}); its error, if any, is logged above"
                ) from error
            raise
        log.info("%s started (pid %s)", self.name, hello[1])
        self._proc = proc
        self._ready = True
        self._reader_task = asyncio.create_task(self._read(proc), name=f"efd-{self.name}-reader")
        self._schedule_flush()

    def send(self, request: tuple[Any, ...]) -> asyncio.Future[Any]:
        future: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
        self._next_id += 1
        self.pending[self._next_id] = future
        self._outbox.append((self._next_id, *request))
        self._schedule_flush()
        return future

    def _schedule_flush(self) -> None:
        if not self._flush_scheduled and self._outbox:
            self._flush_scheduled = True
            asyncio.get_running_loop().call_soon(self._flush)

    def _flush(self) -> None:
        """Send every request queued this loop iteration in one frame."""
        self._flush_scheduled = False
        proc = self._proc
        if not self._ready or proc is None or proc.stdin is None or not self._outbox:
            return  # sent once the process is (re)started
        batch, self._outbox = self._outbox, []
        proc.stdin.write(_frame(batch))

    async def _read(self, proc: asyncio.subprocess.Process) -> None:
        assert proc.stdout is not None
        started = time.monotonic()
        try:
            while True:
                for request_id, result in await _read_frame(proc.stdout):
                    future = self.pending.pop(request_id, None)
                    if future is not None and not future.done():
                        future.set_result(result)
        except (asyncio.IncompleteReadError, ConnectionError, pickle.UnpicklingError):
            pass
        self._ready = False
        status = await proc.wait()
        self._fail_pending()
        if self._closing:
            return
        lived = time.monotonic() - started
        self._restarts = 0 if lived > 30 else self._restarts + 1
        delay = min(10.0, 0.25 * 2**self._restarts) if self._restarts else 0.0
        log.error(
            "%s exited unexpectedly (status %s); restarting in %.1f s", self.name, status, delay
        )
        await asyncio.sleep(delay)
        while not self._closing:
            try:
                await self.start()
                return
            except (RuntimeError, OSError) as error:
                log.error("%s; retrying in 10 s", error)
                await asyncio.sleep(10.0)

    def _fail_pending(self, *, queued_too: bool = False) -> None:
        """The requests the dead process held are LOST (sent or not, nobody knows). Those
        still queued here wait for the next process, unless `queued_too`."""
        pending, self.pending = self.pending, {}
        queued = set() if queued_too else {request[0] for request in self._outbox}
        for request_id, future in pending.items():
            if request_id in queued:
                self.pending[request_id] = future  # never left: goes to the next process
            elif not future.done():
                future.set_result(LOST)

    async def close(self, timeout: float) -> None:
        self._closing = True
        proc = self._proc
        if proc is None:
            return
        self._flush()
        if proc.returncode is None and proc.stdin is not None:
            proc.stdin.close()  # the child cancels what it still holds, then exits
        try:
            async with asyncio.timeout(timeout):
                await proc.wait()
        except TimeoutError:
            log.warning("%s did not stop in %.1f s; killing it", self.name, timeout)
            with contextlib.suppress(ProcessLookupError):
                proc.kill()
            await proc.wait()
        task = self._reader_task
        if task is not None and not task.done():
            await asyncio.wait({task}, timeout=1.0)
            task.cancel()  # still waiting to restart a process that died
            with contextlib.suppress(asyncio.CancelledError):
                await task
        self._outbox.clear()
        self._fail_pending(queued_too=True)


# -- the child -----------------------------------------------------------------------------


async def _child_main() -> None:
    loop = asyncio.get_running_loop()
    reader = asyncio.StreamReader()
    await loop.connect_read_pipe(
        lambda: asyncio.StreamReaderProtocol(reader), os.fdopen(0, "rb", buffering=0)
    )
    out, _ = await loop.connect_write_pipe(asyncio.Protocol, os.fdopen(1, "wb", buffering=0))
    setup = await _read_frame(reader)
    logs.setup(setup["log_level"], setup["log_format"])
    if setup["role"] == "parser":
        await _parser_main(setup, reader, out)
    else:
        await _sender_main(setup, reader, out)


async def _parser_main(
    setup: dict[str, Any], reader: asyncio.StreamReader, out: asyncio.WriteTransport
) -> None:
    from efd.ingest import ChildParser  # the daemon's ingestion rules, loaded here only

    parse = ChildParser(setup["sources"])
    out.write(_frame(("ready", os.getpid())))
    while True:
        try:
            batch = await _read_frame(reader)
        except asyncio.IncompleteReadError:
            break  # the daemon closed the pipe, or died
        out.write(_frame([(request[0], parse(*request[1:])) for request in batch]))
    out.close()


async def _sender_main(
    setup: dict[str, Any], reader: asyncio.StreamReader, out: asyncio.WriteTransport
) -> None:
    loop = asyncio.get_running_loop()
    routes: dict[str, Route] = {route.name: route for route in setup["routes"]}
    options: SenderOptions = setup["options"]
    sender = options.sender()
    await sender.start()
    out.write(_frame(("ready", os.getpid())))

    outbox: list[tuple[int, list[ResultTuple]]] = []
    tasks: set[asyncio.Task[None]] = set()

    def flush() -> None:
        if outbox and not out.is_closing():
            out.write(_frame(outbox[:]))
        outbox.clear()

    async def one(request_id: int, destination: str, urls: tuple[str, ...], body: str) -> None:
        try:
            results = await sender.send_round(routes[destination], urls, body)
        except Exception as error:  # a bug, not the network: report it, keep serving
            log.exception("sending a round to %s failed", destination)
            now = time.time()
            results = [
                AttemptResult(
                    url, now, 0.0, Verdict.RETRY, error_class="internal", error=repr(error)
                )
                for url in urls
            ]
        if not outbox:
            loop.call_soon(flush)
        outbox.append((request_id, [_to_tuple(r) for r in results]))

    try:
        while True:
            try:
                batch = await _read_frame(reader)
            except asyncio.IncompleteReadError:
                break
            for request in batch:
                task = loop.create_task(one(*request))
                tasks.add(task)
                task.add_done_callback(tasks.discard)
        # The daemon closed the pipe: after its own drain, so anything still here was given
        # up on; or it died, and nobody would record an answer. Either way, stop sending.
        for task in tasks:
            task.cancel()
        if tasks:
            await asyncio.wait(set(tasks))
    finally:
        await sender.close()
        out.close()


def main() -> None:
    # The daemon decides when its children stop (it closes their pipe after its own
    # drain); a terminal's Ctrl-C or systemd's SIGTERM to the whole group must not cut
    # them short first.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    try:
        import uvloop
    except ImportError:
        asyncio.run(_child_main())
    else:
        uvloop.run(_child_main())


if __name__ == "__main__":
    main()
