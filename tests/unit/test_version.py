"""One version, pyproject.toml's as installed: `efd --version`, the Server header and the
OpenAPI document say it; the webhook User-Agent's product token carries the wire format's
version, which the spec fixes at 1.0 (docs/decisions.md)."""

from __future__ import annotations

import tomllib
from importlib import metadata
from pathlib import Path

import pytest

import efd
from efd import cli, config
from efd.http import server
from efd.http.openapi import document
from efd.segment import webhooks

ROOT = Path(__file__).resolve().parents[2]


def installed() -> str:
    return metadata.version("efd")


def test_the_installed_version_is_pyprojects() -> None:
    # A stale install (pyproject.toml bumped, scripts/setup not rerun) fails here.
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    assert installed() == project["version"]
    assert efd.__version__ == installed()


def test_efd_version_prints_it(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as done:
        cli.main(["--version"])
    assert done.value.code == 0
    assert capsys.readouterr().out == f"efd {installed()}\n"


def test_the_server_header_names_it() -> None:
    assert f"efd/{installed()}" == server.SERVER
    assert document(efd.__version__)["info"]["version"] == installed()


def test_the_user_agent_is_efds_product_at_the_wire_formats_version() -> None:
    agent = config.DeliveryConfig().user_agent
    assert agent == "efd/1.0"
    assert agent == f"{server.SERVER.split('/')[0]}/{webhooks.FORMAT_VERSION}"
