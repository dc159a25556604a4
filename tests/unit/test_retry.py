"""efd.delivery.retry: outcome classification, the retry window and decide() (pure, fast)."""

from __future__ import annotations

import itertools
import random
from datetime import UTC, datetime
from email.utils import format_datetime

import pytest

from efd.delivery.retry import (
    FINAL_ERRORS,
    AttemptResult,
    Decision,
    RetryPolicy,
    Verdict,
    classify_error,
    classify_status,
    decide,
    parse_retry_after,
)
from efd.records import DeliveryStatus
from efd.segment.webhooks import hook_labels

POLICY = RetryPolicy(initial=5, maximum=1800, window=14400)
T0 = 1_800_000_000.0  # first attempt
A, B, C = "https://a.example/h", "https://b.example/h", "https://c.example/h"


# -- classify_status -------------------------------------------------------------------------


@pytest.mark.parametrize("status", [200, 201, 202, 204, 206, 226, 299])
def test_2xx_is_success(status: int) -> None:
    assert classify_status(status) is Verdict.SUCCESS


@pytest.mark.parametrize("status", [408, 429, 500, 501, 502, 503, 504, 507, 511, 520, 599])
def test_retryable_statuses(status: int) -> None:
    assert classify_status(status) is Verdict.RETRY


@pytest.mark.parametrize("status", [600, 799, 999])
def test_a_status_http_does_not_define_is_retried_as_a_5xx(status: int) -> None:
    # RFC 9110: a client should process a status outside 100-599 as a 5xx.
    assert classify_status(status) is Verdict.RETRY


@pytest.mark.parametrize(
    "status",
    [300, 301, 302, 303, 304, 307, 308, 400, 401, 403, 404, 405, 409, 410, 413, 415, 422, 451, 499],
)
def test_redirects_and_other_4xx_fail_for_good(status: int) -> None:
    assert classify_status(status) is Verdict.FAIL


@pytest.mark.parametrize("status", [100, 101, 199])
def test_informational_statuses_are_not_success(status: int) -> None:
    assert classify_status(status) is not Verdict.SUCCESS


# -- classify_error --------------------------------------------------------------------------


@pytest.mark.parametrize(
    "error_class", ["timeout", "connect", "dns", "reset", "protocol", "interrupted", "internal"]
)
def test_transport_errors_retry(error_class: str) -> None:
    assert classify_error(error_class) is Verdict.RETRY


@pytest.mark.parametrize("error_class", ["tls", "blocked", "invalid_url", "invalid_request"])
def test_never_sent_errors_fail_for_good(error_class: str) -> None:
    assert classify_error(error_class) is Verdict.FAIL


def test_final_error_classes() -> None:
    assert frozenset({"tls", "blocked", "invalid_url", "invalid_request"}) == FINAL_ERRORS


def test_unknown_error_class_retries() -> None:
    assert classify_error("something new") is Verdict.RETRY


# -- backoff -------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("attempt", "ceiling"),
    [
        (0, 5),
        (1, 5),
        (2, 10),
        (3, 20),
        (4, 40),
        (5, 80),
        (9, 1280),
        (10, 1800),
        (11, 1800),
        (50, 1800),
    ],
)
def test_backoff_bounds(attempt: int, ceiling: float) -> None:
    rng = random.Random(attempt)
    delays = [POLICY.backoff(attempt, rng) for _ in range(300)]
    assert all(ceiling / 2 <= d <= ceiling for d in delays)
    assert max(delays) - min(delays) > ceiling / 4  # really randomised across the range


def test_backoff_grows_until_the_maximum() -> None:
    rng = random.Random(7)
    means = [sum(POLICY.backoff(n, rng) for _ in range(200)) / 200 for n in range(1, 13)]
    assert all(later > earlier for earlier, later in itertools.pairwise(means[:10]))
    assert means[-1] == pytest.approx(1800 * 0.75, rel=0.05)


def test_backoff_is_reproducible_with_a_seed() -> None:
    first = [POLICY.backoff(n, random.Random(42)) for n in range(1, 8)]
    second = [POLICY.backoff(n, random.Random(42)) for n in range(1, 8)]
    assert first == second


def test_backoff_with_fractional_seconds() -> None:
    policy = RetryPolicy(initial=0.5, maximum=2, window=10)
    rng = random.Random(3)
    assert 0.25 <= policy.backoff(1, rng) <= 0.5
    assert 1 <= policy.backoff(3, rng) <= 2
    assert 1 <= policy.backoff(30, rng) <= 2


