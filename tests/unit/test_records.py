"""The records' own rules: what a claim's unset bounds mean."""

from __future__ import annotations

import math

from efd.records import ClaimRequest


def test_a_claim_without_bounds_takes_what_is_due_now_and_leases_that_ended_by_now() -> None:
    request = ClaimRequest("d", 10, owner="A", now=100.0, lease_until=160.0)
    assert request.due == 100.0
    # A lease that ended exactly now has lapsed: just after now, not now itself.
    assert request.lapsed == math.nextafter(100.0, math.inf)
    assert request.lapsed > 100.0


def test_a_claim_keeps_the_bounds_it_is_given() -> None:
    request = ClaimRequest(
        "d", 1, owner="A", now=100.0, lease_until=160.0, due_by=math.inf, lapsed_before=90.0
    )
    assert (request.due, request.lapsed) == (math.inf, 90.0)
