"""efd's client error and the one place it becomes an HTTP answer (efd/http/responses.py)."""

from __future__ import annotations

import json

from efd.errors import ClientError, EfdError
from efd.http.responses import client_error


def test_client_error_json() -> None:
    error = ClientError("missing_field", "track needs event", field="event", index=3)
    assert error.as_json() == {
        "success": False,
        "code": "missing_field",
        "message": "track needs event",
        "field": "event",
        "index": 3,
    }
    assert ClientError("invalid_body", "nope").as_json() == {
        "success": False,
        "code": "invalid_body",
        "message": "nope",
    }
    assert ClientError("x", "y", index=0).as_json()["index"] == 0  # index 0 is not dropped
    assert ClientError("x", "y").status == 400
    assert ClientError("unauthorized", "y", status=401).status == 401
    assert str(ClientError("x", "the message")) == "the message"
    assert isinstance(ClientError("x", "y"), EfdError)


def test_rendered_with_its_status_and_body_in_field_order() -> None:
    error = ClientError("unknown_destination", "no destination named 'x'", field="d", status=404)
    response = client_error(error)
    assert response.status == 404
    assert response.content_type == "application/json"
    assert isinstance(response.body, bytes)
    # The bytes clients have always seen: json.dumps of the keys in this order.
    assert response.body == (
        b'{"success": false, "code": "unknown_destination", '
        b'"message": "no destination named \'x\'", "field": "d"}'
    )
    assert json.loads(response.body) == error.as_json()
    assert "WWW-Authenticate" not in response.headers


def test_a_challenge_becomes_www_authenticate() -> None:
    bearer = client_error(ClientError("unauthorized", "a token", status=401, challenge="Bearer"))
    assert bearer.status == 401
    assert bearer.headers["WWW-Authenticate"] == "Bearer"
    # Ingestion's 401 (HTTP Basic with the write key) has never named a scheme.
    basic = client_error(ClientError("unauthorized", "unknown write key", status=401))
    assert "WWW-Authenticate" not in basic.headers
