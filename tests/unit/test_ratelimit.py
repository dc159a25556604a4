"""efd.delivery.ratelimit: which buckets a destination's rounds take from, and when a held-back
destination is claimed for again (pure)."""

from __future__ import annotations

import pytest

from efd.delivery.ratelimit import QUANTUM, Bucket, bucket_key, buckets, next_claim_in


def test_only_limited_hooks_have_buckets_keyed_without_their_url() -> None:
    found = buckets(
        "crm",
        [("https://user:pw@a.example/h?k=secret", (50.0, 50.0)), ("https://b.example/h", None)],
    )
    [bucket] = found
    assert (bucket.rate, bucket.burst) == (50.0, 50.0)
    assert "secret" not in bucket.key
    assert "a.example" not in bucket.key
    assert len(bucket.key) <= 64  # hook_tokens.key


def test_a_bucket_belongs_to_one_destination_and_one_url() -> None:
    assert bucket_key("crm", "https://a.example/h") == bucket_key("crm", "https://a.example/h")
    assert bucket_key("crm", "https://a.example/h") != bucket_key("other", "https://a.example/h")
    assert bucket_key("crm", "https://a.example/h") != bucket_key("crm", "https://a.example/i")


@pytest.mark.parametrize(
    ("rate", "burst", "left", "expected"),
    [
        (50.0, 50.0, 0.0, 50.0 * QUANTUM / 50.0),  # a quantum's worth: 2.5 tokens
        (2.0, 2.0, 0.0, 0.5),  # at least one token
        (2.0, 2.0, 0.5, 0.25),  # half a token kept: half the wait
        (100.0, 1.0, 0.0, 0.01),  # never more than the burst
        (10.0, 10.0, 5.0, 0.0),  # enough already
    ],
)
def test_a_held_back_destination_waits_for_a_quantum_of_tokens(
    rate: float, burst: float, left: float, expected: float
) -> None:
    bucket = Bucket("k", rate, burst, "https://a.example/h")
    assert next_claim_in([bucket], left) == pytest.approx(expected)


def test_the_slowest_bucket_sets_the_wait() -> None:
    fast = Bucket("a", 100.0, 100.0, "https://a.example/h")
    slow = Bucket("b", 1.0, 1.0, "https://b.example/h")
    assert next_claim_in([fast, slow], 0.0) == pytest.approx(1.0)


@pytest.mark.parametrize(
    ("rate", "burst", "reserve"),
    [
        (50.0, 50.0, 5.0),  # a tenth of a second's worth
        (50.0, 3.0, 2.0),  # never the whole burst: one request can always go
        (0.5, 1.0, 0.0),
    ],
)
def test_a_bucket_keeps_a_reserve_for_the_network_within_its_burst(
    rate: float, burst: float, reserve: float
) -> None:
    [bucket] = buckets("crm", [("https://a.example/h", (rate, burst))])
    assert bucket.reserve == pytest.approx(reserve)
    assert bucket.row[:3] == (bucket.key, rate, burst)
    assert bucket.row[3] == pytest.approx(reserve)