@pytest.mark.parametrize("attempt", [1100, 100_000])
def test_backoff_survives_very_many_attempts(attempt: int) -> None:
    policy = RetryPolicy(initial=0.5, maximum=1, window=14400)
    assert 0.5 <= policy.backoff(attempt, random.Random(1)) <= 1


# -- next_attempt_at: the window -----------------------------------------------------------


def next_at(
    attempt: int,
    now: float,
    retry_after: float | None = None,
    policy: RetryPolicy = POLICY,
    seed: int = 1,
) -> float | None:
    return policy.next_attempt_at(
        attempt=attempt,
        first_attempt_at=T0,
        now=now,
        retry_after=retry_after,
        rng=random.Random(seed),
    )


@pytest.mark.parametrize("attempt", [1, 2, 5, 12])
@pytest.mark.parametrize("seed", range(5))
def test_next_attempt_is_now_plus_backoff(attempt: int, seed: int) -> None:
    now = T0 + 60
    expected = now + POLICY.backoff(attempt, random.Random(seed))
    assert next_at(attempt, now, seed=seed) == expected


@pytest.mark.parametrize("seed", range(20))
@pytest.mark.parametrize("elapsed", [0, 1000, 13_000, 14_000, 14_399, 14_399.999])
def test_next_attempt_never_past_the_window(seed: int, elapsed: float) -> None:
    at = next_at(12, T0 + elapsed, seed=seed)
    assert at is not None
    assert T0 + elapsed < at <= T0 + POLICY.window


def test_overshooting_backoff_is_clamped_to_the_window_close() -> None:
    # 14,399 s in, a backoff of at least 900 s would overshoot: one last try at the close.
    assert next_at(12, T0 + 14_399) == T0 + 14_400


@pytest.mark.parametrize("elapsed", [14_400, 14_400.001, 20_000])
def test_no_attempt_once_the_window_is_spent(elapsed: float) -> None:
    assert next_at(1, T0 + elapsed) is None


def test_a_schedule_ends_at_the_window_then_stops() -> None:
    rng = random.Random(11)
    now, attempt, times = T0, 1, []
    while True:
        at = POLICY.next_attempt_at(
            attempt=attempt, first_attempt_at=T0, now=now, retry_after=None, rng=rng
        )
        if at is None:
            break
        assert at > now
        times.append(at)
        now, attempt = at, attempt + 1
    assert times[-1] == T0 + POLICY.window
    assert all(t <= T0 + POLICY.window for t in times)
    assert 10 < len(times) < 40  # 5, 10, 20 … 1800 s, then about every 15-30 minutes


# -- Retry-After ---------------------------------------------------------------------------


def test_retry_after_longer_than_backoff_is_honoured() -> None:
    assert next_at(1, T0 + 10, retry_after=600) == T0 + 10 + 600


def test_retry_after_shorter_than_backoff_keeps_backoff() -> None:
    now = T0 + 10
    assert next_at(5, now, retry_after=1) == now + POLICY.backoff(5, random.Random(1))


def test_retry_after_zero_keeps_backoff() -> None:
    now = T0 + 10
    assert next_at(1, now, retry_after=0) == now + POLICY.backoff(1, random.Random(1))


def test_retry_after_reaching_exactly_the_window_close() -> None:
    assert next_at(1, T0 + 100, retry_after=14_300) == T0 + 14_400


def test_retry_after_past_the_window_cannot_be_honoured() -> None:
    # Trying earlier would defy the receiver; trying later would break the window.
    assert next_at(1, T0 + 100, retry_after=14_300.5) is None
    assert next_at(1, T0, retry_after=86_400) is None


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        ("120", 120.0),
        ("0", 0.0),
        (" 30 ", 30.0),
        ("86400", 86400.0),
        (None, None),
        ("", None),
        ("soon", None),
        ("-5", None),
        ("1.5", None),
        ("garbage, 99 Foo", None),
        ("Mon, 99 Foo 2015 07:28:00 GMT", None),
    ],
)
def test_parse_retry_after_seconds(value: str | None, expected: float | None) -> None:
    assert parse_retry_after(value, T0) == expected


