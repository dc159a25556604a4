"""efd.delivery.batching: an action's batch keys, the batches waiting events form, a batch's
body and signed bytes, its webhook-id, and the halves of a 413. Bodies and sizes are checked
byte for byte."""

from __future__ import annotations

import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from efd.delivery.batching import (
    BODY,
    FIRST_EVENT,
    MAX_BYTES_DEFAULT,
    Batch,
    BatchKey,
    BatchPolicy,
    BatchPolicyError,
    Candidate,
    array,
    array_size,
    batch_key,
    form,
    policy,
    policy_problems,
    signed_bytes,
    split,
    webhook_id,
)

URL = "https://bulk.example/in"
KEY = batch_key(("url", "method", "headers"), URL, "POST", (("X-Source", "efd"),))
OTHER = batch_key(("url", "method", "headers"), URL + "/2", "POST", (("X-Source", "efd"),))


def event(
    n: int,
    *,
    lane: str | None = None,
    key: BatchKey = KEY,
    since: float = 0.0,
    size: int | None = None,
) -> Candidate:
    """Delivery n, its body `{"n":n}` or, with `size`, a JSON string of exactly that many
    bytes."""
    body = json.dumps({"n": n}, separators=(",", ":")).encode()
    if size is not None:
        body = b'"' + b"x" * (size - 2) + b'"'
        assert len(body) == size
    return Candidate(n, body, key, lane, since)


def ids(batches: tuple[Batch, ...]) -> list[list[int]]:
    return [list(b.delivery_ids) for b in batches]


# -- the policy -----------------------------------------------------------------------------


def test_an_action_without_batch_keys_sends_one_event_a_request() -> None:
    read = policy({})
    assert read == BatchPolicy(1, MAX_BYTES_DEFAULT, 1.0, ("url", "method", "headers"), BODY)
    assert not read.batched


def test_every_key_is_read() -> None:
    read = policy(
        {
            "batch_size": 4000,
            "batch_max_bytes": 8 * 1024 * 1024,
            "batch_wait_seconds": 0.25,
            "batch_keys": ["headers", "url"],
            "batch_signature": "first_event",
        }
    )
    assert read == BatchPolicy(4000, 8388608, 0.25, ("url", "headers"), FIRST_EVENT)
    assert read.batched
    assert policy({"batch_wait_seconds": 0, "batch_keys": []}).keys == ()
    assert policy({"batch_wait_seconds": 60, "batch_max_bytes": 1024}).wait_seconds == 60.0


@pytest.mark.parametrize(
    ("action", "problem"),
    [
        ({"batch_size": 0}, "batch_size: must be a whole number from 1 to 4000"),
        ({"batch_size": 4001}, "batch_size: must be a whole number from 1 to 4000"),
        ({"batch_size": 2.0}, "batch_size: must be a whole number from 1 to 4000"),
        ({"batch_size": True}, "batch_size: must be a whole number from 1 to 4000"),
        (
            {"batch_max_bytes": 1023},
            "batch_max_bytes: must be a whole number of bytes from 1024 to 8388608 (8 MiB)",
        ),
        (
            {"batch_max_bytes": 8388609},
            "batch_max_bytes: must be a whole number of bytes from 1024 to 8388608 (8 MiB)",
        ),
        (
            {"batch_wait_seconds": -0.5},
            "batch_wait_seconds: must be a number of seconds from 0 to 60",
        ),
        (
            {"batch_wait_seconds": 60.5},
            "batch_wait_seconds: must be a number of seconds from 0 to 60",
        ),
        (
            {"batch_wait_seconds": float("nan")},
            "batch_wait_seconds: must be a number of seconds from 0 to 60",
        ),
        (
            {"batch_wait_seconds": "1"},
            "batch_wait_seconds: must be a number of seconds from 0 to 60",
        ),
        ({"batch_keys": "url"}, 'batch_keys: must be a list of "url", "method" and "headers"'),
        (
            {"batch_keys": ["url", "host"]},
            'batch_keys[1]: "host" is not a batch key; the keys are "url", "method" and "headers"',
        ),
        ({"batch_keys": ["url", "url"]}, 'batch_keys[1]: "url" is listed twice'),
        ({"batch_keys": [1]}, "batch_keys[0]: must be a string"),
        ({"batch_signature": "first"}, 'batch_signature: must be "body" or "first_event"'),
    ],
)
def test_a_bad_value_is_named_by_its_key(action: dict[str, object], problem: str) -> None:
    assert policy_problems(action) == [problem]
    with pytest.raises(BatchPolicyError) as raised:
        policy(action)
    assert raised.value.problems == (problem,)


