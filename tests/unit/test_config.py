"""efd.config: the TOML file, EFD_ environment overrides and every validation rule."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import pytest

from efd import config
from efd.languages.filters import Filtered
from tests.conftest import settings_dict

ROOT = Path(__file__).resolve().parents[2]

HOOK = '[[destinations.hooks]]\nurl = "https://hooks.example.com/segment"\n'
GOOD = textwrap.dedent(
    """\
    [server]
    host = "127.0.0.1"
    port = 8088

    [storage]
    url = "sqlite:///var/lib/efd/efd.db"

    [delivery]
    timeout_seconds = 5
    retry_initial_seconds = 5
    retry_max_seconds = 1800
    retry_window_seconds = 14400
    user_agent = "efd/1.0"
    allowed_networks = []

    [[sources]]
    name = "website"
    write_key = "wk_live_123"
    destinations = ["crm"]

    [[destinations]]
    name = "crm"
    type = "webhooks"
    shared_secret = "optional"
    [[destinations.hooks]]
    url = "https://hooks.example.com/segment"
    headers = { "X-Env" = "prod" }
    """
)


@pytest.fixture(autouse=True)
def _no_efd_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    for key in list(os.environ):
        if key.startswith("EFD_"):
            monkeypatch.delenv(key)


def write(tmp_path: Path, text: str, name: str = "efd.toml") -> Path:
    path = tmp_path / name
    path.write_text(textwrap.dedent(text))
    return path


def problems_of(tmp_path: Path, text: str) -> list[str]:
    with pytest.raises(config.ConfigError) as caught:
        config.load(write(tmp_path, text))
    assert str(caught.value) == "\n".join(caught.value.problems)
    return caught.value.problems


def keys_of(problems: list[str]) -> set[str]:
    return {problem.split(": ", 1)[0] for problem in problems}


def destination(hooks: str, extra: str = "") -> str:
    return f'[[destinations]]\nname = "crm"\n{extra}\n{hooks}'


# -- files that load -------------------------------------------------------------------------


def test_example_config_loads() -> None:
    settings = config.load(ROOT / "config.example.toml")
    assert [s.name for s in settings.sources] == ["website"]
    assert settings.sources[0].destinations == ["example-webhooks"]
    hooks = settings.destination("example-webhooks").hooks
    assert [h.url for h in hooks] == ["http://127.0.0.1:9000/webhook"]
    assert settings.delivery.user_agent == "efd/1.0"
    assert settings.delivery.allowed_networks == ["127.0.0.0/8"]  # the loopback receiver


def test_every_commented_key_of_the_example_is_valid_when_uncommented(tmp_path: Path) -> None:
    # A commented key is an invitation to uncomment it: it must load as it stands.
    commented = re.compile(r"#\s*([A-Za-z_][A-Za-z0-9_]*\s*=.*)")
    text = (ROOT / "config.example.toml").read_text()
    # The commented broker and actions destinations are blocks of tables, loaded whole by
    # tests/unit/test_config_brokers.py and tests/unit/test_config_actions.py.
    text = text[: text.index("# A message-broker destination")]
    uncommented: list[str] = []
    lines = []
    for line in text.splitlines():
        found = commented.fullmatch(line)
        if found is not None:
            uncommented.append(found.group(1).split("=", 1)[0].strip())
            line = found.group(1)
        lines.append(line)
    assert uncommented, "the example has no commented key left: drop this test or add one"
    path = tmp_path / "efd.toml"
    path.write_text("\n".join(lines) + "\n")
    settings = config.load(path)
    for key in uncommented:
        assert any(
            key in type(getattr(settings, section)).model_fields
            for section in ("server", "storage", "delivery", "logging", "telemetry")
        ), key
    assert settings.server.admin_token is not None


def test_the_issue_config_loads(tmp_path: Path) -> None:
    settings = config.load(write(tmp_path, GOOD))
    assert settings.server.host == "127.0.0.1"
    assert settings.server.port == 8088
    assert settings.storage.url == "sqlite:///var/lib/efd/efd.db"
    delivery = settings.delivery
    assert (delivery.timeout_seconds, delivery.retry_initial_seconds) == (5, 5)
    assert (delivery.retry_max_seconds, delivery.retry_window_seconds) == (1800, 14400)
    assert delivery.allowed_networks == []
    source = settings.sources[0]
    assert (source.name, source.write_key.get_secret_value()) == ("website", "wk_live_123")
    crm = settings.destination("crm")
    assert crm.type == "webhooks"
    assert crm.shared_secret is not None
    assert crm.shared_secret.get_secret_value() == "optional"
    assert crm.hooks[0].url == "https://hooks.example.com/segment"
    assert crm.hooks[0].headers == {"X-Env": "prod"}


def test_secrets_are_not_shown_in_repr(tmp_path: Path) -> None:
    settings = config.load(write(tmp_path, GOOD))
    assert "wk_live_123" not in repr(settings)
    assert "optional" not in repr(settings.destination("crm"))


def test_an_empty_file_gives_the_defaults(tmp_path: Path) -> None:
    settings = config.load(write(tmp_path, ""))
    assert (settings.server.host, settings.server.port) == ("127.0.0.1", 8088)
    assert settings.delivery.timeout_seconds == 5
    assert settings.delivery.retry_initial_seconds == 5
    assert settings.delivery.retry_max_seconds == 1800
    assert settings.delivery.retry_window_seconds == 14400  # the spec's 4 hours
    assert settings.delivery.user_agent.endswith("/1.0")
    assert settings.delivery.allowed_networks == []
    assert settings.delivery.circuit_failures == 10
    assert settings.delivery.circuit_probe_seconds == 30
    assert settings.sources == []
    assert settings.destinations == []


@pytest.mark.parametrize(
    ("section", "cpus", "expected"),
    [
        ({}, 1, (0, 0)),  # unset on one CPU: none, the daemon parses and sends itself
        ({}, 2, (1, 1)),  # unset on more: one of each
        ({}, 64, (1, 1)),
        ({"delivery": {"sender_processes": 2}}, 1, (0, 2)),  # what is set is kept
        ({"server": {"parse_processes": 0}}, 8, (0, 1)),
        ({"server": {"parse_processes": 3}, "delivery": {"sender_processes": 0}}, 1, (3, 0)),
    ],
)
def test_helper_processes_follow_the_cpus_unless_set(
    section: dict[str, Any], cpus: int, expected: tuple[int, int]
) -> None:
    settings = config.Settings(**section)
    assert settings.helpers(cpus) == expected


def test_destination_lookup(tmp_path: Path) -> None:
    settings = config.load(write(tmp_path, GOOD))
    assert settings.destination("crm").name == "crm"
    with pytest.raises(KeyError):
        settings.destination("CRM")


def test_source_without_destinations_and_unconnected_destination(tmp_path: Path) -> None:
    text = '[[sources]]\nname = "s"\nwrite_key = "k"\n\n' + destination(HOOK)
    settings = config.load(write(tmp_path, text))
    assert settings.sources[0].destinations == []
    assert settings.destination("crm").hooks[0].headers == {}
    assert settings.destination("crm").shared_secret is None
    assert settings.destination("crm").type == "webhooks"  # the default type


@pytest.mark.parametrize(
    ("key", "value"),
    [
        ("timeout_seconds", 0.5),
        ("retry_initial_seconds", 0.25),
        ("retry_max_seconds", 1.5),
        ("retry_window_seconds", 2.5),
        ("lease_seconds", 30.5),
        ("circuit_probe_seconds", 0.2),
    ],
)
def test_fractional_durations(tmp_path: Path, key: str, value: float) -> None:
    text = f"[delivery]\nretry_initial_seconds = 0.1\n{key} = {value}\n"
    if key == "retry_initial_seconds":
        text = f"[delivery]\n{key} = {value}\n"
    settings = config.load(write(tmp_path, text))
    assert getattr(settings.delivery, key) == value


@pytest.mark.parametrize(
    "key",
    ["timeout_seconds", "retry_window_seconds", "retry_max_seconds", "circuit_probe_seconds"],
)
@pytest.mark.parametrize("value", ["0", "-1", "-0.5", '"soon"'])
def test_durations_must_be_positive_numbers(tmp_path: Path, key: str, value: str) -> None:
    assert f"delivery.{key}" in keys_of(problems_of(tmp_path, f"[delivery]\n{key} = {value}\n"))


@pytest.mark.parametrize("value", ["0", "-3", "2.5", '"ten"'])
def test_circuit_failures_must_be_a_positive_whole_number(tmp_path: Path, value: str) -> None:
    problems = problems_of(tmp_path, f"[delivery]\ncircuit_failures = {value}\n")
    assert keys_of(problems) == {"delivery.circuit_failures"}


# -- hooks ---------------------------------------------------------------------------------


@pytest.mark.parametrize("count", [1, 2, 5])
def test_one_to_five_hooks(tmp_path: Path, count: int) -> None:
    hooks = "".join(
        f'[[destinations.hooks]]\nurl = "https://h{i}.example.com/x"\n' for i in range(count)
    )
    settings = config.load(write(tmp_path, destination(hooks)))
    assert len(settings.destination("crm").hooks) == count


@pytest.mark.parametrize(("count", "words"), [(0, "at least 1"), (6, "at most 5")])
def test_hook_count_out_of_range(tmp_path: Path, count: int, words: str) -> None:
    hooks = "".join(
        f'[[destinations.hooks]]\nurl = "https://h{i}.example.com/x"\n' for i in range(count)
    )
    text = destination(hooks) + ("hooks = []\n" if count == 0 else "")
    problems = problems_of(tmp_path, text)
    assert keys_of(problems) == {"destinations[0].hooks"}
    assert words in problems[0]


def test_hooks_are_required(tmp_path: Path) -> None:
    problems = problems_of(tmp_path, '[[destinations]]\nname = "crm"\n')
    assert keys_of(problems) == {"destinations[0].hooks"}


@pytest.mark.parametrize(
    "url",
    [
        "https://hooks.example.com/segment",
        "http://127.0.0.1:9000/webhook",
        "https://hooks.example.com",
        "https://hooks.example.com:8443/a/b?x=1",
        "http://[::1]:8080/h",
        "https://user:pass@hooks.example.com/h",
        "HTTPS://HOOKS.EXAMPLE.COM/",
    ],
)
def test_full_http_urls_accepted(tmp_path: Path, url: str) -> None:
    settings = config.load(write(tmp_path, destination(f'[[destinations.hooks]]\nurl = "{url}"\n')))
    assert settings.destination("crm").hooks[0].url == url


@pytest.mark.parametrize(
    "url",
    [
        "hooks.example.com/segment",
        "//hooks.example.com/segment",
        "ftp://hooks.example.com/",
        "ws://hooks.example.com/",
        "file:///etc/passwd",
        "http://",
        "https:///path",
        "https://:8080/x",
        "https://hooks.example.com:99999/",
        "https://hooks.example.com:port/",
        "",
        "/relative",
        pytest.param(
            "https://hooks exa mple.com/",
        ),
    ],
)
def test_bad_urls_rejected(tmp_path: Path, url: str) -> None:
    problems = problems_of(tmp_path, destination(f'[[destinations.hooks]]\nurl = "{url}"\n'))
    assert keys_of(problems) == {"destinations[0].hooks[0].url"}


# What aiohttp refuses to connect to ("is not a canonical IPv4 address"): hosts of digits and
# dots other than a.b.c.d. tests/integration/test_hardening.py checks that the sender does.
NUMERIC_HOSTS_REFUSED = [
    "2130706433",  # 127.0.0.1 as one number
    "017700000001",  # the same in octal
    "127.1",
    "127.0.1",
    "0177.0.0.1",  # octal first part
    "127.000.000.001",
    "127.0.0.01",
    "127.0.0.1.",  # a trailing dot
    "1.2.3.4.5",
    "256.1.1.1",
    "0",
]
NUMERIC_HOSTS_ACCEPTED = [
    "127.0.0.1",
    "0.0.0.0",
    "10.1.2.3",
    "255.255.255.255",
    "\uff11\uff12\uff17.0.0.1",  # fullwidth digits: read as 127.0.0.1
    "0x7f.0.0.1",  # a name to aiohttp: resolved, then the address guard judges 127.0.0.1
    "[::ffff:127.0.0.1]",
    "1e100.example",
]


@pytest.mark.parametrize("host", NUMERIC_HOSTS_REFUSED)
def test_numeric_hosts_the_sender_never_connects_to_are_refused(tmp_path: Path, host: str) -> None:
    hooks = HOOK + f'[[destinations.hooks]]\nurl = "http://{host}:9000/hook"\n'
    problems = problems_of(tmp_path, destination(hooks))
    assert keys_of(problems) == {"destinations[0].hooks[1].url"}
    [problem] = problems
    assert f"the host {host} is a numeric IPv4 form other than a dotted quad" in problem
    assert "a.b.c.d" in problem


@pytest.mark.parametrize("host", NUMERIC_HOSTS_ACCEPTED)
def test_dotted_quads_ipv6_and_names_are_accepted(tmp_path: Path, host: str) -> None:
    url = f"http://{host}:9000/hook"
    settings = config.load(write(tmp_path, destination(f'[[destinations.hooks]]\nurl = "{url}"\n')))
    assert settings.destination("crm").hooks[0].url == url


def test_check_config_names_the_numeric_host_of_each_hook(tmp_path: Path) -> None:
    hooks = "".join(
        f'[[destinations.hooks]]\nurl = "http://{host}/h"\n'
        for host in ("2130706433", "hooks.example.com", "127.1")
    )
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "efd",
            "check-config",
            "--config",
            str(write(tmp_path, destination(hooks))),
        ],
        capture_output=True,
        text=True,
        check=False,
    )
    assert done.returncode == 2
    assert "destinations[0].hooks[0].url: the host 2130706433" in done.stderr
    assert "destinations[0].hooks[2].url: the host 127.1" in done.stderr
    assert "hooks[1]" not in done.stderr


def test_the_bad_url_of_the_third_hook_is_named(tmp_path: Path) -> None:
    hooks = (
        HOOK + HOOK + '[[destinations.hooks]]\nurl = "gopher://x"\n'
        '[[destinations.hooks]]\nurl = "nope"\n'
    )
    problems = problems_of(tmp_path, destination(hooks))
    assert keys_of(problems) == {"destinations[0].hooks[2].url", "destinations[0].hooks[3].url"}


@pytest.mark.parametrize(
    "header",
    [
        "Content-Type",
        "content-type",
        "CONTENT-TYPE",
        "User-Agent",
        "user-agent",
        "X-Signature",
        "x-signature",
    ],
)
def test_reserved_static_headers(tmp_path: Path, header: str) -> None:
    hooks = HOOK + f'headers = {{ "{header}" = "v" }}\n'
    problems = problems_of(tmp_path, destination(hooks))
    assert keys_of(problems) == {"destinations[0].hooks[0].headers"}
    assert header in problems[0]


def test_allowed_static_headers(tmp_path: Path) -> None:
    hooks = (
        '[[destinations.hooks]]\nurl = "https://h.example.com/"\n'
        'headers = { "X-Env" = "prod", "Authorization" = "Bearer t", '
        '"X-Signature-Version" = "1" }\n'
    )
    settings = config.load(write(tmp_path, destination(hooks)))
    assert settings.destination("crm").hooks[0].headers == {
        "X-Env": "prod",
        "Authorization": "Bearer t",
        "X-Signature-Version": "1",
    }


def test_header_values_must_be_strings(tmp_path: Path) -> None:
    hooks = '[[destinations.hooks]]\nurl = "https://h.example.com/"\nheaders = { "X-N" = 5 }\n'
    assert keys_of(problems_of(tmp_path, destination(hooks))) == {
        "destinations[0].hooks[0].headers.X-N"
    }


@pytest.mark.parametrize("type_", ['"email"', '"Webhooks"', "1"])
def test_destination_type_is_webhooks(tmp_path: Path, type_: str) -> None:
    problems = problems_of(tmp_path, destination(HOOK, f"type = {type_}"))
    assert keys_of(problems) == {"destinations[0].type"}


def test_ordering_defaults_to_none_and_takes_per_user(tmp_path: Path) -> None:
    settings = config.load(write(tmp_path, destination(HOOK)))
    assert settings.destination("crm").ordering == "none"
    settings = config.load(write(tmp_path, destination(HOOK, 'ordering = "per_user"')))
    assert settings.destination("crm").ordering == "per_user"


@pytest.mark.parametrize("value", ['"per_session"', '"PER_USER"', '""', "true", "1"])
def test_other_orderings_are_refused_naming_the_key(tmp_path: Path, value: str) -> None:
    problems = problems_of(tmp_path, destination(HOOK, f"ordering = {value}"))
    assert keys_of(problems) == {"destinations[0].ordering"}
    assert "per_user" in problems[0]


# -- cross-entry rules ---------------------------------------------------------------------

SOURCES_AND_CRM = """\
[[sources]]
name = "{a}"
write_key = "{ka}"
destinations = {da}

