"""`[telemetry]`: off by default, what loads, and every bad key named."""

from __future__ import annotations

from pathlib import Path

from efd import config
from efd.daemon import restart_needed
from tests.unit.test_config import problems_of, write


def test_telemetry_is_off_by_default(tmp_path: Path) -> None:
    telemetry = config.load(write(tmp_path, "")).telemetry
    assert telemetry.otlp_endpoint is None
    assert not telemetry.enabled
    assert (telemetry.service_name, telemetry.sampling_ratio) == ("efd", 1.0)


def test_an_endpoint_turns_it_on(tmp_path: Path) -> None:
    text = (
        '[telemetry]\notlp_endpoint = "http://127.0.0.1:4318/v1/traces"\n'
        'service_name = "efd-eu"\nsampling_ratio = 0.25\n'
    )
    telemetry = config.load(write(tmp_path, text)).telemetry
    assert telemetry.enabled
    assert telemetry.otlp_endpoint == "http://127.0.0.1:4318/v1/traces"
    assert (telemetry.service_name, telemetry.sampling_ratio) == ("efd-eu", 0.25)


def test_every_bad_telemetry_key_is_named(tmp_path: Path) -> None:
    text = (
        '[telemetry]\notlp_endpoint = "grpc://collector:4317"\n'
        'service_name = ""\nsampling_ratio = 1.5\nheaders = {}\n'
    )
    problems = problems_of(tmp_path, text)
    assert sorted(p.split(": ", 1)[0] for p in problems) == [
        "telemetry.headers",
        "telemetry.otlp_endpoint",
        "telemetry.sampling_ratio",
        "telemetry.service_name",
    ]
    assert any("must be an http:// or https:// URL with a host" in p for p in problems)


def test_an_endpoint_with_credentials_or_a_bad_port_is_refused(tmp_path: Path) -> None:
    for url, reason in [
        ("http://user:secret@collector:4318/v1/traces", "may not hold credentials"),
        ("http://collector:port/v1/traces", "not a URL"),
        ("http:///v1/traces", "with a host"),
        ("-1", "with a host"),
    ]:
        problems = problems_of(tmp_path, f'[telemetry]\notlp_endpoint = "{url}"\n')
        assert len(problems) == 1, problems
        assert problems[0].startswith("telemetry.otlp_endpoint: ")
        assert reason in problems[0]
        assert "secret" not in problems[0]


def test_a_telemetry_change_needs_a_restart(tmp_path: Path) -> None:
    before = config.load(write(tmp_path, ""))
    after = config.load(
        write(tmp_path, '[telemetry]\notlp_endpoint = "http://127.0.0.1:4318/v1/traces"\n')
    )
    assert restart_needed(before, after) == ["telemetry.otlp_endpoint"]
