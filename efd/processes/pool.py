"""Child processes that serve calls over a pipe: a generic pool for stateless, CPU-heavy
work the daemon hands off, so it runs on the machine's other cores (one Python process runs
on one core at a time).

Two kinds run on it: sender processes (efd/delivery/sender.py: sign and POST rounds) and parser
processes (efd/processes/parsers.py: large ingestion bodies to rows). Each names a *handler*, an
import path "module:factory"; the child builds it from the pool's set-up and calls it for
every request. Children hold nothing durable: a child that dies takes only the answers it
owed, which become `LOST` for their callers to handle (each kind says how), and it is
started again.

The pipe carries length-prefixed pickle frames between trusted ends of one program:
parent → child, first the set-up, then lists of (request id, *request); child → parent,
first ("ready", pid), then lists of (request id, result).
"""

from __future__ import annotations

import asyncio
import contextlib
import importlib
import logging
import os
import pickle
import signal
import struct
import sys
import time
from collections.abc import Callable
from typing import Any, Protocol

from efd.loop import Backoff
from efd.observe import logs
from efd.processes import collector

log = logging.getLogger(__name__)

_HEADER = struct.Struct("<I")
_READY_TIMEOUT = 60.0  # seconds for a child to import efd and answer

LOST: Any = object()  # the answer to a request whose child died (or failed) before answering
# How a child says a call failed: a marker that pickles (LOST is an identity, per process).
_FAILED = ("efd.processes.pool", "failed")


class Handler(Protocol):
    """What a child runs: built by the factory the pool names, from the pool's set-up;
    `configure` takes the changed parts of it (a reload)."""

    async def start(self) -> None: ...

    async def __call__(self, *request: Any) -> Any: ...

    def configure(self, update: dict[str, Any]) -> None: ...

    async def close(self) -> None: ...


_CONFIGURE = "efd.processes.pool:configure"  # a request that is a set-up update, for every child

Convert = Callable[[Any], Any]  # what a caller makes of an answer (or of LOST)


def _same(answer: Any) -> Any:
    return answer


def _settle(future: asyncio.Future[Any], convert: Convert, answer: Any) -> None:
    if future.done():
        return  # the caller stopped waiting (cancelled)
    try:
        future.set_result(convert(answer))
    except Exception as error:  # a bug in the caller's conversion: its future says so
        future.set_exception(error)


def _frame(value: Any) -> bytes:
    data = pickle.dumps(value, protocol=pickle.HIGHEST_PROTOCOL)
    return _HEADER.pack(len(data)) + data


async def _read_frame(reader: asyncio.StreamReader) -> Any:
    (size,) = _HEADER.unpack(await reader.readexactly(_HEADER.size))
    # Both ends are this program, over a pipe to its own child: never outside input.
    return pickle.loads(await reader.readexactly(size))  # noqa: S301


class Pool:
    """`processes` children running `handler`; each call goes to the least busy running one
    (one being restarted queues its calls until it is back)."""

    def __init__(
        self,
        kind: str,
        processes: int,
        handler: str,
        setup: dict[str, Any],
        *,
        log_level: str,
        log_format: str,
    ) -> None:
        frame = {**setup, "handler": handler, "log_level": log_level, "log_format": log_format}
        self._children = [_Child(f"{kind} process {index}", frame) for index in range(processes)]

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

    async def call(self, *request: Any) -> Any:
        """The handler's answer to `request`, or LOST."""
        return await self.submit(*request)

    def submit(self, *request: Any, convert: Convert = _same) -> asyncio.Future[Any]:
        """Send `request` now; the future holds `convert` of the handler's answer (or of
        LOST), applied as the answer is read: the caller's callback on the future runs at
        the loop's next turn, with no second future in between."""
        children = self._children
        child = children[0] if len(children) == 1 else min(children, key=_load)
        return child.send(request, convert)

    async def configure(self, update: dict[str, Any]) -> None:
        """Change part of every child's set-up (a reload): requests sent after this use it,
        and so does a child started again later. Requests in progress finish as they were."""
        for child in self._children:
            child.update_setup(update)
        await asyncio.gather(*(child.send((_CONFIGURE, update)) for child in self._children))

    async def close(self, timeout: float) -> None:
        """Stop the children (after the daemon's own drain); kill any that takes longer
        than `timeout`."""
        await asyncio.gather(*(child.close(timeout) for child in self._children))


def _load(child: _Child) -> tuple[bool, int]:
    """Orders children for a new request: running ones first, then the least busy."""
    return (not child.running, len(child.pending))