@pytest.mark.parametrize("delta", [0, 1, 90, 3600])
def test_parse_retry_after_http_date(delta: int) -> None:
    when = datetime.fromtimestamp(T0 + delta, UTC)
    header = format_datetime(when, usegmt=True)  # "Fri, 15 Jan 2027 08:00:00 GMT"
    assert header.endswith(" GMT")
    assert parse_retry_after(header, T0) == pytest.approx(delta)


def test_parse_retry_after_http_date_in_the_past_is_zero() -> None:
    assert parse_retry_after("Wed, 21 Oct 2015 07:28:00 GMT", T0) == 0.0


def test_parse_retry_after_known_http_date() -> None:
    # 1445412480 is 2015-10-21T07:28:00Z.
    assert parse_retry_after("Wed, 21 Oct 2015 07:28:00 GMT", 1_445_412_480 - 60) == 60.0


@pytest.mark.parametrize("value", ["²", "1²"])
def test_parse_retry_after_non_ascii_digits_are_ignored(value: str) -> None:
    assert parse_retry_after(value, T0) is None


# -- decide --------------------------------------------------------------------------------


def result(
    url: str,
    verdict: Verdict,
    status: int | None = None,
    error_class: str | None = None,
    retry_after: float | None = None,
) -> AttemptResult:
    return AttemptResult(
        hook_url=url,
        started_at=T0,
        duration=0.1,
        verdict=verdict,
        status_code=status,
        error_class=error_class,
        error=None if error_class is None else "boom",
        retry_after=retry_after,
    )


OK = Verdict.SUCCESS
RETRY = Verdict.RETRY
FAIL = Verdict.FAIL


def run(
    results: list[AttemptResult],
    *,
    hooks: tuple[str, ...] = (A, B, C),
    failed: frozenset[str] = frozenset(),
    attempt: int = 1,
    now: float = T0,
    seed: int = 5,
) -> Decision:
    return decide(
        results,
        hooks=hook_labels(hooks),
        failed_hooks=failed,
        attempt=attempt,
        first_attempt_at=T0,
        now=now,
        policy=POLICY,
        rng=random.Random(seed),
    )


@pytest.mark.parametrize(
    "results",
    [
        [result(A, OK, 200), result(B, RETRY, 500), result(C, FAIL, 404)],
        [result(A, RETRY, 503), result(B, FAIL, 400), result(C, OK, 204)],
        [
            result(A, FAIL, error_class="tls"),
            result(B, OK, 201),
            result(C, RETRY, 429, retry_after=1e9),
        ],
        [result(A, OK, 200), result(B, OK, 200), result(C, OK, 200)],
    ],
)
def test_first_success_wins(results: list[AttemptResult]) -> None:
    decision = run(results)
    assert decision == Decision(DeliveryStatus.DELIVERED, None, frozenset(), None)


def test_success_after_the_window_still_counts() -> None:
    decision = run([result(A, OK, 200)], now=T0 + 99_999)
    assert decision.status == "delivered"


def test_success_keeps_earlier_failed_hooks() -> None:
    decision = run([result(B, OK, 200)], failed=frozenset({A}))
    assert decision == Decision(DeliveryStatus.DELIVERED, None, frozenset({A}), None)


def test_retryable_round_is_pending() -> None:
    decision = run([result(A, RETRY, 500), result(B, RETRY, error_class="timeout")], hooks=(A, B))
    assert decision.status == "pending"
    assert decision.failed_hooks == frozenset()
    assert decision.next_attempt_at == T0 + POLICY.backoff(1, random.Random(5))
    assert decision.last_error == f"{A}: HTTP 500; {B}: timeout: boom"


def test_hooks_failing_for_good_drop_out() -> None:
    decision = run(
        [result(A, FAIL, 404), result(B, RETRY, 502), result(C, FAIL, error_class="tls")]
    )
    assert decision.status == "pending"
    assert decision.failed_hooks == frozenset({A, C})
    assert decision.next_attempt_at is not None


def test_failed_hooks_accumulate_across_rounds() -> None:
    decision = run([result(B, FAIL, 410), result(C, RETRY, 500)], failed=frozenset({A}), attempt=3)
    assert (decision.status, decision.failed_hooks) == ("pending", frozenset({A, B}))


