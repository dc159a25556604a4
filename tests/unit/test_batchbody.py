"""efd.delivery.batchbody: a batch's body read back into its elements' exact bytes."""

from __future__ import annotations

import pytest

from efd.delivery import batchbody, batching


@pytest.mark.parametrize(
    "bodies",
    [
        [b"1"],
        [b'{"a":"x,]"}', b"2", b'"s"', b"[1,2]"],
        ['{"name":"Zoë","emoji":"\U0001f600"}'.encode(), b"null"],
        [b'"\\u00e9\\"]"', b"{}"],
    ],
)
def test_the_elements_are_the_bytes_the_array_was_made_of(bodies: list[bytes]) -> None:
    body = batching.array(bodies)
    assert batchbody.elements(body) == bodies
    assert batchbody.first_event_length(body) == len(bodies[0])


@pytest.mark.parametrize(
    "body", [b"", b"[", b"]", b"[1,", b"[1,]", b"[1 2]", b"[1,,2]", b"{}", b"[nope]"]
)
def test_a_body_efd_did_not_write_has_no_elements(body: bytes) -> None:
    assert batchbody.elements(body) is None


def test_the_empty_array_has_none() -> None:
    assert batchbody.elements(b"[]") == []
    assert batchbody.first_event_length(b"[]") == 0


def test_an_unreadable_body_is_signed_whole_inside_its_brackets() -> None:
    assert batchbody.first_event_length(b"[1 2]") == 3