[[sources]]
name = "{b}"
write_key = "{kb}"
destinations = {db}

[[destinations]]
name = "crm"
[[destinations.hooks]]
url = "https://hooks.example.com/segment"
"""


def sources(
    a: str = "web", ka: str = "k1", b: str = "app", kb: str = "k2", da: str = "[]", db: str = "[]"
) -> str:
    return SOURCES_AND_CRM.format(a=a, ka=ka, b=b, kb=kb, da=da, db=db)


def test_distinct_sources_load(tmp_path: Path) -> None:
    settings = config.load(write(tmp_path, sources(da='["crm"]', db='["crm"]')))
    assert [s.name for s in settings.sources] == ["web", "app"]


def test_source_names_unique(tmp_path: Path) -> None:
    problems = problems_of(tmp_path, sources(b="web"))
    assert keys_of(problems) == {"sources[1].name"}
    assert "sources[0]" in problems[0]


def test_write_keys_unique(tmp_path: Path) -> None:
    problems = problems_of(tmp_path, sources(kb="k1"))
    assert keys_of(problems) == {"sources[1].write_key"}
    assert "k1" not in problems[0].split(": ", 1)[1]  # a secret is not printed


def test_source_names_are_case_sensitive(tmp_path: Path) -> None:
    assert len(config.load(write(tmp_path, sources(b="WEB"))).sources) == 2


def test_destination_names_unique(tmp_path: Path) -> None:
    text = destination(HOOK) + "\n" + destination(HOOK)
    assert keys_of(problems_of(tmp_path, text)) == {"destinations[1].name"}


def test_referenced_destinations_exist(tmp_path: Path) -> None:
    problems = problems_of(tmp_path, sources(da='["crm", "missing"]', db='["Crm"]'))
    assert keys_of(problems) == {"sources[0].destinations[1]", "sources[1].destinations[0]"}
    assert any("'missing'" in p for p in problems)


def test_every_cross_entry_problem_reported(tmp_path: Path) -> None:
    text = (
        sources(b="web", kb="k1", da='["gone"]')
        + "\n[delivery]\nretry_initial_seconds = 60\nretry_max_seconds = 30\n"
    )
    assert keys_of(problems_of(tmp_path, text)) == {
        "sources[1].name",
        "sources[1].write_key",
        "sources[0].destinations[0]",
        "delivery.retry_max_seconds",
    }


def test_retry_max_below_initial(tmp_path: Path) -> None:
    text = "[delivery]\nretry_initial_seconds = 10\nretry_max_seconds = 5\n"
    assert keys_of(problems_of(tmp_path, text)) == {"delivery.retry_max_seconds"}


def test_lease_must_outlast_the_timeout(tmp_path: Path) -> None:
    text = "[delivery]\ntimeout_seconds = 30\nlease_seconds = 35\n"
    assert keys_of(problems_of(tmp_path, text)) == {"delivery.lease_seconds"}


# -- single-field rules ----------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "key"),
    [
        ("[server]\nport = 70000\n", "server.port"),
        ("[server]\nport = -1\n", "server.port"),
        ('[server]\nport = "http"\n', "server.port"),
        ('[storage]\nurl = "mysql://x/y"\n', "storage.url"),
        ('[storage]\nsqlite_synchronous = "OFF"\n', "storage.sqlite_synchronous"),
        ("[storage]\nretention_interval_seconds = 0\n", "storage.retention_interval_seconds"),
        ("[storage]\nretention_interval_seconds = -5\n", "storage.retention_interval_seconds"),
        ('[storage]\nretention_interval_seconds = "often"\n', "storage.retention_interval_seconds"),
        ('[delivery]\nallowed_networks = ["10.0.0.0/8", "nope"]\n', "delivery.allowed_networks"),
        ('[delivery]\nallowed_networks = "10.0.0.0/8"\n', "delivery.allowed_networks"),
        ('[delivery]\nuser_agent = ""\n', "delivery.user_agent"),
        ('[delivery]\nca_file = "/nonexistent/ca.pem"\n', "delivery.ca_file"),
        ('[logging]\nlevel = "LOUD"\n', "logging.level"),
        ('[[sources]]\nname = "s"\nwrite_key = ""\n', "sources[0].write_key"),
        ('[[sources]]\nname = ""\nwrite_key = "k"\n', "sources[0].name"),
        ('[[sources]]\nname = "s"\n', "sources[0].write_key"),
        ('[[sources]]\nwrite_key = "k"\n', "sources[0].name"),
        (
            '[[sources]]\nname = "s"\nwrite_key = "k"\ndestinations = "crm"\n',
            "sources[0].destinations",
        ),
        ('server = "x"\n', "server"),
    ],
)
def test_field_rules(tmp_path: Path, text: str, key: str) -> None:
    assert keys_of(problems_of(tmp_path, text)) == {key}


def test_retention_interval_defaults_to_ten_minutes_and_takes_fractions(tmp_path: Path) -> None:
    assert config.load(write(tmp_path, "")).storage.retention_interval_seconds == 600
    text = "[storage]\nretention_interval_seconds = 0.25\n"
    assert config.load(write(tmp_path, text)).storage.retention_interval_seconds == 0.25


ORIGINS = '[[sources]]\nname = "s"\nwrite_key = "k"\nallowed_origins = {}\n'


def test_allowed_origins_load(tmp_path: Path) -> None:
    origins = '["https://shop.example", "http://localhost:3000", "https://*.shop.example"]'
    [source] = config.load(write(tmp_path, ORIGINS.format(origins))).sources
    assert source.allowed_origins == [
        "https://shop.example",
        "http://localhost:3000",
        "https://*.shop.example",
    ]
    [source] = config.load(write(tmp_path, ORIGINS.format("[]"))).sources
    assert source.allowed_origins == []  # no web page at all: server-side libraries only
    [source] = config.load(write(tmp_path, GOOD)).sources
    assert source.allowed_origins is None  # any origin


def test_each_bad_allowed_origin_is_named(tmp_path: Path) -> None:
    text = ORIGINS.format('["https://shop.example", "shop.example", "https://a.example/", 3]')
    problems = problems_of(tmp_path, text)
    assert keys_of(problems) == {
        "sources[0].allowed_origins[1]",
        "sources[0].allowed_origins[2]",
        "sources[0].allowed_origins[3]",
    }
    assert "sources[0].allowed_origins[1]: must be an origin: scheme://host[:port]" in problems[0]
    done = run_check_config(write(tmp_path, text))
    assert done.returncode != 0
    assert "  sources[0].allowed_origins[2]: must be an origin" in done.stderr


# -- unknown keys, at every depth ------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "key"),
    [
        ("bogus = 1\n", "bogus"),
        ("[bogus]\nx = 1\n", "bogus"),
        ("[server]\nprot = 8088\n", "server.prot"),
        ("[storage]\npath = 'x'\n", "storage.path"),
        ("[delivery]\ntimeout = 5\n", "delivery.timeout"),
        ("[logging]\nfile = 'x'\n", "logging.file"),
        ('[[sources]]\nname = "s"\nwrite_key = "k"\nwritekey = "k"\n', "sources[0].writekey"),
        (destination(HOOK, 'secret = "x"'), "destinations[0].secret"),
        (destination(HOOK + 'method = "PUT"\n'), "destinations[0].hooks[0].method"),
        (destination(HOOK + HOOK + "retries = 3\n"), "destinations[0].hooks[1].retries"),
    ],
)
def test_unknown_keys_are_errors(tmp_path: Path, text: str, key: str) -> None:
    problems = problems_of(tmp_path, text)
    assert problems == [f"{key}: unknown key"]


# -- several problems at once ---------------------------------------------------------------

SEVERAL_BAD = textwrap.dedent(
    """\
    bogus = 1

    [server]
    port = "abc"
    colour = "red"

    [delivery]
    timeout_seconds = -1
    allowed_networks = ["not-a-cidr"]

    [[sources]]
    name = "web"
    write_key = "k"
    extra = true

    [[destinations]]
    name = "crm"
    type = "email"
    [[destinations.hooks]]
    url = "ftp://hooks.example.com/"
    headers = { "Content-Type" = "text/plain" }
    verb = "PUT"
    """
)
SEVERAL_BAD_KEYS = {
    "bogus",
    "server.port",
    "server.colour",
    "delivery.timeout_seconds",
    "delivery.allowed_networks",
    "sources[0].extra",
    "destinations[0].type",
    "destinations[0].hooks[0].url",
    "destinations[0].hooks[0].headers",
    "destinations[0].hooks[0].verb",
}


def test_several_bad_keys_all_reported(tmp_path: Path) -> None:
    problems = problems_of(tmp_path, SEVERAL_BAD)
    assert keys_of(problems) == SEVERAL_BAD_KEYS
    assert len(problems) == len(SEVERAL_BAD_KEYS)


def test_schema_and_cross_entry_problems_reported_together(tmp_path: Path) -> None:
    text = "[server]\nbogus = 1\n\n" + sources(b="web", da='["gone"]')
    assert keys_of(problems_of(tmp_path, text)) == {
        "server.bogus",
        "sources[1].name",
        "sources[0].destinations[0]",
    }


# -- environment overrides ------------------------------------------------------------------


def test_environment_overrides_win_over_the_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("EFD_SERVER__PORT", "9000")
    monkeypatch.setenv("EFD_DELIVERY__TIMEOUT_SECONDS", "0.5")
    monkeypatch.setenv("EFD_DELIVERY__USER_AGENT", "Segment.io/1.0")
    settings = config.load(write(tmp_path, GOOD))
    assert settings.server.port == 9000
    assert settings.server.host == "127.0.0.1"  # the rest of [server] still comes from the file
    assert settings.delivery.timeout_seconds == 0.5
    assert settings.delivery.user_agent == "Segment.io/1.0"
    assert settings.delivery.retry_window_seconds == 14400
    assert settings.sources[0].name == "website"


def test_environment_override_without_a_file_section(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("EFD_STORAGE__URL", "sqlite:///tmp/x.db")
    assert config.load(write(tmp_path, "")).storage.url == "sqlite:///tmp/x.db"


def test_environment_values_are_validated(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("EFD_SERVER__PORT", "not-a-port")
    assert keys_of(problems_of(tmp_path, GOOD)) == {"server.port"}


def test_unknown_environment_keys_are_errors(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("EFD_SERVER__BOGUS", "1")
    assert problems_of(tmp_path, GOOD) == ["server.bogus: unknown key"]


def test_init_overrides_win(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("EFD_SERVER__PORT", "9000")
    settings = config.load(write(tmp_path, GOOD), server={"port": 1234})
    assert settings.server.port == 1234


# -- files that cannot be read ---------------------------------------------------------------


# The file's content never appears in these problems: a config holds write keys and tokens.
SECRET_TEXT = 'write_key = "wk_secret_never_shown"\n'


def test_missing_file(tmp_path: Path) -> None:
    path = tmp_path / "nope.toml"
    with pytest.raises(config.ConfigError) as caught:
        config.load(path)
    assert caught.value.problems == [f"{path}: no such file"]


def test_a_directory_is_not_a_file(tmp_path: Path) -> None:
    with pytest.raises(config.ConfigError) as caught:
        config.load(tmp_path)
    assert caught.value.problems == [f"{tmp_path}: a directory, not a file"]


def test_a_device_is_not_a_regular_file() -> None:
    with pytest.raises(config.ConfigError) as caught:
        config.load("/dev/null")
    assert caught.value.problems == ["/dev/null: not a regular file"]


def test_a_file_in_a_missing_directory(tmp_path: Path) -> None:
    path = tmp_path / "nowhere" / "efd.toml"
    with pytest.raises(config.ConfigError) as caught:
        config.load(path)
    assert caught.value.problems == [f"{path}: no such file"]


@pytest.mark.parametrize(
    ("data", "where"),
    [
        (b"\xff" + SECRET_TEXT.encode(), "line 1, column 1"),
        (SECRET_TEXT.encode() + b'[server]\nhost = "caf\xe9"\n', "line 3, column 12"),
        ('# déjà\nname = "x\xe9\x80"\n'.encode("latin-1"), "line 1, column 4"),
        (SECRET_TEXT.encode() + "# é\n".encode() + b"# \xc3\n", "line 3, column 3"),
    ],
)
def test_not_utf8_names_the_place_and_nothing_of_the_content(
    tmp_path: Path, data: bytes, where: str
) -> None:
    path = tmp_path / "efd.toml"
    path.write_bytes(data)
    with pytest.raises(config.ConfigError) as caught:
        config.load(path)
    assert caught.value.problems == [f"{path}: not valid UTF-8 ({where})"]


@pytest.mark.parametrize(
    "text",
    ["[server\nport = 1\n", "port = \n", 'a = "unterminated\n', "[server]\nport = 1\nport = 2\n"],
)
def test_toml_syntax_error(tmp_path: Path, text: str) -> None:
    path = write(tmp_path, text)
    with pytest.raises(config.ConfigError) as caught:
        config.load(path)
    (problem,) = caught.value.problems
    assert problem.startswith(f"{path}: not valid TOML: ")
    assert "line" in problem or "end of document" in problem
    assert "\n" not in problem


def test_a_toml_error_shows_no_value(tmp_path: Path) -> None:
    path = write(tmp_path, SECRET_TEXT + 'admin_token = "tok_secret_never_shown\n')
    with pytest.raises(config.ConfigError) as caught:
        config.load(path)
    assert "secret_never_shown" not in str(caught.value)


# -- the command line -----------------------------------------------------------------------


def run_check_config(path: Path) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("EFD_")}
    return subprocess.run(
        [sys.executable, "-m", "efd", "check-config", "--config", str(path)],
        capture_output=True,
        text=True,
        env=env,
        cwd=path.parent,
        timeout=60,
        check=False,
    )


def test_cli_check_config_reports_every_bad_key(tmp_path: Path) -> None:
    done = run_check_config(write(tmp_path, SEVERAL_BAD))
    assert done.returncode != 0
    for key in SEVERAL_BAD_KEYS:
        assert f"  {key}: " in done.stderr, key
    assert f"({len(SEVERAL_BAD_KEYS)} problems)" in done.stderr
    assert "Traceback" not in done.stderr


def test_cli_check_config_counts_one_problem_in_the_singular(tmp_path: Path) -> None:
    done = run_check_config(write(tmp_path, GOOD + '[logging]\nlevel = "LOUD"\n'))
    assert done.returncode == 2
    assert done.stderr.startswith("efd: invalid configuration (1 problem):\n  logging.level: ")


def test_cli_check_config_accepts_a_good_file(tmp_path: Path) -> None:
    path = write(tmp_path, GOOD)
    done = run_check_config(path)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == f"{path}: OK (1 sources, 1 destinations)"


# -- signing -----------------------------------------------------------------------------------

_WHSEC = "whsec_" + "c2VjcmV0c2VjcmV0c2VjcmV0c2VjcmV0"  # 24 bytes


def _destination(**fields: Any) -> dict[str, Any]:
    return {"name": "d", "hooks": [{"url": "https://h.example/"}], **fields}


def test_signing_defaults_to_x_signature_alone() -> None:
    settings = config.load(None, destinations=[_destination(shared_secret="s")])
    route = settings.destinations[0].route("efd/1.0")
    assert (route.secret, route.standard_secrets) == ("s", ())


def test_both_signings_and_rotation_secrets_reach_the_route() -> None:
    old = "whsec_" + "b2xkb2xkb2xkb2xkb2xkb2xkb2xkb2xk"
    settings = config.load(
        None,
        destinations=[
            _destination(
                shared_secret="s",
                signing=["x-signature", "standard-webhooks"],
                standard_webhooks_secrets=[_WHSEC, old],
            )
        ],
    )
    route = settings.destinations[0].route("efd/1.0")
    assert route.secret == "s"
    assert route.standard_secrets == (b"secret" * 4, b"oldoldoldoldoldoldoldold")
    assert "whsec" not in repr(route)


def test_standard_webhooks_alone_sends_no_x_signature() -> None:
    settings = config.load(
        None,
        destinations=[
            _destination(
                shared_secret="s", signing=["standard-webhooks"], standard_webhooks_secrets=[_WHSEC]
            )
        ],
    )
    assert settings.destinations[0].route("efd/1.0").secret is None


@pytest.mark.parametrize(
    ("fields", "words"),
    [
        ({"standard_webhooks_secrets": ["whsec_!!!"]}, "[0] must be whsec_ followed by"),
        ({"standard_webhooks_secrets": [_WHSEC, "secret"]}, "[1] must start with whsec_"),
        ({"signing": ["standard-webhooks"]}, "needs at least one whsec_ secret"),
        ({"signing": ["hmac"]}, "x-signature"),
        ({"signing": []}, "at least 1"),
        ({"signing": ["x-signature", "x-signature"]}, "twice"),
    ],
)
def test_bad_signing_settings_name_the_key(fields: dict[str, Any], words: str) -> None:
    with pytest.raises(config.ConfigError) as error:
        config.load(None, destinations=[_destination(**fields)])
    [problem] = error.value.problems
    assert problem.startswith("destinations[0]")
    assert words in problem
    assert "whsec_!!!" not in problem  # secrets are never echoed


# -- destination filters ---------------------------------------------------------------------

ISSUE_FILTERS = textwrap.dedent(
    """\
    [[destinations.filters]]
    if = 'type = "track" and event = "Debug Ping"'
    action = "drop"

    [[destinations.filters]]
    if = "all"
    action = "drop_fields"
    fields = { properties = ["email", "phone"], context = ["ip"], traits = ["email"] }

    [[destinations.filters]]
    if = 'event = "Page Scrolled"'
    action = "sample"
    percent = 10          # deterministic per messageId, so a redelivery makes the same choice
    """
)


def filtered(*filters: str) -> str:
    return destination(HOOK) + "".join(f"[[destinations.filters]]\n{f}\n" for f in filters)


def test_the_issue_filters_load(tmp_path: Path) -> None:
    crm = config.load(write(tmp_path, GOOD + ISSUE_FILTERS)).destination("crm")
    drop, fields, sample = crm.filters
    assert (drop.when.source, drop.action) == ('type = "track" and event = "Debug Ping"', "drop")
    assert (drop.percent, drop.fields) == (None, None)
    assert (fields.when.source, fields.action) == ("all", "drop_fields")
    assert fields.fields is not None
    assert fields.fields.properties == ["email", "phone"]
    assert (fields.fields.context, fields.fields.traits) == (["ip"], ["email"])
    assert (sample.action, sample.percent) == ("sample", 10)
    # Parsed at load: the filter set applies them.
    rules = crm.filter_set()
    assert rules.apply({"type": "track", "event": "Debug Ping", "messageId": "m"}) == Filtered(
        0, "drop", 'type = "track" and event = "Debug Ping"'
    )
    kept = rules.apply(
        {"type": "identify", "messageId": "m", "traits": {"email": "e", "plan": "pro"}}
    )
    assert kept == {"type": "identify", "messageId": "m", "traits": {"plan": "pro"}}


def test_filters_are_optional(tmp_path: Path) -> None:
    crm = config.load(write(tmp_path, GOOD)).destination("crm")
    assert crm.filters == []
    assert not crm.filter_set()


@pytest.mark.parametrize("percent", ["0", "100", "12.5", "3"])
def test_sample_percent_bounds_accepted(tmp_path: Path, percent: str) -> None:
    [rule] = (
        config.load(
            write(tmp_path, filtered(f'if = "all"\naction = "sample"\npercent = {percent}'))
        )
        .destinations[0]
        .filters
    )
    assert rule.percent == float(percent)


def test_allow_fields_with_nested_paths_and_escapes(tmp_path: Path) -> None:
    text = filtered(
        'if = \'type = "track"\'\naction = "allow_fields"\n'
        "fields = { properties = ['products.sku', 'a\\.b'], context = [] }"
    )
    [rule] = config.load(write(tmp_path, text)).destinations[0].filters
    assert rule.rule().fields == (("properties", (("products", "sku"), ("a.b",))), ("context", ()))


def test_a_bad_expression_names_the_filter_and_the_position(tmp_path: Path) -> None:
    text = filtered(
        'if = "all"\naction = "drop"',
        'if = \'type = "track" && event = "x"\'\naction = "drop"',
    )
    assert problems_of(tmp_path, text) == [
        "destinations[0].filters[1].if: line 1, column 16: '&&' is not FQL; write 'and'"
    ]
    done = run_check_config(write(tmp_path, text))
    assert done.returncode != 0
    assert "destinations[0].filters[1].if: line 1, column 16:" in done.stderr


@pytest.mark.parametrize(
    ("lines", "key", "words"),
    [
        ('if = "all"', "action", "Field required"),
        ('if = "all"\naction = "explode"', "action", "'drop', 'sample', 'drop_fields'"),
        ('action = "drop"', "if", "Field required"),
        ('if = 3\naction = "drop"', "if", 'an FQL expression, or "all"'),
        ('if = ""\naction = "drop"', "if", "line 1, column 1: the expression is empty"),
        ("if = 'event = Debug Ping'\naction = \"drop\"", "if", "line 1, column 15: expected"),
        ("if = 'length(event)'\naction = \"drop\"", "if", "expected a condition"),
        (
            'if = "ALL"\naction = "drop"',
            "if",
            'line 1, column 1: to filter every message, write "all"',
        ),
        ('if = "all"\naction = "sample"', "percent", 'required with action = "sample"'),
        ('if = "all"\naction = "sample"\npercent = 101', "percent", "less than or equal to 100"),
        ('if = "all"\naction = "sample"\npercent = -1', "percent", "greater than or equal to 0"),
        ('if = "all"\naction = "sample"\npercent = nan', "percent", "finite"),
        ('if = "all"\naction = "sample"\npercent = true', "percent", "valid number"),
        ('if = "all"\naction = "sample"\npercent = "10"', "percent", "valid number"),
        ('if = "all"\naction = "drop"\npercent = 10', "percent", "only a sample filter"),
        ('if = "all"\naction = "drop_fields"', "fields", 'required with action = "drop_fields"'),
        ('if = "all"\naction = "allow_fields"', "fields", "required"),
        (
            'if = "all"\naction = "drop"\nfields = { properties = ["a"] }',
            "fields",
            "only drop_fields and allow_fields",
        ),
        (
            'if = "all"\naction = "sample"\npercent = 5\nfields = { properties = ["a"] }',
            "fields",
            'not action = "sample"',
        ),
        ('if = "all"\naction = "drop_fields"\nfields = {}', "fields", "at least one of"),
        (
            'if = "all"\naction = "drop_fields"\nfields = { userId = ["x"] }',
            "fields.userId",
            "unknown key",
        ),
        (
            'if = "all"\naction = "drop_fields"\nfields = { properties = ["email", "a..b"] }',
            "fields.properties",
            "[1] 'a..b' has an empty name",
        ),
        (
            'if = "all"\naction = "drop_fields"\nfields = { context = "ip" }',
            "fields.context",
            "valid list",
        ),
        ('when = "all"\nif = "all"\naction = "drop"', "when", "unknown key"),
    ],
)
def test_bad_filters_name_the_key(tmp_path: Path, lines: str, key: str, words: str) -> None:
    [problem] = problems_of(tmp_path, filtered(lines))
    assert problem.startswith(f"destinations[0].filters[0].{key}: "), problem
    assert words in problem


def test_every_bad_filter_is_reported(tmp_path: Path) -> None:
    text = filtered(
        'if = "all"\naction = "drop"',
        "if = 'a = '\naction = \"drop\"",
        'if = "all"\naction = "sample"',
        'if = "all"\naction = "allow_fields"\nfields = { traits = ["a."] }\nextra = 1',
    )
    assert keys_of(problems_of(tmp_path, text)) == {
        "destinations[0].filters[1].if",
        "destinations[0].filters[2].percent",
        "destinations[0].filters[3].fields.traits",
        "destinations[0].filters[3].extra",
    }


# -- refused at load, every bad key named (moved from the end-to-end suite) ----------------------


@pytest.mark.parametrize(
    "token", ["", "   ", "short-token", " padded-token-0123456 ", "tab\tbed-token-01234"]
)
def test_weak_admin_tokens_are_refused(token: str) -> None:
    with pytest.raises(config.ConfigError) as error:
        config.load(None, server={"admin_token": token})
    assert [p.split(":")[0] for p in error.value.problems] == ["server.admin_token"]


@pytest.mark.parametrize(
    ("name", "value"),
    [
        ("Host", "evil.example"),
        ("  content-length ", "0"),
        ("TRANSFER-ENCODING", "chunked"),
        ("Connection", "close"),
        ("user-agent", "x"),
        ("X-Signature", "forged"),
        ("webhook-signature", "v1,forged"),
        ("Bad Name", "v"),
        ("X-Colon:", "v"),
        ("X-Caf\u00e9", "v"),
        ("X-Inject", "a\r\nHost: evil"),
        ("X-Newline", "a\nb"),
        ("X-Nul", "a\x00b"),
        ("X-Bell", "a\x07b"),
        ("X-Accent", "caf\u00e9"),
    ],
)
def test_static_headers_that_could_inject_or_override_are_refused(name: str, value: str) -> None:
    hooks = [{"url": "https://hooks.example.com/", "headers": {name: value}}]
    with pytest.raises(config.ConfigError) as error:
        config.load(None, destinations=[{"name": "d", "hooks": hooks}])
    [problem] = error.value.problems
    assert problem.startswith("destinations[0].hooks[0].headers:")
    assert repr(name) in problem


@pytest.mark.parametrize("agent", ["efd\r\nX-Evil: 1", "efd\n", "efd\x00", " efd", "efd/\u00e9"])
def test_user_agent_follows_the_header_value_rules(agent: str) -> None:
    with pytest.raises(config.ConfigError) as error:
        config.load(None, delivery={"user_agent": agent})
    assert [p.split(":")[0] for p in error.value.problems] == ["delivery.user_agent"]


def test_every_bad_key_is_named_at_once() -> None:
    with pytest.raises(config.ConfigError) as error:
        config.load(
            None,
            server={"admin_token": "x"},
            delivery={"user_agent": "a\nb"},
            destinations=[{"name": "d", "hooks": [{"url": "http://h/", "headers": {"Host": "h"}}]}],
        )
    keys = sorted(p.split(":")[0] for p in error.value.problems)
    assert keys == ["delivery.user_agent", "destinations[0].hooks[0].headers", "server.admin_token"]


@pytest.mark.parametrize(
    "condition",
    [
        "__import__('os').system('touch /tmp/efd-pwned')",
        "trait('plan') = 'pro'; import os",
        "eval('1') = 1",
    ],
)
def test_conditions_are_parsed_never_run(condition: str, tmp_path: Path) -> None:
    settings = settings_dict("sqlite:///unused.db")
    settings["audiences"] = [{"name": "A", "destinations": ["hooks"], "condition": condition}]
    with pytest.raises(config.ConfigError) as error:
        config.load(None, **settings)
    [problem] = error.value.problems
    assert problem.startswith("audiences[0].condition: line 1, column ")
    assert not Path("/tmp/efd-pwned").exists()


def test_the_personas_source_name_is_reserved() -> None:
    settings = settings_dict("sqlite:///unused.db")
    settings["sources"][0]["name"] = "personas"
    with pytest.raises(config.ConfigError) as error:
        config.load(None, **settings)
    assert any(
        p.startswith("sources[0].name: 'personas' is reserved") for p in error.value.problems
    )
