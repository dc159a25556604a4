"""efd.config for actions destinations (docs/actions.md#configuration): what loads, the
routes and auths it gives, and every refusal named by its full key path."""

from __future__ import annotations

import os
import textwrap
from pathlib import Path

import pytest

from efd import config
from efd.delivery import outauth

SOURCE = '[[sources]]\nname = "web"\nwrite_key = "wk"\ndestinations = ["crm"]\n'
ISSUE = textwrap.dedent(
    """\
    [[destinations]]
    name = "crm"
    type = "actions"
    shared_secret = "s3cret"

    [[destinations.actions]]
    name = "orders"
    trigger = 'type = "track" and event = "Order Completed"'
    url = "https://crm.example.com/orders"
    method = "PUT"
    headers = { "X-Source" = "efd" }
    content_type = "application/json"
    [destinations.actions.auth]
    type = "oauth2_client_credentials"
    token_url = "https://auth.example.com/token"
    client_id = "efd"
    client_secret = "cs-secret"
    scope = "orders:write"

    [destinations.actions.data]
    order_id = { "@path" = "$.properties.order_id" }
    email = { "@case" = { operator = "lower", value = { "@path" = "$.traits.email" } } }
    summary = { "@template" = "{{userId}} paid {{properties.revenue}}" }
    """
)


@pytest.fixture(autouse=True)
def _no_efd_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    for key in list(os.environ):
        if key.startswith("EFD_"):
            monkeypatch.delenv(key)


def load(tmp_path: Path, text: str) -> config.Settings:
    path = tmp_path / "efd.toml"
    path.write_text(SOURCE + text)
    return config.load(path)


def problems_of(tmp_path: Path, text: str) -> list[str]:
    with pytest.raises(config.ConfigError) as caught:
        load(tmp_path, text)
    return caught.value.problems


def keys_of(problems: list[str]) -> set[str]:
    return {problem.split(": ", 1)[0] for problem in problems}


def action(**keys: str) -> str:
    """An actions destination "crm" with one action, its keys as TOML values."""
    values = {
        "name": '"orders"',
        "trigger": """'type = "track"'""",
        "url": '"https://crm.example.com/orders"',
        **keys,
    }
    lines = "".join(f"{key} = {value}\n" for key, value in values.items() if value)
    return f'[[destinations]]\nname = "crm"\ntype = "actions"\n[[destinations.actions]]\n{lines}'


def test_the_issue_configuration_loads(tmp_path: Path) -> None:
    settings = load(tmp_path, ISSUE)
    destination = settings.destination("crm")
    [route] = destination.routes("efd/1.0")
    assert route.name == "crm/orders"
    assert route.hooks == (("https://crm.example.com/orders", {"X-Source": "efd"}),)
    assert (route.method, route.content_type, route.secret) == ("PUT", "application/json", "s3cret")
    [(name, auth)] = destination.auths().items()
    assert name == "crm/orders"
    assert isinstance(auth, outauth.ClientCredentials)
    assert (auth.token_url, auth.client_id, auth.scope) == (
        "https://auth.example.com/token",
        "efd",
        "orders:write",
    )
    assert settings.route_names() == {"crm", "crm/orders"}
    assert list(settings.action_sets()) == ["crm"]


def test_defaults_post_json_the_whole_message_no_auth(tmp_path: Path) -> None:
    destination = load(tmp_path, action()).destination("crm")
    [route] = destination.routes("efd/1.0")
    assert (route.method, route.content_type) == ("POST", "application/json")
    assert destination.actions[0].data == {"@path": "$."}
    assert destination.auths() == {}


def test_data_as_json_text_and_bearer_and_basic(tmp_path: Path) -> None:
    text = action(
        data="""'{"id": {"@path": "$.userId"}}'""", auth='{ type = "bearer", token = "t0k" }'
    )
    text += '[[destinations.actions]]\nname = "b"\ntrigger = \'type = "identify"\'\n'
    text += 'url = "https://crm.example.com/{{userId}}"\n'
    text += 'auth = { type = "basic", username = "u", password = "p" }\nmax_per_second = 2\n'
    destination = load(tmp_path, text).destination("crm")
    auths = destination.auths()
    assert isinstance(auths["crm/orders"], outauth.Bearer)
    assert isinstance(auths["crm/b"], outauth.Basic)
    assert "t0k" not in repr(auths)
    assert "'p'" not in repr(auths)
    # A rate limit is its route's, keyed by the action's URL as configured.
    [bucket] = destination.route_buckets()["crm/b"]
    assert bucket.url == "https://crm.example.com/{{userId}}"
    assert [r.name for r in destination.routes("efd")] == ["crm/orders", "crm/b"]


def test_per_user_ordering_applies_to_each_action_route(tmp_path: Path) -> None:
    text = action().replace('type = "actions"\n', 'type = "actions"\nordering = "per_user"\n')
    text += '[[destinations.actions]]\nname = "b"\ntrigger = \'type = "identify"\'\n'
    text += 'url = "https://crm.example.com/b"\n'
    assert load(tmp_path, text).ordered() == {"crm/orders", "crm/b"}