def test_every_problem_is_listed_in_the_keys_order() -> None:
    problems = policy_problems(
        {
            "batch_signature": "x",
            "batch_keys": ["a", "method", "method"],
            "batch_wait_seconds": 61,
            "batch_max_bytes": 0,
            "batch_size": -1,
        }
    )
    assert [p.split(":")[0] for p in problems] == [
        "batch_size",
        "batch_max_bytes",
        "batch_wait_seconds",
        "batch_keys[0]",
        "batch_keys[2]",
        "batch_signature",
    ]


def test_a_form_body_cannot_be_batched() -> None:
    form_type = "application/x-www-form-urlencoded"
    assert policy_problems({"batch_size": 2}, content_type=form_type) == [
        'batch_size: a batch is a JSON array, so content_type must be "application/json" to'
        ' batch (it is "application/x-www-form-urlencoded")'
    ]
    assert policy_problems({"batch_size": 1}, content_type=form_type) == []


def test_the_keys_select_what_events_must_share() -> None:
    headers = (("X-A", "1"),)
    assert batch_key(["url"], URL, "PUT", headers) == BatchKey(URL, None, None)
    assert batch_key([], URL, "PUT", headers) == BatchKey(None, None, None)
    assert batch_key(["method", "headers"], URL, "PUT", headers) == BatchKey(None, "PUT", headers)


# -- forming --------------------------------------------------------------------------------

BATCHED = BatchPolicy(size=3, max_bytes=MAX_BYTES_DEFAULT, wait_seconds=1.0)


def test_events_fill_batches_of_the_size_in_their_order() -> None:
    plan = form([event(n) for n in range(1, 8)], BATCHED, now=0.0)
    assert ids(plan.ready) == [[1, 2, 3], [4, 5, 6]]
    assert [b.full for b in plan.ready] == [True, True]
    assert ids(plan.waiting) == [[7]]  # partial, and not yet waited
    assert plan.wake_at == 1.0
    assert plan.held == ()


def test_a_partial_batch_goes_once_its_oldest_event_has_waited() -> None:
    events = [event(1, since=10.0), event(2, since=10.6)]
    early = form(events, BATCHED, now=10.99)
    assert (early.ready, ids(early.waiting), early.wake_at) == ((), [[1, 2]], 11.0)
    late = form(events, BATCHED, now=11.0)
    assert ids(late.ready) == [[1, 2]]
    assert not late.ready[0].full
    assert (late.waiting, late.wake_at) == ((), None)


def test_no_wait_sends_what_there_is() -> None:
    plan = form([event(1, since=5.0)], BatchPolicy(size=10, wait_seconds=0.0), now=5.0)
    assert ids(plan.ready) == [[1]]


def test_events_of_different_keys_never_share_a_request() -> None:
    events = [event(1), event(2, key=OTHER), event(3), event(4, key=OTHER), event(5)]
    plan = form(events, BATCHED, now=5.0)
    assert ids(plan.ready) == [[1, 3, 5], [2, 4]]
    assert [b.key for b in plan.ready] == [KEY, OTHER]


def test_the_byte_limit_counts_the_array_exactly() -> None:
    # Three bodies of 100 bytes make an array of 2 + 300 + 2 = 304 bytes.
    events = [event(n, size=100) for n in range(1, 5)]
    exact = form(events, BatchPolicy(size=10, max_bytes=304, wait_seconds=0.0), now=0.0)
    assert ids(exact.ready) == [[1, 2, 3], [4]]
    assert [b.size for b in exact.ready] == [304, 102]
    assert [len(b.body) for b in exact.ready] == [304, 102]
    assert exact.ready[0].full
    short = form(events, BatchPolicy(size=10, max_bytes=303, wait_seconds=0.0), now=0.0)
    assert ids(short.ready) == [[1, 2], [3, 4]]


