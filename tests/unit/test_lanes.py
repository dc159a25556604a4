"""efd.delivery.lanes: which lane a message joins on an ordered destination."""

from __future__ import annotations

import pytest

from efd.delivery.lanes import Ordering, lane_for, lane_key, waiting_note


@pytest.mark.parametrize(
    ("user_id", "anonymous_id", "lane"),
    [
        ("u1", "a1", "u1"),  # the userId wins over the anonymousId
        ("u1", None, "u1"),
        (None, "a1", "a1"),
        ("", "a1", ""),  # an empty userId is still an id (validation refuses it anyway)
        (None, None, None),  # no id: no lane
    ],
)
def test_the_lane_is_the_user_id_else_the_anonymous_id(
    user_id: str | None, anonymous_id: str | None, lane: str | None
) -> None:
    assert lane_key(user_id, anonymous_id) == lane


def test_an_alias_joins_the_lane_of_its_new_user_id() -> None:
    # The stored alias carries userId (the new id) and previousId in its body; the lane is
    # read from userId, so the alias goes in order with what the user does from now on.
    assert lane_key("new-user", None) == "new-user"


def test_a_user_and_their_anonymous_past_are_different_lanes() -> None:
    before = lane_key(None, "anon-1")
    after = lane_key("user-1", "anon-1")
    assert before != after


def test_only_per_user_ordering_gives_lanes() -> None:
    assert lane_for(Ordering.PER_USER, "u1", "a1") == "u1"
    assert lane_for("per_user", None, "a1") == "a1"
    assert lane_for(Ordering.NONE, "u1", "a1") is None
    assert lane_for("none", "u1", None) is None


def test_the_waiting_note_names_the_head() -> None:
    assert "m-17" in waiting_note("m-17")
    assert "m-17" not in waiting_note(None)
