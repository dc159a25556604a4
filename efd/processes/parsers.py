"""Parser processes: large ingestion bodies turned into rows on the machine's other cores.

`ParserPool` is ingestion's `Parsers` (efd/http/ingest.py): JSON, validation, routing and the
exact webhook body run in child processes (efd/processes/pool.py) for bodies over 8 KiB; the
daemon checks the write key, stores the rows and answers. Parsing is pure, so a request
whose process died is simply parsed again in the daemon.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from efd.languages.filters import FilterSet
from efd.processes.pool import LOST, Pool
from efd.records import NewMessage
from efd.segment.payload import ChildParser, from_child
from efd.segment.routing import ActionSet

# (write key, name, destinations) of each source: what a parser process knows of them.
SourceList = Sequence[tuple[str, str, tuple[str, ...]]]
# Destination -> its filters, for the destinations that have some: pickled as configured,
# compiled again in the child.
Filters = Mapping[str, FilterSet]
# Destination -> its actions, for the actions destinations: their mappings compiled again in
# the child too.
Actions = Mapping[str, ActionSet]


class ParserChild:
    """A parser process's handler: ChildParser, called as the pool calls."""

    def __init__(self, setup: dict[str, Any]) -> None:
        self._setup = setup
        self._parse = ChildParser(setup["sources"], setup["filters"], setup["actions"])

    async def start(self) -> None:
        pass

    def configure(self, update: dict[str, Any]) -> None:
        if "sources" in update or "filters" in update or "actions" in update:
            self._setup = {**self._setup, **update}
            self._parse = ChildParser(
                self._setup["sources"], self._setup["filters"], self._setup["actions"]
            )

    async def __call__(
        self, data: bytes, source: str | None, type_: str | None, received_at: float
    ) -> tuple[Any, ...]:
        return self._parse(data, source, type_, received_at)

    async def close(self) -> None:
        pass


class ParserPool:
    def __init__(
        self,
        *,
        processes: int,
        sources: SourceList,
        filters: Filters,
        log_level: str,
        log_format: str,
        actions: Actions | None = None,
    ) -> None:
        self._pool = Pool(
            "parser",
            processes,
            "efd.processes.parsers:ParserChild",
            {"sources": list(sources), "filters": dict(filters), "actions": dict(actions or {})},
            log_level=log_level,
            log_format=log_format,
        )

    @property
    def pids(self) -> list[int]:
        return self._pool.pids

    async def start(self) -> None:
        await self._pool.start()

    async def close(self, timeout: float) -> None:
        await self._pool.close(timeout)

    async def reload(
        self, sources: SourceList, filters: Filters, log_level: str, actions: Actions | None = None
    ) -> None:
        await self._pool.configure(
            {
                "sources": list(sources),
                "filters": dict(filters),
                "actions": dict(actions or {}),
                "log_level": log_level,
            }
        )

    async def parse(
        self, data: bytes, source: str | None, type_: str | None, received_at: float
    ) -> tuple[str, list[NewMessage]] | None:
        result = await self._pool.call(data, source, type_, received_at)
        return None if result is LOST else from_child(result)
