"""GET /openapi.json describes the running daemon: schemathesis sends requests generated from
it to every operation of a real daemon process (on SQLite; the storage paths are tested on
both backends elsewhere) with every check on: no 5xx, every response conforms, every request
valid by the schema is accepted and every invalid one refused. redocly's recommended rules
find nothing in it, and the answers schemathesis cannot provoke are checked too."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import requests
import schemathesis
from aiohttp import web
from hypothesis import HealthCheck, settings

from efd import __version__
from efd.http import openapi
from tests.conftest import (
    DaemonFactory,
    DaemonProcess,
    ReceiverFactory,
    basic,
    free_port,
    post,
    settings_dict,
    write_toml,
)
from tests.jsclients import JS, NODE_MODULES, need, node
from tests.unit.test_openapi import ALIASES

TOKEN = "adm-openapi-0123456789"

# The stream never ends by itself; tests/integration/test_live.py covers it. An alias is served
# and described as its path is (tests/unit/test_openapi.py): its path is fuzzed for both.
schema = (
    schemathesis.openapi.from_dict(openapi.document(__version__))
    .exclude(path="/admin/stream")
    .exclude(path=list(ALIASES))
)


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    directory: Path = tmp_path_factory.mktemp("openapi")
    port = free_port()
    config = settings_dict(f"sqlite:///{directory / 'efd.db'}", ["http://127.0.0.1:9/unused"])
    config["server"].update(port=port, admin_token=TOKEN)
    config["logging"] = {"level": "WARNING"}
    daemon = DaemonProcess(
        write_toml(directory / "efd.toml", config), port, directory / "efd.log"
    ).start()
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        daemon.terminate()


def test_the_daemon_serves_the_description_without_a_token(served: str) -> None:
    with urllib.request.urlopen(f"{served}/openapi.json", timeout=10) as response:
        assert response.status == 200
        assert response.headers["Content-Type"].startswith("application/json")
        served_document = json.load(response)
    assert served_document == openapi.document(__version__)
    assert served_document["openapi"].startswith("3.1")
    assert {
        "/v1/batch",
        "/admin/deliveries",
        "/admin/redrive",
        "/regulations",
        "/admin/destinations",
        "/admin/stream",
    } <= set(served_document["paths"])


@pytest.fixture(scope="module")
def session() -> Iterator[requests.Session]:
    """One client for every case: connections are reused, not opened by the thousand."""
    with requests.Session() as client:
        yield client


@schema.parametrize()
# Derandomized: the same examples on every run, so a pass here is a pass in CI; the ingestion
# routes get random inputs in tests/integration/test_fuzz.py.
@settings(max_examples=20, deadline=None, derandomize=True, suppress_health_check=list(HealthCheck))
def test_every_operation_answers_as_described(
    case: schemathesis.Case[Any], served: str, session: requests.Session
) -> None:
    credentials = basic() if case.path.startswith("/v1/") else {"Authorization": f"Bearer {TOKEN}"}
    case.call_and_validate(base_url=served, session=session, headers=credentials, timeout=10)


def test_redocly_recommended_rules_find_nothing_in_the_served_description(
    served: str, tmp_path: Path
) -> None:
    """redocly's own linter (npm @redocly/cli, pinned in tests/js) with its recommended
    rules: no error, and no warning either."""
    node()
    redocly = NODE_MODULES / ".bin" / "redocly"
    need(redocly.exists(), "@redocly/cli is not installed", "EFD_REQUIRE_NODE")
    with urllib.request.urlopen(f"{served}/openapi.json", timeout=10) as response:
        path = tmp_path / "openapi.json"
        path.write_bytes(response.read())
    done = subprocess.run(
        [str(redocly), "lint", "--extends=recommended", "--format=json", str(path)],
        cwd=JS,
        capture_output=True,
        text=True,
        timeout=120,
        # No usage report sent home, no update check: the test reads only the document.
        env={**os.environ, "REDOCLY_TELEMETRY": "off", "REDOCLY_SUPPRESS_UPDATE_NOTICE": "true"},
        check=False,
    )
    report = json.loads(done.stdout)
    problems = [f"{p['severity']} {p['ruleId']}: {p['message']}" for p in report["problems"]]
    assert problems == [], problems
    assert report["totals"] == {"errors": 0, "warnings": 0, "ignored": 0}
    assert done.returncode == 0, done.stderr


async def unavailable(_request: web.Request, _n: int) -> web.StreamResponse:
    return web.json_response({"down": True}, status=503)


async def test_answers_in_states_schemathesis_does_not_reach_conform(
    tmp_path: Path, receiver_factory: ReceiverFactory, daemon_factory: DaemonFactory
) -> None:
    """A finished regulation, a destination no longer configured, a discarded delivery, the
    404 and 409 of the admin API: each answer is checked against the served description."""
    hooks, old = await receiver_factory(), await receiver_factory(unavailable)
    settings = settings_dict(f"sqlite:///{tmp_path / 'efd.db'}", [hooks.url])
    settings["server"]["admin_token"] = TOKEN
    settings["destinations"].append({"name": "old", "hooks": [{"url": old.url}]})
    settings["sources"][0]["destinations"] = ["hooks", "old"]
    settings["sources"].append({"name": "quiet", "write_key": "wk_quiet"})
    first = await daemon_factory(settings)
    for message_id in ("m-1", "m-2"):
        status, _ = await post(
            first.port, "/v1/track", {"userId": "u-1", "event": "E", "messageId": message_id}
        )
        assert status == 200
    await old.wait_for(2)
    await first.stop()
    settings["destinations"] = settings["destinations"][:1]
    settings["sources"][0]["destinations"] = ["hooks"]
    daemon = await daemon_factory(settings)
    base = f"http://127.0.0.1:{daemon.port}"
    admin = {"Authorization": f"Bearer {TOKEN}"}

    def call(method: str, path: str, body: Any = None) -> requests.Response:
        return requests.request(method, f"{base}{path}", json=body, headers=admin, timeout=10)

    async def checked(method: str, template: str, path: str, body: Any = None) -> Any:
        response = await asyncio.to_thread(call, method, path, body)
        schema[template][method].validate_response(response)
        return response.json()

    created = await checked(
        "POST",
        "/regulations",
        "/regulations",
        {"regulationType": "DELETE_ONLY", "subjectType": "USER_ID", "subjectIds": ["u-2"]},
    )
    reg_id = created["data"]["regulateId"]

    async def finished() -> Any:
        while True:
            answer = await checked("GET", "/regulations/{id}", f"/regulations/{reg_id}")
            if answer["data"]["regulation"]["overallStatus"] == "FINISHED":
                return answer["data"]["regulation"]
            await asyncio.sleep(0.05)

    regulation = await asyncio.wait_for(finished(), 30)
    assert {s["status"] for s in regulation["streamStatus"]} == {"FINISHED", "SKIPPED"}
    answer = await checked("GET", "/admin/destinations", "/admin/destinations")
    assert [d["configured"] for d in answer["destinations"]] == [True, False]
    assert (await checked("POST", "/admin/discard", "/admin/discard", {"destination": "hooks"}))[
        "code"
    ] == "destination_configured"
    assert await checked("POST", "/admin/discard", "/admin/discard", {"destination": "old"}) == {
        "count": 2
    }
    found = await checked("GET", "/admin/messages/{source}/{messageId}", "/admin/messages/web/m-1")
    assert "discarded" in {d["status"] for d in found["deliveries"]}
    page = await checked("GET", "/admin/deliveries", "/admin/deliveries?status=discarded")
    assert len(page["deliveries"]) == 2
    for body, code in (
        ({"source": "web", "messageId": "m-1", "destination": "gone"}, "unknown_destination"),
        ({"source": "web", "messageId": "nope"}, "not_found"),
    ):
        assert (await checked("POST", "/admin/replay", "/admin/replay", body))["code"] == code