@pytest.mark.parametrize(
    ("results", "failed"),
    [
        (
            [result(A, FAIL, 404), result(B, FAIL, 301), result(C, FAIL, error_class="blocked")],
            frozenset(),
        ),
        ([result(C, FAIL, 400)], frozenset({A, B})),
        ([], frozenset({A, B, C})),
    ],
)
def test_all_hooks_failed_is_failed(results: list[AttemptResult], failed: frozenset[str]) -> None:
    decision = run(results, failed=failed)
    assert decision.status == "failed"
    assert decision.next_attempt_at is None
    assert decision.failed_hooks == frozenset({A, B, C})
    assert decision.last_error


def test_failed_wins_over_expired() -> None:
    """Every hook refused for good: 'failed', even when the window is also spent."""
    decision = run([result(A, FAIL, 400)], hooks=(A,), now=T0 + 99_999)
    assert decision.status == "failed"


def test_last_error_names_each_hook() -> None:
    decision = run([result(A, FAIL, 404), result(B, FAIL, error_class="blocked")], hooks=(A, B))
    assert decision.last_error == f"{A}: HTTP 404; {B}: blocked: boom"


@pytest.mark.parametrize("elapsed", [14_400, 20_000])
def test_window_spent_is_expired(elapsed: float) -> None:
    decision = run([result(A, RETRY, 500), result(B, FAIL, 404)], hooks=(A, B), now=T0 + elapsed)
    assert decision.status == "expired"
    assert decision.next_attempt_at is None
    assert decision.failed_hooks == frozenset({B})
    assert decision.last_error == f"{A}: HTTP 500; {B}: HTTP 404"


def test_last_round_is_at_the_window_close() -> None:
    decision = run([result(A, RETRY, 500)], attempt=12, now=T0 + 14_399)
    assert (decision.status, decision.next_attempt_at) == ("pending", T0 + 14_400)
    after = run([result(A, RETRY, 500)], attempt=13, now=T0 + 14_400)
    assert after.status == "expired"


def test_retry_after_in_decide_takes_the_largest() -> None:
    decision = run(
        [result(A, RETRY, 429, retry_after=300), result(B, RETRY, 503, retry_after=900)],
        hooks=(A, B),
        now=T0 + 10,
    )
    assert decision.next_attempt_at == T0 + 10 + 900


def test_retry_after_beyond_the_window_expires() -> None:
    decision = run([result(A, RETRY, 429, retry_after=20_000)], hooks=(A,), now=T0 + 10)
    assert decision.status == "expired"


def test_no_results_and_live_hooks_is_pending() -> None:
    decision = run([], hooks=(A,))
    assert decision.status == "pending"
    assert decision.last_error == "no hook to send to"


@pytest.mark.parametrize(
    ("attempt", "expected"),
    [
        (result(A, OK, 200), f"{A}: HTTP 200"),
        (result(A, RETRY, error_class="dns", status=None), f"{A}: dns: boom"),
    ],
)
def test_describe(attempt: AttemptResult, expected: str) -> None:
    assert attempt.describe(A) == expected


# Two hooks that differ only in what redaction hides, and one with credentials.
SECRET_1 = "https://hooks.example/in?api_key=k3y-0ne"
SECRET_2 = "https://hooks.example/in?api_key=k3y-tw0"
SECRET_3 = "https://user:pa55word@other.example/in"


def test_failed_hooks_and_last_error_name_hooks_by_label() -> None:
    decision = run(
        [result(SECRET_1, FAIL, 404), result(SECRET_2, RETRY, 500), result(SECRET_3, FAIL, 401)],
        hooks=(SECRET_1, SECRET_2, SECRET_3),
    )
    assert decision.status == "pending"  # the second hook, distinct from the first, remains
    assert decision.failed_hooks == frozenset(
        {"https://hooks.example/in?api_key=***", "https://***@other.example/in"}
    )
    assert decision.last_error == (
        "https://hooks.example/in?api_key=***: HTTP 404; "
        "https://hooks.example/in?api_key=*** #2: HTTP 500; "
        "https://***@other.example/in: HTTP 401"
    )


def test_a_hook_that_reads_like_a_failed_one_still_counts() -> None:
    decision = run(
        [result(SECRET_2, FAIL, 410)],
        hooks=(SECRET_1, SECRET_2),
        failed=frozenset({"https://hooks.example/in?api_key=***"}),
    )
    assert decision.status == "failed"
    assert decision.failed_hooks == frozenset(
        {"https://hooks.example/in?api_key=***", "https://hooks.example/in?api_key=*** #2"}
    )
