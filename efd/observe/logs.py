"""Logging set-up: one line per event, text or JSON, to stderr (journald keeps it).

Values from outside (messageIds, receivers' answers, paths, header values) reach log
messages as they came, so the text format escapes, in the whole line, every character that
could end it or change how a terminal shows it: C0 and C1 controls, DEL, Unicode's line and
paragraph separators, bidirectional overrides, and unpaired surrogates. `\\n`, `\\r` and `\\t`
are written so, the others as `\\xNN` or `\\uNNNN`. A traceback (of a bug in efd) follows its
record on lines that each begin with four spaces, escaped alike, so no line a client
controls can pass for a record of its own; any URL in it is redacted (a hook's credentials
could be in an exception's text). The JSON format writes one object per line.
"""

from __future__ import annotations

import json
import logging
import re
import sys
from datetime import UTC, datetime
from types import TracebackType

from efd.segment.webhooks import redact_urls

_UNSAFE = re.compile(
    "[\x00-\x1f\x7f-\x9f\u061c\u200e\u200f\u2028\u2029\u202a-\u202e\u2066-\u2069\ud800-\udfff]"
)
_NAMED = {"\n": "\\n", "\r": "\\r", "\t": "\\t"}
_CONTINUATION = "\n    "


def _escaped(match: re.Match[str]) -> str:
    char = match.group()
    named = _NAMED.get(char)
    if named is not None:
        return named
    code = ord(char)
    return f"\\x{code:02x}" if code < 0x100 else f"\\u{code:04x}"


def _traceback(
    formatter: logging.Formatter,
    exc_info: tuple[type[BaseException], BaseException, TracebackType | None]
    | tuple[None, None, None],
) -> str:
    return redact_urls(formatter.formatException(exc_info))


def escape(text: str) -> str:
    """`text` on one line, with nothing in it a terminal would act on."""
    if _UNSAFE.search(text) is None:
        return text
    return _UNSAFE.sub(_escaped, text)


class TextFormatter(logging.Formatter):
    """`time LEVEL logger: message`, escaped into one line; a traceback indented below."""

    def __init__(self) -> None:
        super().__init__("%(asctime)s %(levelname)s %(name)s: %(message)s")

    def format(self, record: logging.LogRecord) -> str:
        record.message = record.getMessage()
        record.asctime = self.formatTime(record, self.datefmt)
        line = escape(self.formatMessage(record))
        details = []
        if record.exc_info:
            details.append(_traceback(self, record.exc_info))
        elif record.exc_text:
            details.append(redact_urls(record.exc_text))
        if record.stack_info:
            details.append(self.formatStack(record.stack_info))
        for detail in details:
            line += "".join(_CONTINUATION + escape(part) for part in detail.splitlines())
        return line


class JsonFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        entry = {
            "time": datetime.fromtimestamp(record.created, UTC).isoformat(timespec="milliseconds"),
            "level": record.levelname,
            "logger": record.name,
            "message": record.getMessage(),
        }
        if record.exc_info:
            entry["exception"] = _traceback(self, record.exc_info)
        # ASCII with every control character escaped: one line, whatever the values hold.
        return json.dumps(entry, ensure_ascii=True)


def setup(level: str = "INFO", fmt: str = "text") -> None:
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(JsonFormatter() if fmt == "json" else TextFormatter())
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level)
    # Their INFO lines describe internals, not what efd did.
    for noisy in ("alembic", "apscheduler", "aiohttp.access"):
        logging.getLogger(noisy).setLevel(logging.WARNING)
