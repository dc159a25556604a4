"""The messages the load generator sends and the webhook body efd makes of them."""

from __future__ import annotations

import base64
import json
import os

WRITE_KEY = "wk_bench"
SECRET = "bench-secret"
AUTH = "Basic " + base64.b64encode(f"{WRITE_KEY}:".encode()).decode()


_MSG = (
    '{"type":"track","userId":"user-%d","event":"Order Completed",'
    '"properties":{"orderId":"o-%d","plan":"pro","amount":42.5,"currency":"EUR",'
    '"items":3,"coupon":"SPRING"},'
    '"context":{"library":{"name":"efd-bench","version":"1.0"}},'
    '"messageId":"%s"}'
)


def message_ids(prefix: str, n: int) -> list[str]:
    """n random messageIds (UUID-like randomness, as Segment libraries send)."""
    raw = os.urandom(16 * n).hex()
    return [f"{prefix}-{raw[i * 32 : i * 32 + 32]}" for i in range(n)]


def batch_body(prefix: str, n: int, seq: int) -> tuple[bytes, list[str]]:
    ids = message_ids(prefix, n)
    msgs = ",".join(_MSG % (seq + i, seq + i, mid) for i, mid in enumerate(ids))
    return ('{"batch":[' + msgs + "]}").encode(), ids


def single_body(prefix: str, seq: int) -> tuple[bytes, list[str]]:
    ids = message_ids(prefix, 1)
    return (_MSG % (seq, seq, ids[0])).encode(), ids


def sample_webhook_body() -> bytes:
    """A webhook body of the size efd sends for the generator's messages."""
    body = {
        "version": 1,
        "type": "track",
        "userId": "user-1",
        "event": "Order Completed",
        "properties": {
            "orderId": "o-1",
            "plan": "pro",
            "amount": 42.5,
            "currency": "EUR",
            "items": 3,
            "coupon": "SPRING",
        },
        "context": {"library": {"name": "efd-bench", "version": "1.0"}},
        "messageId": "bare-" + "0" * 32,
        "timestamp": "2025-01-01T00:00:00.000Z",
    }
    return json.dumps(body, separators=(",", ":")).encode()


# The actions phase's mapping: ten fields of the generator's messages, in the directives a
# Segment Webhooks (Actions) user writes most (paths, a case change, a condition, a
# template). Its messageId is the receiver's key for each event, as in the webhook body.
ACTION_DATA = {
    "messageId": {"@path": "$.messageId"},
    "userId": {"@path": "$.userId"},
    "event": {"@path": "$.event"},
    "order_id": {"@path": "$.properties.orderId"},
    "plan": {"@case": {"operator": "upper", "value": {"@path": "$.properties.plan"}}},
    "amount": {"@path": "$.properties.amount"},
    "currency": {"@path": "$.properties.currency"},
    "items": {"@path": "$.properties.items"},
    "coupon": {
        "@if": {
            "exists": {"@path": "$.properties.coupon"},
            "then": {"@path": "$.properties.coupon"},
            "else": None,
        }
    },
    "summary": {"@template": "{{userId}} ordered {{properties.items}} items"},
}


def action_destination(hook_url: str) -> list[str]:
    """The configuration lines of an Actions destination with one action, ACTION_DATA's."""
    return [
        'type = "actions"',
        "[[destinations.actions]]",
        'name = "orders"',
        'trigger = \'type = "track" and event = "Order Completed"\'',
        f'url = "{hook_url}"',
        f"data = '''{json.dumps(ACTION_DATA, separators=(',', ':'))}'''",
    ]
