"""efd.operations.events: the events' messages byte by byte, and the bounds (crossings, the
per-minute cap and its summary) as a state machine handed the time."""

from __future__ import annotations

import textwrap
from pathlib import Path

import pytest

from efd import __version__, config
from efd.operations import events
from efd.operations.events import Crossings, Event, Gate

T0 = 1_800_000_000.0  # on a minute's boundary: 30000000 minutes


def failing(hook: str = "http://127.0.0.1:1/hook", at: float = T0, dest: str = "crm") -> Event:
    return events.hook_failing(
        dest, hook, failures=10, probe_seconds=30, status_code=503, error="down", at=at
    )


def test_a_failing_hook_is_a_track_message_to_the_operations_destination_only() -> None:
    event = failing()
    row = events.message(event, "ops", T0 + 1)
    assert row.source == "efd"
    assert row.type == "track"
    assert row.user_id == "efd"
    assert row.event == "hook.failing"
    assert row.destinations == ("ops",)
    assert row.message_id == event.message_id
    assert row.timestamp == T0
    assert row.received_at == T0 + 1
    assert row.body == (
        '{"version":1,"type":"track","userId":"efd","event":"hook.failing","properties":'
        '{"destination":"crm","hook":"http://127.0.0.1:1/hook","failures":10,"probeSeconds":30,'
        '"lastAnswer":{"statusCode":503,"error":"down"}},"context":{"library":{"name":"efd",'
        f'"version":"{__version__}"}}}},"messageId":"{event.message_id}",'
        '"timestamp":"2027-01-15T08:00:00.000Z"}'
    )


def test_message_ids_are_deterministic_per_occurrence() -> None:
    assert failing().message_id == failing().message_id
    assert failing().message_id != failing(at=T0 + 0.001).message_id
    assert failing().message_id != failing(hook="http://127.0.0.1:2/hook").message_id
    assert failing().message_id != failing(dest="other").message_id
    recovered = events.hook_recovered("crm", "http://127.0.0.1:1/hook", at=T0)
    assert recovered.message_id != failing().message_id


def test_an_exhausted_delivery_names_the_message_and_the_last_answer_never_the_payload() -> None:
    event = events.delivery_exhausted(
        "crm",
        source="web",
        message_id="m-1",
        delivery_id=42,
        status="failed",
        attempts=1,
        first_attempt_at=T0,
        hook="http://127.0.0.1:1/hook",
        status_code=422,
        error="x" * 500,
        at=T0 + 2,
    )
    assert dict(event.properties) == {
        "destination": "crm",
        "source": "web",
        "messageId": "m-1",
        "deliveryId": 42,
        "status": "failed",
        "attempts": 1,
        "firstAttemptAt": "2027-01-15T08:00:00.000Z",
        "lastAnswer": {
            "hook": "http://127.0.0.1:1/hook",
            "statusCode": 422,
            "error": "x" * (events.MAX_TEXT - 1) + "…",
        },
    }
    assert event.subject == ("42",)


def test_pause_resume_and_disable_events() -> None:
    paused = events.hook_paused("crm", None, reason="upgrade", since=T0, by="admin API", at=T0)
    assert dict(paused.properties) == {
        "destination": "crm",
        "hook": None,
        "reason": "upgrade",
        "since": "2027-01-15T08:00:00.000Z",
        "by": "admin API",
    }
    resumed = events.hook_resumed(
        "crm", 2, was="disabled", since=T0, due=7, by="command line", at=T0 + 90.5
    )
    assert dict(resumed.properties) == {
        "destination": "crm",
        "hook": 2,
        "was": "disabled",
        "heldSeconds": 90.5,
        "due": 7,
        "by": "command line",
    }
    disabled = events.hook_disabled("crm", 1, reason="failing since …", at=T0)
    assert disabled.name == "hook.disabled"
    assert disabled.properties["hook"] == 1


def test_events_about_the_operations_destination_are_recognised() -> None:
    assert events.about_operations(failing(dest="ops"), "ops")
    assert events.about_operations(failing(dest="ops/alert"), "ops")  # one of its actions
    assert not events.about_operations(failing(dest="ops2"), "ops")
    assert not events.about_operations(failing(dest="crm"), "ops")


def test_a_hook_is_told_failing_once_per_crossing_and_recovered_with_how_long() -> None:
    gate = Gate(100)
    assert gate.admit(failing(), T0) == [failing()]
    assert gate.admit(failing(at=T0 + 1), T0 + 1) == []  # still failing: not again
    late = events.hook_recovered("crm", "http://127.0.0.1:2/hook", at=T0 + 2)
    assert gate.admit(late, T0 + 2) == []  # never told failing: nothing to recover from
    recovered = events.hook_recovered("crm", "http://127.0.0.1:1/hook", at=T0 + 12.25)
    [sent] = gate.admit(recovered, T0 + 12.25)
    assert sent.properties["failingSeconds"] == 12.25
    assert gate.admit(recovered, T0 + 13) == []  # recovered already
    assert gate.admit(failing(at=T0 + 20), T0 + 20) == [failing(at=T0 + 20)]  # a new crossing


def exhausted(n: int, at: float) -> Event:
    return events.delivery_exhausted(
        "crm",
        source="web",
        message_id=f"m-{n}",
        delivery_id=n,
        status="failed",
        attempts=1,
        first_attempt_at=at,
        hook=None,
        status_code=400,
        error=None,
        at=at,
    )


