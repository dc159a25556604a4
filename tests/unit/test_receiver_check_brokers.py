"""`efd check-receiver` for a broker's URL: the kind a URL names, the --key options and the
one test message (efd/cli/receiver_check.py)."""

from __future__ import annotations

import json

import pytest

from efd.cli import receiver_check
from efd.segment import webhooks


@pytest.mark.parametrize(
    ("url", "kind"),
    [
        ("amqp://guest:guest@127.0.0.1:5672/", "amqp"),
        ("AMQPS://mq.internal/", "amqp"),
        ("nats://127.0.0.1:4222", "nats"),
        ("tls://127.0.0.1:4222", "nats"),
        ("redis://127.0.0.1/0", "redis_streams"),
        ("rediss://127.0.0.1/0", "redis_streams"),
        ("mqtt://127.0.0.1", "mqtt"),
        ("mqtts://127.0.0.1", "mqtt"),
        ("https://example.com/hook", None),
        ("kafka://127.0.0.1", None),
        ("not a url", None),
    ],
)
def test_broker_kind(url: str, kind: str | None) -> None:
    assert receiver_check.broker_kind(url) == kind


def test_broker_keys() -> None:
    assert receiver_check.broker_keys(["routing_key=efd.a=b", "qos=2", "maxlen=10"]) == {
        "routing_key": "efd.a=b",
        "qos": 2,
        "maxlen": 10,
    }
    with pytest.raises(ValueError, match="write it as NAME=VALUE"):
        receiver_check.broker_keys(["routing_key"])
    with pytest.raises(ValueError, match="--key qos: must be a whole number"):
        receiver_check.broker_keys(["qos=one"])


def test_broker_message_is_signed_as_a_destination_signs() -> None:
    key = webhooks.standard_secret("whsec_" + "MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw")
    request = receiver_check.broker_message(
        ["s3cret", "old"], [key], now=1_700_000_000, run="r1", user_agent="efd/1.0"
    )
    headers = request.headers
    assert webhooks.verify("s3cret", request.body, headers["X-Signature"])
    assert headers["webhook-timestamp"] == "1700000000"
    assert headers["webhook-signature"].startswith("v1,")
    assert json.loads(request.body)["properties"] == {"case": "broker"}
    unsigned = receiver_check.broker_message([], [], now=1, run="r1", user_agent="efd/1.0")
    assert "X-Signature" not in unsigned.headers
