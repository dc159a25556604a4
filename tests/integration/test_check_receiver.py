"""`efd check-receiver URL` as an operator runs it, against real receivers on 127.0.0.1:
`efd listen` given the same secrets passes; receivers that accept everything, refuse
everything or answer too late fail, and the table names the cases they got wrong."""

from __future__ import annotations

import asyncio
import base64
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from aiohttp import web

from tests.conftest import ROOT, ReceiverFactory, free_port
from tests.integration.test_mtls import Authority, Presented

NEW = "whsec_" + base64.b64encode(b"the-new-secret-of-32-bytes-here!").decode()
OLD = "whsec_" + base64.b64encode(b"old-secret-of-24-bytes!!").decode()
SECRETS = ["--secret", "s-new", "--secret", "s-old"]
ALL_SECRETS = [*SECRETS, "--standard-webhooks-secret", NEW, "--standard-webhooks-secret", OLD]
SHOULD_REFUSE = [
    "wrong X-Signature",
    "wrong webhook-signature",
    "stale webhook-timestamp",
    "future webhook-timestamp",
    "no signature",
]
SHOULD_ACCEPT = [
    "valid X-Signature",
    "rotated X-Signature secret",
    "valid Standard Webhooks",
    "rotated Standard Webhooks secret",
    "the same webhook-id twice",
]


async def check_receiver(url: str, *args: str) -> tuple[int, str, str]:
    proc = await asyncio.create_subprocess_exec(
        *(sys.executable, "-m", "efd", "check-receiver", url, *args),
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
        cwd=ROOT,
    )
    out, err = await asyncio.wait_for(proc.communicate(), 60)
    assert proc.returncode is not None
    return proc.returncode, out.decode(), err.decode()


def verdicts(table: str) -> dict[str, str]:
    """case -> its verdict, from the printed table."""
    found = {}
    for line in table.splitlines():
        for case in [*SHOULD_REFUSE, *SHOULD_ACCEPT, "answer time"]:
            if line.startswith(case + "  "):
                found[case] = line.split()[-1]
    return found


@pytest.fixture
def listen(tmp_path: Path) -> Iterator[tuple[str, Path]]:
    """`efd listen` holding every secret, in its own process: (url, its output)."""
    port = free_port()
    log = tmp_path / "listen.out"
    with log.open("w") as out:
        proc = subprocess.Popen(
            [sys.executable, "-m", "efd", "listen", "--port", str(port), *ALL_SECRETS],
            stdout=out,
            stderr=subprocess.STDOUT,
            cwd=ROOT,
        )
    try:
        deadline = time.monotonic() + 20
        while True:
            try:
                with socket.create_connection(("127.0.0.1", port), timeout=0.2):
                    break
            except OSError:
                assert proc.poll() is None, log.read_text()
                assert time.monotonic() < deadline, "efd listen did not start"
                time.sleep(0.05)
        yield f"http://127.0.0.1:{port}/webhook", log
    finally:
        proc.terminate()
        proc.wait(10)


async def test_efd_listen_with_the_same_secrets_passes(listen: tuple[str, Path]) -> None:
    url, log = listen
    code, out, err = await check_receiver(url, *ALL_SECRETS)
    assert (code, err) == (0, ""), out
    assert verdicts(out) == dict.fromkeys([*SHOULD_REFUSE, *SHOULD_ACCEPT, "answer time"], "ok")
    assert "the receiver answers as docs/delivery.md#receivers asks" in out
    printed = log.read_text()
    assert printed.count("refused (401)") == len(SHOULD_REFUSE)
    assert printed.count("not processed again") == 1


async def test_efd_listen_holding_other_secrets_fails_the_valid_cases(
    listen: tuple[str, Path],
) -> None:
    url, _ = listen
    code, out, _ = await check_receiver(url, "--secret", "not-what-it-holds")
    assert code == 1, out
    assert verdicts(out) == {
        "valid X-Signature": "FAIL",
        "wrong X-Signature": "ok",
        "rotated X-Signature secret": "skipped",
        "no signature": "ok",
        "the same webhook-id twice": "FAIL",
        "answer time": "ok",
    }
    assert "does it hold them?" in out


