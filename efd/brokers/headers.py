"""A webhook's headers in each broker's own header mechanism (pure: no I/O).

The caller gives the headers a webhook of the destination would carry (Content-Type,
webhook-id, the timestamps and signatures, a hook's static headers: efd/segment/webhooks.py's
`request_headers`). Header names ignore case in HTTP and not in a broker, so every name is
written in lower case: a consumer looks up `webhook-id` and `x-signature` whatever a
configuration wrote. docs/brokers.md#headers.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Final

from efd.segment.webhooks import WEBHOOK_ID

CONTENT_TYPE: Final = "content-type"
NATS_MSG_ID: Final = "Nats-Msg-Id"  # JetStream's deduplication key, spelled as NATS does
REDIS_BODY: Final = "body"  # the stream entry's field that holds the body


class HeaderError(ValueError):
    """A header that the broker's mechanism cannot carry."""


def _folded(headers: Mapping[str, str]) -> dict[str, str]:
    folded: dict[str, str] = {}
    for name, value in headers.items():
        lower = name.lower()
        if lower in folded:
            raise HeaderError(f"two headers named {lower} (names ignore case)")
        folded[lower] = value
    return folded


def reserved_names(kind: str) -> frozenset[str]:
    """Header names (lower case) that a hook of `kind` may not set: the ones its broker's
    mechanism spends on something else, beside webhooks' own reserved headers."""
    if kind == "nats":
        return frozenset({NATS_MSG_ID.lower()})
    if kind == "redis_streams":
        return frozenset({REDIS_BODY})
    return frozenset()


@dataclass(frozen=True, slots=True)
class AmqpProperties:
    """The basic properties of an AMQP message: Content-Type as `content_type`, webhook-id as
    `message_id` too, and every other header in the headers table."""

    content_type: str | None
    message_id: str | None
    headers: dict[str, str]


def amqp(headers: Mapping[str, str]) -> AmqpProperties:
    folded = _folded(headers)
    content_type = folded.pop(CONTENT_TYPE, None)
    return AmqpProperties(content_type, folded.get(WEBHOOK_ID), folded)


def nats(headers: Mapping[str, str]) -> dict[str, str]:
    """NATS headers: every header, and `Nats-Msg-Id` holding the webhook-id, so JetStream's
    duplicate window drops a resend of the same message."""
    folded = _folded(headers)
    for name, value in folded.items():
        if "\r" in value or "\n" in value or "\r" in name or "\n" in name or ":" in name:
            raise HeaderError(f"the header {name} cannot be written as a NATS header")
    if NATS_MSG_ID.lower() in folded:
        raise HeaderError(f"{NATS_MSG_ID} is efd's (the webhook-id)")
    webhook_id = folded.get(WEBHOOK_ID)
    if webhook_id:
        folded[NATS_MSG_ID] = webhook_id
    return folded


def redis_fields(body: bytes, headers: Mapping[str, str]) -> dict[bytes, bytes]:
    """The fields of one XADD entry, in order: `body`, then one field per header."""
    folded = _folded(headers)
    if REDIS_BODY in folded:
        raise HeaderError(f"a header named {REDIS_BODY} would hide the body's field")
    fields = {REDIS_BODY.encode(): body}
    for name, value in folded.items():
        fields[name.encode("utf-8")] = value.encode("utf-8")
    return fields


@dataclass(frozen=True, slots=True)
class MqttProperties:
    """An MQTT 5 PUBLISH's properties: Content-Type as its content type, every other header
    as a user property, in order."""

    content_type: str | None
    user_properties: tuple[tuple[str, str], ...]


def mqtt(headers: Mapping[str, str]) -> MqttProperties:
    folded = _folded(headers)
    content_type = folded.pop(CONTENT_TYPE, None)
    for name, value in folded.items():
        if "\x00" in name or "\x00" in value:
            raise HeaderError(f"the header {name} holds NUL, which MQTT's strings may not")
    return MqttProperties(content_type, tuple(folded.items()))
