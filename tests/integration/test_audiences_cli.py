"""`efd check-config` on audiences and computed traits, and `efd audiences`."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from tests.conftest import DaemonFactory, ReceiverFactory, post, settings_dict, sql, write_toml
from tests.integration.test_audiences import (
    identify,
    orders,
    personas_settings,
)
from tests.integration.test_cli import efd
from tests.unit.test_personas import HIGH_VALUE, REVENUE


def write_config(path: Path, settings: dict[str, Any]) -> Path:
    """conftest's TOML, plus [[audiences]] and [[computed_traits]] tables."""
    settings = dict(settings)
    extra = {key: settings.pop(key, []) for key in ("audiences", "computed_traits")}
    write_toml(path, settings)
    lines = [path.read_text()]
    for section, entries in extra.items():
        for entry in entries:
            lines.append(f"[[{section}]]")
            lines += [f"{k} = {json.dumps(v)}" for k, v in entry.items()]
    path.write_text("\n".join(lines) + "\n")
    return path


def test_check_config_reports_condition_errors_with_line_and_column(tmp_path: Path) -> None:
    settings = settings_dict("sqlite:///unused.db")
    settings["audiences"] = [
        {"name": "Fine", "destinations": ["hooks"], "condition": HIGH_VALUE},
        {
            "name": "Broken",
            "destinations": ["hooks", "nowhere"],
            "condition": "trait('plan') = 'pro' and event('Order Completed').count() >=",
        },
        {"name": "fine", "destinations": ["hooks"], "condition": "trait('x') = 1"},
    ]
    settings["computed_traits"] = [
        {
            "name": "Revenue",
            "destinations": ["hooks"],
            "expression": "event('A').within(3 dayz).count()",
        },
        {"name": "Bad", "destinations": ["hooks"], "expression": "trait('plan')"},
    ]
    result = efd("check-config", "--config", str(write_config(tmp_path / "bad.toml", settings)))
    assert result.returncode == 2
    errors = result.stderr
    assert (
        "audiences[1].condition: line 1, column 62: expected a value after '>=', "
        "found the end of the expression" in errors
    )
    assert "audiences[1].destinations[1]: no destination named 'nowhere'" in errors
    assert "audiences[2].name: delivered as the trait 'fine', like audiences[0]" in errors
    assert "computed_traits[0].expression: line 1, column 21: unknown time unit 'dayz'" in errors
    assert "computed_traits[1].expression: line 1, column 1:" in errors
    assert "audiences[0]" not in errors.replace("like audiences[0]", "")


def test_check_config_counts_audiences_and_traits(tmp_path: Path) -> None:
    settings = personas_settings("sqlite:///unused.db", "http://x/a", "http://x/b")
    result = efd("check-config", "--config", str(write_config(tmp_path / "ok.toml", settings)))
    assert result.returncode == 0, result.stderr
    assert "1 audiences, 1 computed traits" in result.stdout


async def test_audiences_lists_counts_and_last_sync_and_previews_without_delivering(
    db_url: str, receiver_factory: ReceiverFactory, daemon_factory: DaemonFactory, tmp_path: Path
) -> None:
    hooks, crm = await receiver_factory(), await receiver_factory()
    settings = personas_settings(db_url, hooks.url, crm.url)
    # The daemon runs without the trait, so that no scheduled sync (the first comes a second
    # after start-up) can reach it before the listing: the command reads it as never synced.
    daemon = await daemon_factory({**settings, "computed_traits": []})
    batch = [
        identify("u1", plan="pro"),
        *orders("u1", 100, 200, 300),
        identify("u2", plan="pro"),
        *orders("u2", 100),
        identify("u3", plan="free"),
    ]
    assert daemon.port is not None
    assert (await post(daemon.port, "/v1/batch", {"batch": batch}))[0] == 200
    await daemon.sync(daemon.computation("High Value Customers"))
    config = str(write_config(tmp_path / "efd.toml", settings))

    listing = efd("audiences", "--config", config)
    assert listing.returncode == 0, listing.stderr
    audience = next(line for line in listing.stdout.splitlines() if "High Value Customers" in line)
    assert audience.split()[:2] == ["audience", "High"]
    assert "high_value_customers" in audience
    assert " 1 " in audience  # one member
    assert "never" not in audience
    assert "Z" in audience
    trait = next(line for line in listing.stdout.splitlines() if "total_revenue_180_days" in line)
    assert trait.split()[0] == "trait"
    assert " 0 " in trait
    assert "never" in trait

    sent = sql(db_url, "SELECT count(*) FROM messages WHERE source = 'personas'")
    by_name = efd("audiences", "--config", config, "--preview", "High Value Customers")
    assert by_name.returncode == 0, by_name.stderr
    assert "selects 1 of 3 user profiles" in by_name.stdout
    assert "0 would enter, 0 would leave" in by_name.stdout
    assert "  u1" in by_name.stdout

    raw = efd("audiences", "--config", config, "--preview", "trait('plan') = 'pro'")
    assert raw.returncode == 0, raw.stderr
    assert "selects 2 of 3 user profiles" in raw.stdout
    assert "  u1\n  u2\n" in raw.stdout

    expression = efd("audiences", "--config", config, "--preview", REVENUE, "--sample", "1")
    assert expression.returncode == 0, expression.stderr
    assert "has a value for 2 of 3 user profiles" in expression.stdout
    assert "  u1 = 600" in expression.stdout

    bad = efd("audiences", "--config", config, "--preview", "trait('plan') = ")
    assert bad.returncode == 2
    assert "line 1, column 17" in bad.stdout

    # Previews neither deliver nor store anything.
    assert sql(db_url, "SELECT count(*) FROM messages WHERE source = 'personas'") == sent
    assert sql(db_url, "SELECT count(*) FROM computed_values") == [(1,)]
