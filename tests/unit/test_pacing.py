import pytest

from efd.services.pacing import LARGE_STEP, SHARE, SMALL_STEP, next_step, pause_after


def test_the_pause_is_proportional_to_the_step() -> None:
    assert pause_after(0.02) == pytest.approx(0.02 * (1 - SHARE) / SHARE)
    assert pause_after(0.2) == pytest.approx(10 * pause_after(0.02))


@pytest.mark.parametrize("share", [0.1, 0.25, 0.4, 0.5, 0.9])
def test_steps_and_pauses_hold_the_writer_at_most_the_share(share: float) -> None:
    steps = [0.013, 0.055, 0.146, 0.0, 0.7]
    busy = sum(steps)
    assert busy / (busy + sum(pause_after(s, share) for s in steps)) == pytest.approx(share)


def test_a_share_of_the_whole_writer_does_not_pause() -> None:
    assert pause_after(0.05, 1.0) == 0.0


def test_a_negative_duration_pauses_nothing() -> None:
    assert pause_after(-0.01) == 0.0


@pytest.mark.parametrize("share", [0.0, -0.5, 1.5])
def test_a_share_outside_the_unit_interval_is_refused(share: float) -> None:
    with pytest.raises(ValueError, match="share"):
        pause_after(0.01, share)


def test_full_steps_grow_and_short_ones_shrink() -> None:
    assert next_step(SMALL_STEP, SMALL_STEP) == LARGE_STEP
    assert next_step(LARGE_STEP, LARGE_STEP) == LARGE_STEP
    assert next_step(LARGE_STEP - 1, LARGE_STEP) == SMALL_STEP
    assert next_step(0, SMALL_STEP) == SMALL_STEP
    assert SMALL_STEP < LARGE_STEP
