"""efd.observe.logs: every record is one line a client cannot break or colour, in text and JSON."""

from __future__ import annotations

import io
import json
import logging
from collections.abc import Iterator

import pytest

from efd.observe import logs

FORGED = "m-1\r\n2026-01-01 00:00:00,000 CRITICAL efd: forged\x1b[31m red\x1b[0m"


@pytest.fixture
def restored() -> Iterator[logging.Logger]:
    """A logger under efd's; the root logger's handlers and level restored afterwards."""
    root = logging.getLogger()
    saved = (root.handlers[:], root.level)
    yield logging.getLogger("efd.test")
    root.handlers[:], root.level = saved


def configure(fmt: str) -> io.StringIO:
    """logs.setup, its handler writing to a buffer instead of stderr."""
    logs.setup("INFO", fmt)
    out = io.StringIO()
    handler = logging.getLogger().handlers[0]
    assert isinstance(handler, logging.StreamHandler)
    handler.setStream(out)
    return out


@pytest.mark.parametrize(
    ("raw", "shown"),
    [
        ("plain text, ünïcode ✓", "plain text, ünïcode ✓"),
        ("a\r\nb\tc", "a\\r\\nb\\tc"),
        ("\x1b[31mred\x1b[0m", "\\x1b[31mred\\x1b[0m"),
        ("nul\x00 bel\x07 del\x7f", "nul\\x00 bel\\x07 del\\x7f"),
        ("c1 \x85 \x9b", "c1 \\x85 \\x9b"),
        ("line\u2028para\u2029", "line\\u2028para\\u2029"),
        ("bidi \u202e\u2066\u200f", "bidi \\u202e\\u2066\\u200f"),
        ("lone \udc80", "lone \\udc80"),
    ],
)
def test_escape(raw: str, shown: str) -> None:
    assert logs.escape(raw) == shown


def test_text_records_are_one_line_whatever_the_values(restored: logging.Logger) -> None:
    log = restored
    out = configure("text")
    log.warning("message %s failed: %s", FORGED, "answer\n\x1b]0;title\x07")
    lines = out.getvalue().splitlines()
    assert len(lines) == 1, lines
    assert "WARNING efd.test: message m-1\\r\\n2026-01-01 00:00:00,000 CRITICAL" in lines[0]
    assert "\\x1b[31m red\\x1b[0m failed: answer\\n\\x1b]0;title\\x07" in lines[0]


def test_a_traceback_follows_indented_and_escaped(restored: logging.Logger) -> None:
    log = restored
    out = configure("text")
    try:
        raise ValueError(FORGED)
    except ValueError:
        log.exception("a bug in efd")
    first, *rest = out.getvalue().splitlines()
    assert first.endswith("ERROR efd.test: a bug in efd")
    assert rest[0] == "    Traceback (most recent call last):"
    # The exception's text is the client's: its CR LF starts no line of its own.
    assert all(line.startswith("    ") for line in rest), rest
    assert not any("\x1b" in line or "\r" in line for line in rest)
    assert rest[-2:] == [
        "    ValueError: m-1",
        "    2026-01-01 00:00:00,000 CRITICAL efd: forged\\x1b[31m red\\x1b[0m",
    ]


def test_json_records_are_one_ascii_line(restored: logging.Logger) -> None:
    log = restored
    out = configure("json")
    try:
        raise ValueError(FORGED)
    except ValueError:
        log.exception("message %s: %s", FORGED, "\x85\u2028")
    text = out.getvalue()
    assert text.isascii()
    lines = text.splitlines()
    assert len(lines) == 1
    entry = json.loads(lines[0])
    assert entry["level"] == "ERROR"
    assert entry["message"] == f"message {FORGED}: \x85\u2028"
    assert entry["exception"].endswith(f"ValueError: {FORGED}")


@pytest.mark.parametrize("fmt", ["text", "json"])
def test_a_url_in_a_traceback_is_redacted(restored: logging.Logger, fmt: str) -> None:
    log = restored
    out = configure(fmt)
    try:
        raise ValueError("cannot send to URL('https://user:pa55@h.example/in?api_key=s3cret')")
    except ValueError:
        log.exception("sending to https://***@h.example/in?api_key=*** failed inside efd")
    text = out.getvalue()
    assert "pa55" not in text
    assert "s3cret" not in text
    assert "URL('https://***@h.example/in?api_key=***')" in text