def test_a_batch_that_no_event_could_join_is_full() -> None:
    # 2 + 100 + 1 + 100 = 203: one byte short of a comma and the smallest JSON value.
    events = [event(1, size=100), event(2, size=100)]
    plan = form(events, BatchPolicy(size=10, max_bytes=204, wait_seconds=60.0), now=0.0)
    assert ids(plan.ready) == [[1, 2]]
    assert plan.ready[0].full
    roomy = form(events, BatchPolicy(size=10, max_bytes=205, wait_seconds=60.0), now=0.0)
    assert ids(roomy.waiting) == [[1, 2]]


def test_an_event_larger_than_the_limit_goes_alone_and_nothing_overtakes_it() -> None:
    events = [event(1, size=10), event(2, size=2000), event(3, size=10), event(4, size=10)]
    plan = form(events, BatchPolicy(size=10, max_bytes=1024, wait_seconds=0.0), now=0.0)
    assert ids(plan.ready) == [[1], [2], [3, 4]]
    assert [b.full for b in plan.ready] == [True, True, False]
    assert plan.ready[1].size == 2002


def test_the_limit_bounds_the_ready_batches_and_says_there_are_more() -> None:
    plan = form([event(n) for n in range(1, 10)], BATCHED, now=0.0, limit=2)
    assert ids(plan.ready) == [[1, 2, 3], [4, 5, 6]]
    assert plan.more
    assert not form([event(n) for n in range(1, 7)], BATCHED, now=0.0, limit=2).more


def test_a_users_events_go_in_one_batch_in_their_order() -> None:
    events = [event(1, lane="u"), event(2, lane="v"), event(3, lane="u")]
    plan = form(events, BATCHED, now=5.0)
    assert ids(plan.ready) == [[1, 2, 3]]


def test_a_users_next_batch_waits_for_the_one_in_flight() -> None:
    events = [event(1, lane="u"), event(2, lane="v"), event(3, lane="u"), event(4, lane="w")]
    plan = form(events, BATCHED, now=5.0, busy={"u"})
    assert ids(plan.ready) == [[2, 4]]
    assert plan.held == (1, 3)


def test_a_user_whose_events_overflow_a_batch_waits_for_it() -> None:
    # u's third event does not fit the full first batch: it and every later event of u wait,
    # while other users fill the next batch.
    events = [
        event(1, lane="u"),
        event(2, lane="u"),
        event(3, lane="v"),
        event(4, lane="u"),
        event(5, lane="w"),
        event(6, lane="u"),
    ]
    plan = form(events, BATCHED, now=5.0)
    assert ids(plan.ready) == [[1, 2, 3], [5]]
    assert plan.held == (4, 6)


def test_a_user_whose_events_have_two_keys_sends_one_batch_at_a_time() -> None:
    events = [
        event(1, lane="u"),
        event(2, lane="u", key=OTHER),
        event(3, lane="v", key=OTHER),
        event(4, lane="u"),
    ]
    plan = form(events, BATCHED, now=5.0)
    assert ids(plan.ready) == [[1], [3]]
    assert plan.held == (2, 4)  # 4 has u's first key, but comes after u's 2


def test_events_without_a_lane_are_never_held() -> None:
    plan = form([event(1), event(2)], BATCHED, now=5.0, busy={"u"})
    assert ids(plan.ready) == [[1, 2]]


@settings(max_examples=300, deadline=None)
@given(
    st.lists(
        st.tuples(st.sampled_from(["a", "b", "c", None]), st.integers(3, 400), st.booleans()),
        max_size=40,
    ),
    st.integers(1, 6),
    st.integers(1024, 1600),
    st.sets(st.sampled_from(["a", "b", "c"])),
)
def test_every_event_is_placed_once_in_order_within_its_limits(
    spec: list[tuple[str | None, int, bool]], size: int, max_bytes: int, busy: set[str]
) -> None:
    events = [
        event(n, lane=lane, size=length, key=OTHER if other else KEY, since=float(n))
        for n, (lane, length, other) in enumerate(spec)
    ]
    rules = BatchPolicy(size=size, max_bytes=max_bytes, wait_seconds=5.0)
    plan = form(events, rules, now=20.0, busy=busy)
    placed = [i for b in plan.ready + plan.waiting for i in b.delivery_ids] + list(plan.held)
    assert sorted(placed) == list(range(len(events)))  # each event once
    lanes_used: set[str] = set()
    for batch in plan.ready + plan.waiting:
        assert list(batch.delivery_ids) == sorted(batch.delivery_ids)
        assert len(batch.members) <= size
        assert batch.size <= max_bytes or len(batch.members) == 1
        assert batch.body == b"[" + b",".join(c.body for c in batch.members) + b"]"
        assert {c.key for c in batch.members} == {batch.key}
        lanes = {c.lane for c in batch.members if c.lane is not None}
        assert not lanes & busy
        assert not lanes & lanes_used  # a lane in one batch at most
        lanes_used |= lanes
        ready = batch in plan.ready
        assert ready == (batch.full or batch.oldest + 5.0 <= 20.0)
    for held in plan.held:
        lane = events[held].lane
        assert lane is not None
        # A held event's lane has no event after it placed in a batch.
        later = [
            c
            for b in plan.ready + plan.waiting
            for c in b.members
            if c.lane == lane and c.delivery_id > held
        ]
        assert later == []


