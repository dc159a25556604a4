"""The habits of the repository: the lock files hold what pyproject.toml asks, at one version
each, with hashes; every package of efd is in the distribution; the pre-commit hooks run the
checks scripts/test runs; no unit test waits real time."""

from __future__ import annotations

import ast
import re
import tomllib
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]
PYPROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())
PROJECT = PYPROJECT["project"]
LOCKS = {"base": [], "dev": ["dev"], "bench": ["bench"], "bench-dev": ["bench", "dev"]}


def name(requirement: str) -> str:
    found = re.match(r"[A-Za-z0-9._-]+", requirement)
    assert found is not None, requirement
    return re.sub(r"[-_.]+", "-", found.group(0)).lower()


def pins(lock: str) -> dict[str, str]:
    text = (ROOT / "requirements" / f"{lock}.txt").read_text()
    found: dict[str, str] = {}
    for entry in re.split(r"\n(?=\S)", text):
        if entry.startswith("#") or not entry.strip():
            continue
        pinned = re.match(r"([A-Za-z0-9._-]+)==([^\s;\\]+)", entry)
        assert pinned is not None, entry
        assert "--hash=sha256:" in entry, f"{lock}: {pinned.group(1)} has no hash"
        found[name(pinned.group(1))] = pinned.group(2)
    return found


def test_every_package_is_in_the_distribution() -> None:
    # An editable install finds a package left out of the list; a wheel would not hold it.
    found = {
        ".".join(init.parent.relative_to(ROOT).parts)
        for init in (ROOT / "efd").rglob("__init__.py")
    }
    listed = set(PYPROJECT["tool"]["setuptools"]["packages"])
    assert found - listed == set()


@pytest.mark.parametrize("lock", sorted(LOCKS))
def test_each_lock_file_pins_what_pyproject_asks(lock: str) -> None:
    asked = list(PROJECT["dependencies"])
    for extra in LOCKS[lock]:
        asked += PROJECT["optional-dependencies"][extra]
    pinned = pins(lock)
    missing = sorted({name(r) for r in asked} - set(pinned))
    assert not missing, f"requirements/{lock}.txt lacks {missing}: run scripts/lock"


@pytest.mark.parametrize("lock", ["base", "dev", "bench"])
def test_a_package_has_one_version_in_every_lock_file(lock: str) -> None:
    union = pins("bench-dev")
    assert {k: v for k, v in pins(lock).items() if union.get(k) != v} == {}


def test_the_pre_commit_hooks_run_scripts_tests_checks() -> None:
    config = yaml.safe_load((ROOT / ".pre-commit-config.yaml").read_text())
    entries = {hook["entry"].removeprefix(".venv/bin/") for hook in config["repos"][0]["hooks"]}
    script = (ROOT / "scripts" / "test").read_text().splitlines()
    checks = {line for line in script if re.match(r"(ruff|mypy|lint-imports)\b", line)}
    assert entries == checks


def real_sleeps(source: str) -> list[int]:
    """The lines of `asyncio.sleep`/`time.sleep` calls (or a `sleep` imported from either)
    whose delay is not a literal 0: a yield to the event loop is no wait."""
    tree = ast.parse(source)
    imported = {
        alias.asname or alias.name
        for node in ast.walk(tree)
        if isinstance(node, ast.ImportFrom) and node.module in {"asyncio", "time"}
        for alias in node.names
        if alias.name == "sleep"
    }
    lines = []
    for node in ast.walk(tree):
        if not isinstance(node, ast.Call):
            continue
        called = node.func
        if isinstance(called, ast.Attribute):
            is_sleep = (
                called.attr == "sleep"
                and isinstance(called.value, ast.Name)
                and called.value.id in {"asyncio", "time"}
            )
        else:
            is_sleep = isinstance(called, ast.Name) and called.id in imported
        delay = node.args[0] if node.args else None
        if delay is None and node.keywords:
            delay = node.keywords[0].value
        is_zero = isinstance(delay, ast.Constant) and delay.value == 0
        if is_sleep and not is_zero:
            lines.append(node.lineno)
    return sorted(lines)


def test_real_sleeps_are_found_and_a_yield_is_not_one() -> None:
    source = (
        "import asyncio, time\n"
        "from asyncio import sleep as nap\n"
        "async def f(d):\n"
        "    await asyncio.sleep(0)\n"
        "    await asyncio.sleep(0.0)\n"
        "    await asyncio.sleep(0.5)\n"
        "    time.sleep(d)\n"
        "    await nap(delay=1)\n"
        "    await worker.sleep(60)\n"
    )
    assert real_sleeps(source) == [6, 7, 8]


def test_no_unit_test_waits_real_time() -> None:
    """Unit tests let time pass on tests/unit/clocks.py's virtual loop (`advance`) and wait
    for a thread by an event: a real sleep makes the suite slow and its checks a race."""
    found = [
        f"{path.relative_to(ROOT)}:{line}"
        for path in sorted((ROOT / "tests" / "unit").glob("**/*.py"))
        for line in real_sleeps(path.read_text())
    ]
    assert found == []
