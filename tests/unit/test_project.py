"""The habits of the repository: the lock files hold what pyproject.toml asks, at one version
each, with hashes; the pre-commit hooks run the checks scripts/test runs."""

from __future__ import annotations

import re
import tomllib
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]
PROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
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
