"""What the tests of JavaScript clients share: the npm packages in tests/js (installed by
scripts/setup-js) and the exactly-once check of what arrived.

They skip when node, the packages or Chromium are missing, unless EFD_REQUIRE_NODE=1 or
EFD_REQUIRE_BROWSER=1 (scripts/test sets both) makes that a failure, so CI cannot skip them
silently.
"""

from __future__ import annotations

import os
import shutil
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

from efd.segment import webhooks
from tests.conftest import ROOT, SECRET, Receiver, eventually, sql

JS = ROOT / "tests" / "js"
NODE_MODULES = JS / "node_modules"
CHROMIUM = Path(os.environ.get("EFD_CHROMIUM", "/usr/bin/chromium"))


def need(present: bool, what: str, variable: str) -> None:
    """Skip (or fail, when `variable` is 1) unless `present`."""
    if present:
        return
    if os.environ.get(variable) == "1":
        pytest.fail(f"{what}, and {variable}=1 requires it (scripts/setup-js installs it)")
    pytest.skip(f"{what} (scripts/setup-js installs it)")


def node() -> str:
    """The node binary, with tests/js's packages installed."""
    path = shutil.which("node")
    need(path is not None, "no node on PATH", "EFD_REQUIRE_NODE")
    need(
        (NODE_MODULES / ".package-lock.json").is_file(),
        "the npm packages of tests/js are not installed",
        "EFD_REQUIRE_NODE",
    )
    assert path is not None
    return path


async def delivered_once(
    db_url: str, receiver: Receiver, message_ids: list[str]
) -> list[dict[str, Any]]:
    """Each message stored once, delivered once, and seen once by `receiver`, signed.

    Waits for the receiver, then for every delivery to finish, so that the receiver's count
    is final when it is compared: no retry can still be on its way.
    """
    expected = Counter(message_ids)
    assert max(expected.values()) == 1, "the client sent a messageId twice"
    await receiver.wait_for(len(expected), timeout=30)

    def finished() -> list[Any] | None:
        rows = sql(
            db_url,
            "SELECT m.message_id, d.status FROM messages m"
            " JOIN deliveries d ON d.message_pk = m.id",
        )
        done = len(rows) >= len(expected) and all(status != "pending" for _, status in rows)
        return rows if done else None

    rows = await eventually(finished, timeout=30)
    assert Counter(message_id for message_id, _ in rows) == expected
    assert {status for _, status in rows} == {"delivered"}
    bodies = [request.json() for request in receiver.received]
    assert Counter(body["messageId"] for body in bodies) == expected
    for request in receiver.received:
        assert request.headers["X-Signature"] == webhooks.sign(SECRET, request.body)
    return bodies
