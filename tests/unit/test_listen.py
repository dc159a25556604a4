"""efd listen's Standard Webhooks check agrees with what efd sends and with the published
verifiers: the signature over "{id}.{timestamp}.{body}", an ASCII id, a 5-minute tolerance."""

from __future__ import annotations

import base64
import time

from standardwebhooks.webhooks import Webhook

from efd.cli.listen import verify_standard
from efd.segment import webhooks

SECRET = "whsec_" + base64.b64encode(b"k" * 32).decode()
KEYS = [webhooks.standard_secret(SECRET)]
BODY = b'{"type":"track","messageId":"zo\xc3\xab"}'


def headers(webhook_id: str, when: int) -> dict[str, str]:
    return webhooks.request_headers(
        user_agent="efd/1.0",
        secret=None,
        body=BODY,
        static={},
        webhook_id=webhook_id,
        timestamp=when,
        standard_secrets=KEYS,
    )


def test_what_efd_sends_verifies_in_listen_and_in_the_library() -> None:
    now = int(time.time())
    sent = headers(webhooks.webhook_id(1, "web", "zoë", now - 1.5), now)
    assert verify_standard(KEYS, BODY, sent, now) is None
    Webhook(SECRET).verify(BODY, sent)


def test_a_changed_body_or_a_stale_time_is_invalid() -> None:
    now = int(time.time())
    sent = headers("msg_abc", now)
    assert verify_standard(KEYS, BODY + b" ", sent, now) == "INVALID"
    assert verify_standard(KEYS, BODY, sent, now + 301) is not None


def test_a_non_ascii_webhook_id_is_invalid_as_node_would_find_it() -> None:
    now = int(time.time())
    # Signed over its UTF-8 bytes, as a sender that wrote the id raw would: the signature
    # matches here, but a Node receiver reads other characters from the same bytes.
    sent = headers("zoë", now)
    assert verify_standard(KEYS, BODY, sent, now) == "INVALID webhook-id (not printable ASCII)"


def test_what_listen_accepts_and_refuses() -> None:
    from efd.cli.listen import verify

    now = int(time.time())
    signed = headers("msg_abc", now)
    x_signature = {"X-Signature": webhooks.sign("s", BODY)}
    wrong = {"X-Signature": webhooks.sign("other", BODY)}

    def refused(sent: dict[str, str], secrets: list[str], keys: list[bytes]) -> str | None:
        return verify(BODY, sent, secrets, keys, now).refused

    assert refused(signed, [], []) is None  # nothing to verify with: everything is shown
    assert refused(x_signature, ["old", "s"], []) is None  # any secret of a rotation
    assert refused({**signed, **x_signature}, ["s"], KEYS) is None
    assert refused(signed, ["s"], KEYS) is None  # a signature it holds a secret for verifies
    assert refused(x_signature, ["s"], KEYS) is None
    assert refused({**signed, **wrong}, ["s"], KEYS) == "X-Signature INVALID"
    assert refused(wrong, ["s"], []) == "X-Signature INVALID"
    assert refused({}, ["s"], KEYS) == "X-Signature MISSING and webhook-signature MISSING headers"
    assert refused(headers("msg_abc", now - 301), [], KEYS) == (
        "webhook-signature INVALID timestamp (more than 5 minutes off)"
    )
    assert refused({"x-signature": webhooks.sign("s", BODY)}, ["s"], []) is None  # any case
