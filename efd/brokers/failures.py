"""What a publish that did not succeed raises, and its error classes (pure: no I/O).

The error classes are the attempts table's (docs/delivery.md), with two of the brokers' own:
`refused` (the broker answered and did not take the message: unroutable, no stream for the
subject, a negative acknowledgement or reason code, an error reply) and `auth` (the broker
refused the credentials). Both are retried, as efd/delivery/retry.py's classify_error retries
every class but the final ones (`blocked`, `tls`, `invalid_url`, `invalid_request`).
"""

from __future__ import annotations

from typing import Final

from efd.segment.webhooks import scrub

REFUSED: Final = "refused"
AUTH: Final = "auth"
TIMEOUT: Final = "timeout"
CONNECT: Final = "connect"
RESET: Final = "reset"
DNS: Final = "dns"
BLOCKED: Final = "blocked"
TLS: Final = "tls"
PROTOCOL: Final = "protocol"
INVALID_REQUEST: Final = "invalid_request"


class PublishFailed(Exception):
    """The broker did not confirm the message; `error_class` as in the attempts table,
    `reason` what happened, holding no credentials."""

    def __init__(self, error_class: str, reason: str) -> None:
        super().__init__(f"{error_class}: {reason}")
        self.error_class = error_class
        self.reason = reason


def failed(error_class: str, reason: object, url: str) -> PublishFailed:
    """A PublishFailed whose reason, the text of a library's error about `url`, has `url`'s
    credentials and every URL in it redacted."""
    text = str(reason) or type(reason).__name__
    return PublishFailed(error_class, scrub(text, url))
