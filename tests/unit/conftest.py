"""Unit tests marked `virtual_time` run on tests/unit/clocks.py's event loop."""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Mapping

import pytest

from tests.unit.clocks import VirtualTimeLoop


def pytest_asyncio_loop_factories(
    config: pytest.Config, item: pytest.Item
) -> Mapping[str, Callable[[], asyncio.AbstractEventLoop]]:
    if item.get_closest_marker("virtual_time") is not None:
        return {"virtual_time": VirtualTimeLoop}
    return {"asyncio": asyncio.new_event_loop}
