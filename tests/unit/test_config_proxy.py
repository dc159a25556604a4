"""`[delivery] proxy` and `no_proxy`: what loads, and every bad key named without the
proxy's credentials."""

from __future__ import annotations

from pathlib import Path

from efd import config
from efd.delivery.proxyrules import Bypass, Egress, Proxy
from tests.unit.test_config import problems_of, write


def test_a_proxy_and_its_bypass_load(tmp_path: Path) -> None:
    text = (
        '[delivery]\nproxy = "http://user:pass@proxy.internal:3128"\n'
        'no_proxy = ["localhost", ".internal.example", "10.0.0.0/8"]\n'
    )
    delivery = config.load(write(tmp_path, text)).delivery
    assert "pass" not in repr(delivery)
    egress = delivery.egress()
    assert isinstance(egress, Egress)
    assert egress.proxy == Proxy("proxy.internal", 3128, "Basic dXNlcjpwYXNz")
    assert egress.bypass.matches("a.internal.example")
    assert egress.bypass.matches("10.1.1.1")
    assert egress.proxy_for("hooks.example.com") == egress.proxy


def test_without_a_proxy_there_is_no_egress(tmp_path: Path) -> None:
    delivery = config.load(write(tmp_path, '[delivery]\nno_proxy = ["localhost"]\n')).delivery
    assert delivery.proxy is None
    assert delivery.egress() is None
    assert config.load(write(tmp_path, "")).delivery.egress() is None
    assert Bypass().matches("localhost") is False


def test_every_bad_proxy_key_is_named_and_no_credential_shown(tmp_path: Path) -> None:
    text = (
        '[delivery]\nproxy = "https://user:secret@proxy.internal:3128"\n'
        'no_proxy = ["ok.example", "host:8080", "*"]\n'
    )
    problems = problems_of(tmp_path, text)
    assert [p.split(": ", 1)[0] for p in problems] == ["delivery.proxy", "delivery.no_proxy"]
    assert "an https:// proxy (TLS to the proxy itself) is not supported" in problems[0]
    assert "'host:8080', '*'" in problems[1]
    assert "secret" not in "\n".join(problems)


def test_a_proxy_without_a_port_is_refused(tmp_path: Path) -> None:
    problems = problems_of(tmp_path, '[delivery]\nproxy = "http://u:secret@proxy"\n')
    assert problems == [
        "delivery.proxy: must name the proxy's port, e.g. http://proxy.internal:3128"
    ]