# -- body, signature, id --------------------------------------------------------------------


def test_the_body_is_the_stored_bodies_joined_as_they_are() -> None:
    bodies = [b'{"a":1}', b'"\\u00e9"', b"null", '{"é":"ü"}'.encode()]
    assert array(bodies) == b'[{"a":1},"\\u00e9",null,{"\xc3\xa9":"\xc3\xbc"}]'
    assert array_size([len(b) for b in bodies]) == len(array(bodies))
    assert array([b"1"]) == b"[1]"
    assert array_size([]) == len(array([])) == 2


def test_the_signed_bytes_are_the_body_or_the_first_event() -> None:
    bodies = [b'{"a":1}', b'{"b":2}']
    assert signed_bytes(BODY, bodies) == b'[{"a":1},{"b":2}]'
    assert signed_bytes(FIRST_EVENT, bodies) == b'{"a":1}'
    with pytest.raises(ValueError, match="unknown batch signature"):
        signed_bytes("all", bodies)


def test_a_batch_webhook_id_names_its_route_and_members_in_order() -> None:
    one = webhook_id("crm/bulk", ["msg_a", "msg_b"])
    assert one == webhook_id("crm/bulk", ["msg_a", "msg_b"])
    assert one.startswith("batch_")
    assert len(one) == len("batch_") + 26
    assert one[6:].isalnum()
    assert one[6:] == one[6:].lower()
    assert one.isascii()
    assert (
        len(
            {
                one,
                webhook_id("crm/bulk", ["msg_b", "msg_a"]),
                webhook_id("crm/other", ["msg_a", "msg_b"]),
                webhook_id("crm/bulk", ["msg_a"]),
                webhook_id("crm/bulk", ["msg_amsg_b"]),
            }
        )
        == 5
    )


# -- 413 ------------------------------------------------------------------------------------


def test_a_413_splits_a_batch_in_two_of_nearly_equal_bytes() -> None:
    assert split(413, [1, 2, 3, 4], [10, 10, 10, 10]) == ((1, 2), (3, 4))
    assert split(413, [1, 2, 3, 4, 5], [10] * 5) == ((1, 2), (3, 4, 5))
    assert split(413, [1, 2], [5, 900]) == ((1,), (2,))
    # One large event: the cut leaves it with as little company as the bytes ask.
    assert split(413, [1, 2, 3, 4], [900, 10, 10, 10]) == ((1,), (2, 3, 4))
    assert split(413, [1, 2, 3, 4], [10, 10, 10, 900]) == ((1, 2, 3), (4,))


def test_only_a_413_splits_and_never_a_single_event() -> None:
    assert split(413, [1], [10]) is None
    assert split(400, [1, 2], [10, 10]) is None
    assert split(500, [1, 2], [10, 10]) is None
    assert split(None, [1, 2], [10, 10]) is None
    with pytest.raises(ValueError, match="one size"):
        split(413, [1, 2], [10])


@given(st.lists(st.integers(1, 5000), min_size=2, max_size=60))
def test_halves_keep_every_member_in_order_and_are_the_most_even_cut(sizes: list[int]) -> None:
    members = list(range(len(sizes)))
    halves = split(413, members, sizes)
    assert halves is not None
    first, second = halves
    assert first
    assert second
    assert list(first + second) == members
    gap = abs(array_size(sizes[: len(first)]) - array_size(sizes[len(first) :]))
    for k in range(1, len(sizes)):
        assert gap <= abs(array_size(sizes[:k]) - array_size(sizes[k:]))
