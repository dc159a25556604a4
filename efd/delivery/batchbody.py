"""A recorded batch's body read back (pure: no I/O): its elements' exact bytes, which a 413's
halves are cut from, and its first element's length, which `batch_signature = "first_event"`
signs. Read from the body itself, not from the members' payloads, which a deletion request
may have purged since the batch was formed (docs/actions.md#batches)."""

from __future__ import annotations

import json

_DECODER = json.JSONDecoder()


def elements(body: bytes) -> list[bytes] | None:
    """The body's elements, each its exact bytes; None when it is not a JSON array of values
    joined by single commas, as efd writes one (efd.delivery.batching.array)."""
    text = body.decode("utf-8", "surrogatepass")
    if len(text) < 2 or text[0] != "[" or text[-1] != "]":
        return None
    found: list[bytes] = []
    at, end = 1, len(text) - 1
    while at < end:
        try:
            _, stop = _DECODER.raw_decode(text, at)
        except ValueError:
            return None
        found.append(text[at:stop].encode("utf-8", "surrogatepass"))
        if stop < end and text[stop] != ",":
            return None
        at = stop + 1 if stop < end else stop
        if at == end and stop < end:
            return None  # a comma before the closing bracket
    return found


def first_event_length(body: bytes) -> int:
    """The byte length of the body's first element (all of the array's inside when it is not
    one efd wrote)."""
    found = elements(body)
    if not found:
        return max(len(body) - 2, 0)
    return len(found[0])