@pytest.mark.parametrize(
    ("keys", "key", "words"),
    [
        ({"name": '"a/b"'}, "name", 'may not contain "/"'),
        ({"name": '""'}, "name", "at least 1"),
        ({"trigger": """'type = "track" and'"""}, "trigger", "line 1, column"),
        ({"trigger": ""}, "trigger", "Field required"),
        ({"url": '"https://{{host}}/x"'}, "url", "never in the scheme, host or port"),
        ({"url": '"ftp://crm.example.com/"'}, "url", "http"),
        ({"method": '"GET"'}, "method", "must be POST, PUT or PATCH"),
        ({"content_type": '"text/plain"'}, "content_type", "must be"),
        ({"headers": '{ "Content-Length" = "1" }'}, "headers.Content-Length", "set by efd"),
        ({"headers": '{ "Connection" = "x" }'}, "headers.Connection", "hop-by-hop"),
        ({"data": '{ x = { "@nope" = 1 } }'}, "data.x", "unknown directive @nope"),
        (
            {"data": '{ email = { "@case" = { operator = "lowr", value = "A" } } }'},
            "data.email.@case.operator",
            '"lower" or "upper"',
        ),
        ({"data": "'{not json'"}, "data", "not valid JSON"),
        ({"auth": '{ type = "digest" }'}, "auth.type", "must be one of"),
        ({"auth": '{ type = "bearer" }'}, "auth.token", "required"),
        ({"auth": '{ type = "bearer", token = "s3cr3t x" }'}, "auth.token", "printable ASCII"),
        ({"auth": '{ type = "bearer", token = "t", x = 1 }'}, "auth.x", "unknown key"),
        (
            {"auth": '{ type = "basic", username = "a:b", password = "p" }'},
            "auth.username",
            "colon",
        ),
        (
            {"auth": '{ type = "bearer", token = "t" }', "headers": '{ authorization = "x" }'},
            "headers.authorization",
            "set by auth",
        ),
        (
            {
                "auth": '{ type = "bearer", token = "t" }',
                "url": '"https://u:s3cr3t@crm.example.com/x"',
            },
            "url",
            "holds credentials, and auth gives them",
        ),
        ({"burst": "3"}, "burst", "max_per_second"),
        ({"color": '"red"'}, "color", "unknown key"),
    ],
)
def test_a_bad_action_key_is_named_by_its_full_path(
    tmp_path: Path, keys: dict[str, str], key: str, words: str
) -> None:
    problems = problems_of(tmp_path, action(**keys))
    assert keys_of(problems) == {f"destinations[0].actions[0].{key}"}, problems
    assert words in problems[0]
    assert "s3cr3t" not in " ".join(problems)  # a secret is never shown


def test_every_bad_key_of_every_action_is_named_at_once(tmp_path: Path) -> None:
    text = action(method='"GET"', data='{ e = { "@case" = { operator = "x", value = "A" } } }')
    text += '[[destinations.actions]]\nname = "orders"\ntrigger = "nope"\n'
    text += 'url = "https://{{h}}/"\n'
    problems = problems_of(tmp_path, text)
    assert keys_of(problems) == {
        "destinations[0].actions[0].method",
        "destinations[0].actions[0].data.e.@case.operator",
        "destinations[0].actions[1].trigger",
        "destinations[0].actions[1].url",
        "destinations[0].actions[1].name",
    }
    [duplicate] = [p for p in problems if p.startswith("destinations[0].actions[1].name")]
    assert "duplicate action name 'orders' (also destinations[0].actions[0])" in duplicate


def test_hooks_and_actions_belong_to_their_types(tmp_path: Path) -> None:
    hook = '[[destinations.hooks]]\nurl = "https://h.example/"\n'
    assert keys_of(problems_of(tmp_path, action() + hook)) == {"destinations[0].hooks"}
    empty = '[[destinations]]\nname = "crm"\ntype = "actions"\n'
    assert keys_of(problems_of(tmp_path, empty)) == {"destinations[0].actions"}
    webhooks = action().replace('type = "actions"', 'type = "webhooks"')
    assert keys_of(problems_of(tmp_path, webhooks)) == {
        "destinations[0].hooks",
        "destinations[0].actions",
    }


def test_at_most_five_actions(tmp_path: Path) -> None:
    text = action()
    for i in range(5):
        text += f'[[destinations.actions]]\nname = "a{i}"\ntrigger = \'type = "track"\'\n'
        text += 'url = "https://crm.example.com/"\n'
    problems = problems_of(tmp_path, text)
    assert keys_of(problems) == {"destinations[0].actions"}
    assert "at most 5" in problems[0]


def test_a_route_may_not_take_another_destinations_name(tmp_path: Path) -> None:
    other = '[[destinations]]\nname = "crm/orders"\n[[destinations.hooks]]\nurl = "https://h.example/"\n'
    problems = problems_of(tmp_path, action() + other)
    assert problems == [
        "destinations[0].actions[0].name: its route 'crm/orders' is the name of another "
        "destination (destinations[1].name)"
    ]


def test_an_action_set_pickles_to_a_parser_process(tmp_path: Path) -> None:
    import pickle

    sets = load(tmp_path, ISSUE).action_sets()
    again = pickle.loads(pickle.dumps(sets))  # noqa: S301 (its own bytes)
    message = {
        "type": "track",
        "event": "Order Completed",
        "userId": "u1",
        "properties": {"order_id": "o-1", "revenue": 5},
    }
    assert again["crm"].actions[0].mapped(message) == sets["crm"].actions[0].mapped(message)


def test_the_commented_example_in_config_example_toml_loads(tmp_path: Path) -> None:
    text = (Path(__file__).resolve().parents[2] / "config.example.toml").read_text()
    start = text.index('# [[destinations]]\n# name = "crm"')
    block = "\n".join(
        line.removeprefix("#").removeprefix(" ") for line in text[start:].splitlines()
    )
    settings = load(tmp_path, block)
    [route] = settings.destination("crm").routes("efd")
    assert (route.name, route.method) == ("crm/orders", "PUT")
