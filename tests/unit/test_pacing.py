import pytest

from efd.services.pacing import (
    CONTENDED_STEP,
    FLOOR_SHARE,
    LARGE_STEP,
    LOOK_AGAIN_MAX,
    LOOK_AGAIN_MIN,
    SMALL_STEP,
    contended,
    look_again,
    may_step,
    next_step,
    pause_after,
)


def test_the_pause_is_proportional_to_the_step() -> None:
    assert pause_after(0.02, 0.4) == pytest.approx(0.02 * 0.6 / 0.4)
    assert pause_after(0.2, 0.4) == pytest.approx(10 * pause_after(0.02, 0.4))


@pytest.mark.parametrize("share", [0.1, 0.25, 0.4, 0.5, 0.9])
def test_steps_and_pauses_hold_the_writer_at_most_the_share(share: float) -> None:
    steps = [0.013, 0.055, 0.146, 0.0, 0.7]
    busy = sum(steps)
    assert busy / (busy + sum(pause_after(s, share) for s in steps)) == pytest.approx(share)


def test_a_share_of_the_whole_writer_does_not_pause() -> None:
    assert pause_after(0.05, 1.0) == 0.0


def test_a_negative_duration_pauses_nothing() -> None:
    assert pause_after(-0.01, 0.5) == 0.0


@pytest.mark.parametrize("share", [0.0, -0.5, 1.5])
def test_a_share_outside_the_unit_interval_is_refused(share: float) -> None:
    with pytest.raises(ValueError, match="share"):
        pause_after(0.01, share)


def test_a_step_runs_at_once_when_no_other_write_waits() -> None:
    assert may_step(0, 0.5, 0.0, 0.5)


def test_a_step_defers_while_other_writes_wait_until_its_floor_is_due() -> None:
    due = 0.05 * (1 - FLOOR_SHARE) / FLOOR_SHARE
    assert not may_step(1, 1.0, 0.0, 0.05)
    assert not may_step(3, 1.0, due * 0.99, 0.05)
    assert may_step(3, 1.0, due, 0.05)
    assert may_step(1, 1.0, 0.0, 0.05, floor=1.0)


def test_a_step_defers_until_no_other_write_ended_for_as_long_as_it_takes() -> None:
    assert not may_step(0, 0.049, 0.0, 0.05)
    assert may_step(0, 0.05, 0.0, 0.05)
    assert may_step(0, 0.0, 0.05 * (1 - FLOOR_SHARE) / FLOOR_SHARE, 0.05)


def test_the_first_step_of_a_process_runs_whatever_waits() -> None:
    assert may_step(5, 0.0, float("inf"), 0.0)


def simulate(busy: bool, steps: list[float], floor: float = FLOOR_SHARE) -> float:
    """Retention's share of a writer over a run of `steps`, the others always waiting when
    `busy`, a deferred step looking again as retention does."""
    now, held, end, last = 0.0, 0.0, -float("inf"), 0.0
    for step in steps:
        while not may_step(0, 0.0 if busy else float("inf"), now - end, last, floor):
            now += look_again(last)
        now += step
        held += step
        end, last = now, step
    return held / now


@pytest.mark.parametrize("floor", [0.05, 0.1, 0.2])
def test_a_saturated_writer_leaves_retention_its_floor_and_little_more(floor: float) -> None:
    steps = [0.03, 0.08, 0.12, 0.06, 0.1, 0.09, 0.15, 0.07] * 10
    share = simulate(True, steps, floor)
    assert floor * 0.97 <= share <= floor * 1.03


def test_an_idle_writer_is_all_retention_s() -> None:
    assert simulate(False, [0.03, 0.08, 0.12]) == 1.0


def test_a_deferred_step_looks_again_soon_in_proportion_to_the_last() -> None:
    assert look_again(0.02) == pytest.approx(0.005)
    assert look_again(0.0) == LOOK_AGAIN_MIN
    assert look_again(-1.0) == LOOK_AGAIN_MIN
    assert look_again(10.0) == LOOK_AGAIN_MAX


def test_a_step_forced_past_waiting_writes_is_followed_by_a_short_one() -> None:
    assert next_step(LARGE_STEP, LARGE_STEP, forced=True) == CONTENDED_STEP
    assert next_step(0, SMALL_STEP, forced=True) == CONTENDED_STEP
    assert CONTENDED_STEP < SMALL_STEP


def test_the_writer_is_contended_while_writes_wait_or_ended_lately() -> None:
    assert contended(1, 10.0, 0.05)
    assert contended(0, 0.01, 0.05)
    assert not contended(0, 0.05, 0.05)
    assert not contended(0, 0.0, 0.0)


def test_full_steps_grow_and_short_ones_shrink() -> None:
    assert next_step(SMALL_STEP, SMALL_STEP) == LARGE_STEP
    assert next_step(LARGE_STEP, LARGE_STEP) == LARGE_STEP
    assert next_step(LARGE_STEP - 1, LARGE_STEP) == SMALL_STEP
    assert next_step(0, SMALL_STEP) == SMALL_STEP
    assert SMALL_STEP < LARGE_STEP
