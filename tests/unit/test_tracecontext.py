"""W3C Trace Context headers, byte by byte (efd/observe/tracecontext.py)."""

from __future__ import annotations

import pytest

from efd.observe.tracecontext import (
    TraceParent,
    format_traceparent,
    format_tracestate,
    from_stored,
    parse_traceparent,
    parse_tracestate,
    stored,
)

TRACE = "4bf92f3577b34da6a3ce929d0e0e4736"
SPAN = "00f067aa0ba902b7"
VALID = f"00-{TRACE}-{SPAN}-01"


def test_a_valid_traceparent_is_read() -> None:
    parent = parse_traceparent(VALID)
    assert parent == TraceParent(int(TRACE, 16), int(SPAN, 16), 1)
    assert parent.sampled
    assert format_traceparent(parent) == VALID


def test_flags_other_than_sampled_are_kept_and_unsampled_is_read() -> None:
    parent = parse_traceparent(f"00-{TRACE}-{SPAN}-00")
    assert parent is not None
    assert not parent.sampled
    assert format_traceparent(parent) == f"00-{TRACE}-{SPAN}-00"
    random = parse_traceparent(f"00-{TRACE}-{SPAN}-03")
    assert random is not None
    assert random.flags == 3
    assert random.sampled


def test_surrounding_whitespace_is_allowed() -> None:
    assert parse_traceparent(f" \t{VALID} ") == parse_traceparent(VALID)


@pytest.mark.parametrize(
    "value",
    [
        None,
        "",
        "00",
        VALID[:-1],  # one flag digit
        VALID + "0",  # version 00 with a digit more
        VALID + "-extra",  # version 00 has nothing after the flags
        VALID.upper(),  # uppercase hex
        f"00-{TRACE.upper()}-{SPAN}-01",
        f"00-{TRACE}-{SPAN.upper()}-01",
        f"00-{'0' * 32}-{SPAN}-01",  # all-zero trace id
        f"00-{TRACE}-{'0' * 16}-01",  # all-zero parent id
        f"ff-{TRACE}-{SPAN}-01",  # the version that is never valid
        f"0g-{TRACE}-{SPAN}-01",
        f"00-{TRACE[:-1]}-{SPAN}-01",  # a short trace id
        f"00-{TRACE}x-{SPAN}-01",
        f"00-{TRACE}-{SPAN}-0x",
        f"00_{TRACE}_{SPAN}_01",
    ],
)
def test_an_invalid_traceparent_is_ignored(value: str | None) -> None:
    assert parse_traceparent(value) is None


def test_a_later_version_is_read_as_version_00_and_its_additions_ignored() -> None:
    later = f"cc-{TRACE}-{SPAN}-01"
    assert parse_traceparent(later) == parse_traceparent(VALID)
    assert parse_traceparent(later + "-what-comes-later") == parse_traceparent(VALID)
    # ... but only after a dash.
    assert parse_traceparent(later + "x") is None
    # What efd sends on is version 00.
    parent = parse_traceparent(later)
    assert parent is not None
    assert format_traceparent(parent) == VALID


def test_format_pads_ids_to_their_width() -> None:
    assert format_traceparent(TraceParent(1, 2, 1)) == f"00-{'0' * 31}1-{'0' * 15}2-01"


def test_tracestate_members_are_read_in_order() -> None:
    assert parse_tracestate("congo=t61rcWkgMzE,rojo=00f067aa0ba902b7") == (
        ("congo", "t61rcWkgMzE"),
        ("rojo", "00f067aa0ba902b7"),
    )


def test_tracestate_allows_spaces_and_tabs_around_members_and_empty_members() -> None:
    assert parse_tracestate(" a=1 ,\tb=2,, ,c=3\t") == (("a", "1"), ("b", "2"), ("c", "3"))


def test_tracestate_header_lines_are_one_list() -> None:
    assert parse_tracestate(["a=1", "b=2,c=3"]) == (("a", "1"), ("b", "2"), ("c", "3"))


def test_tracestate_multi_tenant_keys_and_value_characters() -> None:
    assert parse_tracestate("tenant1@vendor=x,7x@sys=a b=c") is None  # '=' in the value
    assert parse_tracestate("tenant1@vendor=x,7x@sys=a b") == (
        ("tenant1@vendor", "x"),
        ("7x@sys", "a b"),
    )
    assert parse_tracestate("k_-*/0=!~") == (("k_-*/0", "!~"),)


@pytest.mark.parametrize(
    "value",
    [
        None,
        "a",  # no '='
        "=1",  # no key
        "A=1",  # uppercase key
        "1a=1",  # a simple key starts with a letter
        "a=",  # an empty value
        "a=x y,b=",  # the second value empty
        "a=1,a=2",  # a key twice
        "a=\x7f",
        "a=é",
        "t@1sys=x",  # a system id starts with a letter
        "a" * 257 + "=1",
        ",".join(f"k{n}=v" for n in range(33)),  # 33 members
        "a=" + "x" * 511,  # 513 characters
    ],
)
def test_an_invalid_tracestate_is_dropped(value: str | None) -> None:
    assert parse_tracestate(value) is None


def test_an_empty_tracestate_is_none() -> None:
    assert parse_tracestate("") is None
    assert parse_tracestate(" , ") is None


def test_tracestate_limits_are_inclusive() -> None:
    members = ",".join(f"k{n}=v" for n in range(32))
    parsed = parse_tracestate(members)
    assert parsed is not None
    assert len(parsed) == 32
    assert format_tracestate(parsed) == members
    key = "a" * 256
    assert parse_tracestate(f"{key}=1") == ((key, "1"),)


def test_the_stored_form_round_trips() -> None:
    parent = TraceParent(int(TRACE, 16), int(SPAN, 16), 1)
    assert stored(parent) == VALID
    assert from_stored(VALID) == (parent, None)
    line = stored(parent, "a=1 2,b=3")
    assert line == f"{VALID} a=1 2,b=3"
    assert from_stored(line) == (parent, "a=1 2,b=3")


@pytest.mark.parametrize("value", [None, "", "garbage", f"{VALID[:-1]} a=1"])
def test_a_stored_form_that_is_not_one_reads_as_none(value: str | None) -> None:
    assert from_stored(value) is None
