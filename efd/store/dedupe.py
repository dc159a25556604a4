"""Deduplication: "a messageId repeated by the same source within 24 hours".

The key is a signed 64-bit hash of (source, messageId). Equal keys are only candidates: the
store compares the source and messageId themselves, so a hash collision can never drop a
message.

Where the keys are indexed depends on the database (the backend's `indexes_message_keys`):
PostgreSQL's is a table index, `ix_messages_message_key`, because several processes share
it; a single-process database keeps it in the writer connection's memory
(efd/store/backends/sqlite.py).
"""

from __future__ import annotations

from hashlib import blake2b

WINDOW_SECONDS = 24 * 3600


def message_key(source: str, message_id: str) -> int:
    # Any collision, of the hash or of the joined text, only makes a candidate that the
    # store's exact comparison then rejects.
    digest = blake2b(f"{source}\x00{message_id}".encode(), digest_size=8).digest()
    return int.from_bytes(digest, "big", signed=True)