def test_a_flood_is_capped_per_minute_and_summarised_once_the_minute_ends() -> None:
    gate = Gate(3)
    sent = [e for n in range(10) for e in gate.admit(exhausted(n, T0 + n), T0 + n)]
    assert [e.properties["messageId"] for e in sent] == ["m-0", "m-1", "m-2"]
    assert gate.dropped_total == 7
    assert gate.flush(T0 + 59.9) == []
    assert gate.flush_due() == T0 + 60
    gate.admit(failing(at=T0 + 30), T0 + 30)  # dropped too, and its crossing remembered
    assert gate.dropped_total == 8
    [summary] = gate.flush(T0 + 61)
    assert summary.name == events.DROPPED
    assert summary.destination is None
    assert dict(summary.properties) == {
        "dropped": 8,
        "events": {"delivery.exhausted": 7, "hook.failing": 1},
        "from": "2027-01-15T08:00:03.000Z",
        "to": "2027-01-15T08:01:01.000Z",
        "maxEventsPerMinute": 3,
    }
    assert gate.flush(T0 + 62) == []
    assert gate.flush_due() is None
    # The new minute has its own allowance.
    assert len([e for n in range(10, 15) for e in gate.admit(exhausted(n, T0 + 62), T0 + 62)]) == 3


def test_the_summary_comes_before_the_first_event_of_a_new_minute() -> None:
    gate = Gate(1)
    gate.admit(exhausted(1, T0), T0)
    assert gate.admit(exhausted(2, T0 + 1), T0 + 1) == []
    out = gate.admit(exhausted(3, T0 + 60), T0 + 60)
    assert [e.name for e in out] == [events.DROPPED, events.DELIVERY_EXHAUSTED]
    assert out[0].properties["dropped"] == 1


def test_crossings_tell_a_level_once_until_it_falls_again() -> None:
    crossings = Crossings()
    assert crossings.rose(("crm",), True)
    assert not crossings.rose(("crm",), True)
    assert not crossings.rose(("crm",), False)
    assert crossings.rose(("crm",), True)
    crossings.keep(set())
    assert crossings.rose(("crm",), True)
    assert events.backlog_is_high(10, None, backlog_high=10, oldest_high_seconds=60)
    assert not events.backlog_is_high(9, 59.9, backlog_high=10, oldest_high_seconds=60)
    assert events.backlog_is_high(1, 60, backlog_high=10, oldest_high_seconds=60)


def test_log_line() -> None:
    assert events.log_line(failing()) == (
        'operational event hook.failing about crm: {"destination":"crm",'
        '"hook":"http://127.0.0.1:1/hook","failures":10,"probeSeconds":30,'
        '"lastAnswer":{"statusCode":503,"error":"down"}}'
    )


# -- configuration ---------------------------------------------------------------------------


BASE = textwrap.dedent(
    """\
    [storage]
    url = "sqlite:///tmp/efd.db"

    [[sources]]
    name = "{source}"
    write_key = "wk_live_123"
    destinations = ["crm"]

    [[destinations]]
    name = "crm"
    [[destinations.hooks]]
    url = "https://hooks.example.com/segment"

    [operations]
    {operations}
    """
)


def load(tmp_path: Path, operations: str, source: str = "web") -> config.Settings:
    path = tmp_path / "efd.toml"
    path.write_text(BASE.format(source=source, operations=operations))
    return config.load(path)


def test_operations_config_defaults(tmp_path: Path) -> None:
    settings = load(tmp_path, 'destination = "crm"')
    operations = settings.operations
    assert operations is not None
    assert operations.destination == "crm"
    assert operations.backlog_high == 10000
    assert operations.oldest_pending_high_seconds == 3600
    assert operations.lane_blocked_seconds == 600
    assert operations.max_events_per_minute == 60


def test_operations_config_errors_are_named(tmp_path: Path) -> None:
    with pytest.raises(config.ConfigError) as caught:
        load(tmp_path, 'destination = "nope"', source="efd")
    assert caught.value.problems == [
        "operations.destination: no destination named 'nope'",
        "sources[0].name: 'efd' is reserved for efd's operational events while [operations] "
        "is configured",
    ]
    with pytest.raises(config.ConfigError) as caught:
        load(
            tmp_path,
            'destination = "crm"\nbacklog_high = 0\nlane_blocked_seconds = -1\n'
            "max_events_per_minute = 0\nsurprise = 1",
        )
    assert sorted(p.split(": ")[0] for p in caught.value.problems) == [
        "operations.backlog_high",
        "operations.lane_blocked_seconds",
        "operations.max_events_per_minute",
        "operations.surprise",
    ]


def test_the_commented_example_in_config_example_toml_loads(tmp_path: Path) -> None:
    text = (Path(__file__).resolve().parents[2] / "config.example.toml").read_text()
    start = text.index("## efd's own events")
    block = "\n".join(
        line.removeprefix("#").removeprefix(" ") for line in text[start:].splitlines()
    )
    path = tmp_path / "efd.toml"
    path.write_text('[storage]\nurl = "sqlite:///tmp/efd.db"\n' + block)
    settings = config.load(path)
    assert settings.operations is not None
    assert settings.operations.destination == "ops"
    assert settings.destination("ops").hooks[0].url == "http://127.0.0.1:9000/ops"