class _Child:
    """The parent's end of one child process; restarts it when it dies."""

    def __init__(self, name: str, setup: dict[str, Any]) -> None:
        self.name = name
        self._setup_values = setup
        self._setup = _frame(setup)
        self._proc: asyncio.subprocess.Process | None = None
        self._ready = False
        self._closing = False
        self._next_id = 0
        # request id -> (future, convert): sent to the current process (or queued), not answered
        self.pending: dict[int, tuple[asyncio.Future[Any], Convert]] = {}
        self._outbox: list[tuple[Any, ...]] = []
        self._flush_scheduled = False
        self._reader_task: asyncio.Task[None] | None = None
        self._restarts = Backoff(initial=0.25, maximum=10.0)
        # Held: asyncio.get_running_loop() asks the kernel for the process id at each call.
        self._loop: asyncio.AbstractEventLoop | None = None

    @property
    def running(self) -> bool:
        return self._ready

    def update_setup(self, update: dict[str, Any]) -> None:
        self._setup_values = {**self._setup_values, **update}
        self._setup = _frame(self._setup_values)

    @property
    def pid(self) -> int | None:
        proc = self._proc
        return proc.pid if proc is not None and proc.returncode is None else None

    async def start(self) -> None:
        self._loop = asyncio.get_running_loop()
        proc = await asyncio.create_subprocess_exec(
            sys.executable,
            "-c",
            "from efd.processes.pool import main; main()",
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

    def send(self, request: tuple[Any, ...], convert: Convert = _same) -> asyncio.Future[Any]:
        future: asyncio.Future[Any] = (self._loop or asyncio.get_running_loop()).create_future()
        self._next_id += 1
        self.pending[self._next_id] = (future, convert)
        self._outbox.append((self._next_id, *request))
        self._schedule_flush()
        return future

    def _schedule_flush(self) -> None:
        if not self._flush_scheduled and self._outbox:
            self._flush_scheduled = True
            (self._loop or asyncio.get_running_loop()).call_soon(self._flush)

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
                    entry = self.pending.pop(request_id, None)
                    if entry is not None:
                        failed = isinstance(result, tuple) and result == _FAILED
                        _settle(*entry, LOST if failed else result)
        except (asyncio.IncompleteReadError, ConnectionError, pickle.UnpicklingError):
            pass
        self._ready = False
        status = await proc.wait()
        self._fail_pending()
        if self._closing:
            return
        if time.monotonic() - started > 30:
            self._restarts.reset()  # it ran a while: not a crash loop
            delay = 0.0
        else:
            delay = self._restarts.next()
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
        for request_id, entry in pending.items():
            if request_id in queued:
                self.pending[request_id] = entry  # never left: goes to the next process
            else:
                _settle(*entry, LOST)

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


def _handler(setup: dict[str, Any]) -> Handler:
    module, _, factory = setup["handler"].partition(":")
    made: Handler = getattr(importlib.import_module(module), factory)(setup)
    return made


async def _child_main() -> None:
    loop = asyncio.get_running_loop()
    reader = asyncio.StreamReader()
    await loop.connect_read_pipe(
        lambda: asyncio.StreamReaderProtocol(reader), os.fdopen(0, "rb", buffering=0)
    )
    out, _ = await loop.connect_write_pipe(asyncio.Protocol, os.fdopen(1, "wb", buffering=0))
    setup = await _read_frame(reader)
    logs.setup(setup["log_level"], setup["log_format"])
    handler = _handler(setup)
    await handler.start()
    collector.freeze()
    out.write(_frame(("ready", os.getpid())))

    outbox: list[tuple[int, Any]] = []
    tasks: set[asyncio.Task[None]] = set()

    def flush() -> None:
        if outbox and not out.is_closing():
            out.write(_frame(outbox[:]))
        outbox.clear()

    async def one(request_id: int, *request: Any) -> None:
        try:
            if request and request[0] == _CONFIGURE:
                update = request[1]
                if "log_level" in update:
                    logging.getLogger().setLevel(update["log_level"])
                handler.configure(update)
                result = None
            else:
                result = await handler(*request)
        except Exception:
            log.exception("a %s call failed", setup["handler"])
            result = _FAILED
        if not outbox:
            loop.call_soon(flush)
        outbox.append((request_id, result))

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
        # up on; or it died, and nobody would use an answer. Either way, stop.
        for task in tasks:
            task.cancel()
        if tasks:
            await asyncio.wait(set(tasks))
    finally:
        await handler.close()
        out.close()


def main() -> None:
    # The daemon decides when its children stop (it closes their pipe after its own
    # drain); a terminal's Ctrl-C or systemd's SIGTERM to the whole group must not cut
    # them short first.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    collector.tune()
    try:
        import uvloop
    except ImportError:
        asyncio.run(_child_main())
    else:
        uvloop.run(_child_main())


if __name__ == "__main__":
    main()
