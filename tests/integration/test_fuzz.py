"""Generated requests against a real daemon process: mutated messages, random bytes, random
JSON of deep and wide shapes, odd encodings and credentials, on every ingestion route and
/regulations. Every answer must be 2xx or 4xx, every 4xx a JSON error, and the daemon must
stay healthy with nothing logged as an error.

Bounded for the suite (EFD_FUZZ_EXAMPLES, default 250); set it higher to fuzz longer.
"""

from __future__ import annotations

import base64
import contextlib
import gzip
import http.client
import json
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.conftest import WRITE_KEY, DaemonProcess, free_port, settings_dict, write_toml

EXAMPLES = int(os.environ.get("EFD_FUZZ_EXAMPLES", "250"))
ADMIN_TOKEN = "fuzz-admin-token-0123456789"
ROUTES = [
    "/v1/batch",
    "/v1/import",
    *(f"/v1/{name}" for name in ("identify", "track", "page", "screen", "group", "alias")),
    *(f"/v1/{letter}" for letter in "itpsga"),
    "/regulations",
    "/regulations/sources/web",
]


@pytest.fixture(scope="module")
def fuzzed(tmp_path_factory: pytest.TempPathFactory) -> Iterator[DaemonProcess]:
    tmp: Path = tmp_path_factory.mktemp("fuzz")
    config = settings_dict(f"sqlite:///{tmp / 'efd.db'}")
    config["sources"][0]["destinations"] = []  # storage only: nothing to deliver
    port = free_port()
    config["server"] = {
        "host": "127.0.0.1",
        "port": port,
        "parse_processes": 1,  # bodies over 8 KiB take the parser process's path
        "admin_token": ADMIN_TOKEN,
    }
    config["logging"] = {"level": "INFO"}
    daemon = DaemonProcess(write_toml(tmp / "efd.toml", config), port, tmp / "efd.log")
    daemon.start()
    try:
        yield daemon
    finally:
        daemon.ensure_stopped()


# -- what is sent ---------------------------------------------------------------------------

scalars = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(min_value=-(2**70), max_value=2**70),
    st.floats(allow_nan=False, allow_infinity=False),
    st.text(max_size=20),
    st.sampled_from(["\ud800", "a\udfff", "2026-11-24T10:00:00Z", "", "track", "All"]),
)
json_values = st.recursive(
    scalars,
    lambda inner: st.one_of(
        st.lists(inner, max_size=6), st.dictionaries(st.text(max_size=8), inner, max_size=6)
    ),
    max_leaves=60,
)
valid_messages = st.fixed_dictionaries(
    {
        "type": st.sampled_from(["identify", "track", "page", "screen", "group", "alias"]),
        "userId": st.one_of(st.text(min_size=1, max_size=12), st.integers()),
        "event": st.text(max_size=12),
        "groupId": st.text(max_size=8),
        "previousId": st.text(max_size=8),
        "properties": st.dictionaries(st.text(max_size=6), scalars, max_size=4),
        "timestamp": st.sampled_from(
            ["2026-11-24T10:00:00.000Z", "2026-11-24T10:00:00+0100", "nope", "2026-02-30T00:00:00"]
        ),
    }
)


@st.composite
def messages(draw: st.DrawFn) -> Any:
    message: dict[str, Any] = dict(draw(valid_messages))
    for key in draw(st.lists(st.sampled_from(sorted(message)), max_size=3)):
        message.pop(key, None)  # a required field missing, sometimes
    for key in draw(st.lists(st.text(max_size=10), max_size=2)):
        message[key] = draw(json_values)  # a field of any shape
    if draw(st.booleans()):
        depth = draw(st.integers(min_value=1, max_value=200))
        message["properties"] = json.loads("[" * depth + "]" * depth)
    return message


