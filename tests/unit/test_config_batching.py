"""efd.config for an action's batch keys (docs/actions.md#batches): accepted and checked,
every problem named by its full key path."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from efd import config
from efd.delivery import batching

SOURCE = '[[sources]]\nname = "web"\nwrite_key = "wk"\ndestinations = ["crm"]\n'
AT = "destinations[0].actions[0]"


@pytest.fixture(autouse=True)
def _no_efd_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    for key in list(os.environ):
        if key.startswith("EFD_"):
            monkeypatch.delenv(key)


def action(extra: str = "") -> str:
    return (
        '[[destinations]]\nname = "crm"\ntype = "actions"\n[[destinations.actions]]\n'
        'name = "bulk"\ntrigger = \'type = "track"\'\nurl = "https://crm.example.com/in"\n' + extra
    )


def load(tmp_path: Path, text: str) -> config.Settings:
    path = tmp_path / "efd.toml"
    path.write_text(SOURCE + text)
    return config.load(path)


def problems_of(tmp_path: Path, text: str) -> list[str]:
    with pytest.raises(config.ConfigError) as caught:
        load(tmp_path, text)
    return caught.value.problems


def test_an_action_without_batch_keys_sends_one_event_a_request(tmp_path: Path) -> None:
    [destination] = load(tmp_path, action()).destinations
    assert destination.actions[0].batch == batching.BatchPolicy()
    assert not destination.actions[0].batch.batched


def test_every_batch_key_is_accepted_with_batch_size_1(tmp_path: Path) -> None:
    text = action(
        "batch_size = 1\nbatch_max_bytes = 2048\nbatch_wait_seconds = 0.25\n"
        'batch_keys = ["headers", "url"]\nbatch_signature = "first_event"\n'
    )
    [destination] = load(tmp_path, text).destinations
    assert destination.actions[0].batch == batching.BatchPolicy(
        size=1, max_bytes=2048, wait_seconds=0.25, keys=("url", "headers"), signature="first_event"
    )


def test_batch_size_above_1_is_accepted(tmp_path: Path) -> None:
    [destination] = load(tmp_path, action("batch_size = 500\n")).destinations
    assert destination.actions[0].batch == batching.BatchPolicy(size=500)
    assert destination.actions[0].batch.batched


def test_every_bad_batch_key_is_named_by_its_full_path(tmp_path: Path) -> None:
    text = action(
        'batch_size = 0\nbatch_max_bytes = 512\nbatch_wait_seconds = 61\nbatch_keys = ["host",'
        ' "url", "url", 3]\nbatch_signature = "whole"\n'
    )
    assert problems_of(tmp_path, text) == [
        f"{AT}.batch_size: must be a whole number from 1 to 4000",
        f"{AT}.batch_max_bytes: must be a whole number of bytes from 1024 to 8388608 (8 MiB)",
        f"{AT}.batch_wait_seconds: must be a number of seconds from 0 to 60",
        f'{AT}.batch_keys[0]: "host" is not a batch key; the keys are "url", "method" and'
        ' "headers"',
        f'{AT}.batch_keys[2]: "url" is listed twice',
        f"{AT}.batch_keys[3]: must be a string",
        f'{AT}.batch_signature: must be "body" or "first_event"',
    ]


def test_batching_needs_a_json_body(tmp_path: Path) -> None:
    text = action('batch_size = 10\ncontent_type = "application/x-www-form-urlencoded"\n')
    assert problems_of(tmp_path, text) == [
        f'{AT}.batch_size: a batch is a JSON array, so content_type must be "application/json"'
        ' to batch (it is "application/x-www-form-urlencoded")'
    ]


def test_batch_problems_are_reported_beside_the_actions_other_problems(tmp_path: Path) -> None:
    # The action's own model fails on `method`, so its batch keys are checked on the raw file.
    problems = problems_of(tmp_path, action('method = 3\nbatch_keys = "url"\nbatch_size = 2\n'))
    assert problems == [
        f"{AT}.method: Input should be a valid string",
        f'{AT}.batch_keys: must be a list of "url", "method" and "headers"',
    ]
    assert f"{AT}.batch_size" in {
        p.split(": ", 1)[0] for p in problems_of(tmp_path, action("method = 3\nbatch_size = 0\n"))
    }


def test_a_boolean_is_not_a_batch_size(tmp_path: Path) -> None:
    assert problems_of(tmp_path, action("batch_size = true\n")) == [
        f"{AT}.batch_size: must be a whole number from 1 to 4000"
    ]