async def test_a_receiver_that_accepts_everything_fails(receiver_factory: ReceiverFactory) -> None:
    receiver = await receiver_factory()  # 200 to every request
    code, out, _ = await check_receiver(receiver.url, *ALL_SECRETS)
    assert code == 1, out
    found = verdicts(out)
    assert {case: found[case] for case in SHOULD_REFUSE} == dict.fromkeys(SHOULD_REFUSE, "FAIL")
    assert {case: found[case] for case in SHOULD_ACCEPT} == dict.fromkeys(SHOULD_ACCEPT, "ok")
    for case in SHOULD_REFUSE:
        assert f"{case}: " in out  # each failure explained below the table
    assert "it accepted a request it should refuse" in out
    assert "does NOT answer as docs/delivery.md#receivers asks" in out
    assert len(receiver.received) == len(SHOULD_REFUSE) + len(SHOULD_ACCEPT) + 1


async def test_a_receiver_that_refuses_valid_signatures_fails(
    receiver_factory: ReceiverFactory,
) -> None:
    async def refuse(_request: web.Request, _n: int) -> web.StreamResponse:
        return web.json_response({"error": "bad signature"}, status=401)

    receiver = await receiver_factory(refuse)
    code, out, _ = await check_receiver(receiver.url, *ALL_SECRETS)
    assert code == 1, out
    found = verdicts(out)
    assert {case: found[case] for case in SHOULD_ACCEPT} == dict.fromkeys(SHOULD_ACCEPT, "FAIL")
    assert {case: found[case] for case in SHOULD_REFUSE} == dict.fromkeys(SHOULD_REFUSE, "ok")


async def test_a_receiver_that_refuses_with_a_5xx_fails(receiver_factory: ReceiverFactory) -> None:
    async def verify_then_500(request: web.Request, _n: int) -> web.StreamResponse:
        return web.Response(status=500 if "X-Signature" not in request.headers else 200)

    receiver = await receiver_factory(verify_then_500)
    code, out, _ = await check_receiver(receiver.url, "--secret", "s")
    assert code == 1, out
    assert verdicts(out)["no signature"] == "FAIL"
    assert "efd would retry it until the retry window closes" in out


async def test_an_answer_later_than_the_timeout_fails(receiver_factory: ReceiverFactory) -> None:
    async def late_once(_request: web.Request, n: int) -> web.StreamResponse:
        if n == 1:
            await asyncio.sleep(3)  # past the 1 s the check is given
        return web.json_response({"ok": True})

    receiver = await receiver_factory(late_once)
    code, out, _ = await check_receiver(receiver.url, "--secret", "s", "--timeout", "1")
    assert code == 1, out
    found = verdicts(out)
    assert found["valid X-Signature"] == "FAIL"
    assert found["answer time"] == "FAIL"
    [row] = [line.split() for line in out.splitlines() if line.startswith("valid X-Signature ")]
    assert row[-2:] == ["timeout", "FAIL"]
    assert "1 timed out" in out


async def test_a_receiver_requiring_a_client_certificate(
    receiver_factory: ReceiverFactory, tmp_path: Path
) -> None:
    authority = Authority(tmp_path)
    presented = Presented()
    receiver = await receiver_factory(presented, ssl_context=authority.server_context())
    files = authority.client_files("checker.example")
    trust = ["--ca-file", str(authority.ca_file)]
    code, out, _ = await check_receiver(receiver.url, "--secret", "s", *trust)
    assert code == 1
    assert verdicts(out)["valid X-Signature"] == "FAIL"
    assert "no answer (connect" in out or "no answer (reset" in out, out
    assert presented.names == []

    client = ["--client-cert", files["client_cert"], "--client-key", files["client_key"]]
    code, out, _ = await check_receiver(receiver.url, "--secret", "s", *trust, *client)
    assert verdicts(out)["valid X-Signature"] == "ok"  # it accepts everything: code 1
    assert set(presented.names) == {"checker.example"}


@pytest.mark.parametrize(
    ("args", "words"),
    [
        (["http://127.0.0.1:9/hook"], "give the receiver's secrets"),
        (["ftp://127.0.0.1/hook", "--secret", "s"], "full http:// or https:// URL"),
        (["http://127.0.0.1:9/", "--standard-webhooks-secret", "nope"], "must start with whsec_"),
        (["http://127.0.0.1:9/", "--secret", "s", "--timeout", "0"], "--timeout"),
        (["http://127.0.0.1:9/", "--secret", "s", "--client-key", "k.pem"], "needs --client-cert"),
        (["https://127.0.0.1:9/", "--secret", "s", "--client-cert", "/none"], "cannot read /none"),
    ],
)
async def test_bad_arguments_exit_2_saying_why(args: list[str], words: str) -> None:
    code, out, err = await check_receiver(*args)
    assert (code, out) == (2, "")
    assert err.startswith("efd check-receiver: ")
    assert words in err