@st.composite
def documents(draw: st.DrawFn) -> bytes:
    kind = draw(st.sampled_from(["message", "batch", "json", "bytes", "deep", "regulation"]))
    if kind == "bytes":
        return draw(st.binary(max_size=300))
    if kind == "deep":
        depth = draw(st.integers(min_value=60, max_value=20_000))
        opener, closer = draw(st.sampled_from([("[", "]"), ('{"a":', "}"), ("[", "")]))
        return (opener * depth + "1" + closer * depth).encode()
    if kind == "json":
        value: Any = draw(json_values)
    elif kind == "message":
        value = draw(messages())
    elif kind == "regulation":
        value = {
            "regulationType": draw(st.sampled_from(["DELETE_ONLY", "SUPPRESS_ONLY", "x"])),
            "subjectType": "USER_ID",
            "subjectIds": draw(st.lists(st.one_of(st.text(max_size=10), json_values), max_size=4)),
        }
    else:
        value = {"batch": draw(st.lists(messages(), max_size=4))}
        if draw(st.booleans()):
            value["context"] = draw(json_values)
        if draw(st.booleans()):
            value["sentAt"] = draw(st.sampled_from(["2026-11-24T10:00:00Z", "later", 3]))
        if draw(st.booleans()):
            # Large enough to go to the parser process.
            value["batch"].append({"type": "track", "userId": "u", "event": "x" * 9000})
    if draw(st.booleans()):
        value = {"writeKey": draw(st.sampled_from([WRITE_KEY, "wrong", ""])), "v": value} | (
            value if isinstance(value, dict) else {}
        )
    return json.dumps(value, ensure_ascii=draw(st.booleans())).encode("utf-8", "surrogatepass")


@st.composite
def requests(draw: st.DrawFn) -> tuple[str, bytes, dict[str, str]]:
    path = draw(st.sampled_from(ROUTES))
    body = draw(documents())
    headers = {"Content-Type": draw(st.sampled_from(["application/json", "text/plain"]))}
    encoding = draw(st.sampled_from(["identity", "gzip", "gzip-broken", "utf-16", "br"]))
    if encoding == "gzip":
        body, headers["Content-Encoding"] = gzip.compress(body), "gzip"
    elif encoding == "gzip-broken":
        body, headers["Content-Encoding"] = gzip.compress(body)[:-4] + b"xx", "gzip"
    elif encoding == "utf-16":
        with contextlib.suppress(UnicodeDecodeError):  # random bytes stay as they are
            body = body.decode("utf-8", "surrogatepass").encode("utf-16", "surrogatepass")
    elif encoding == "br":
        headers["Content-Encoding"] = "br"
    auth = draw(st.sampled_from(["basic", "none", "wrong", "garbage", "bearer"]))
    if auth == "basic":
        headers["Authorization"] = "Basic " + base64.b64encode(f"{WRITE_KEY}:".encode()).decode()
    elif auth == "wrong":
        headers["Authorization"] = "Basic " + base64.b64encode(b"nope:").decode()
    elif auth == "garbage":
        # Any header text (control characters are refused by the HTTP parser itself).
        text = draw(st.text(st.characters(min_codepoint=0x20, max_codepoint=0xFF), max_size=30))
        headers["Authorization"] = "Basic " + text.replace("\x7f", "")
    elif auth == "bearer":
        headers["Authorization"] = f"Bearer {ADMIN_TOKEN}"
    return path, body, headers


# -- the test ------------------------------------------------------------------------------


def _send(port: int, path: str, body: bytes, headers: dict[str, str]) -> tuple[int, bytes]:
    connection = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
    try:
        connection.request("POST", path, body=body, headers=headers)
        response = connection.getresponse()
        return response.status, response.read()
    finally:
        connection.close()


def test_no_input_gets_a_500_or_hurts_the_daemon(fuzzed: DaemonProcess) -> None:
    @settings(
        max_examples=EXAMPLES,
        deadline=None,
        database=None,
        suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
    )
    @given(requests())
    def one(request: tuple[str, bytes, dict[str, str]]) -> None:
        path, body, headers = request
        status, answer = _send(fuzzed.port, path, body, headers)
        assert 200 <= status < 500, (status, answer[:300])
        if status >= 400:
            error = json.loads(answer)
            assert error["success"] is False
            assert isinstance(error["code"], str)
            assert isinstance(error["message"], str)

    one()
    connection = http.client.HTTPConnection("127.0.0.1", fuzzed.port, timeout=10)
    try:
        connection.request("GET", "/healthz")
        assert connection.getresponse().status == 200
    finally:
        connection.close()
    log = fuzzed.log()
    assert "Traceback" not in log
    assert " ERROR " not in log
