"""How many deliveries a dispatcher holds ready: sized to each destination's rate."""

from __future__ import annotations

from efd.delivery.ahead import HORIZON, WINDOW, Ahead


class Clock:
    def __init__(self) -> None:
        self.t = 1000.0

    def __call__(self) -> float:
        return self.t


def rounds(ahead: Ahead, clock: Clock, destination: str, per_second: float, seconds: float) -> None:
    """Rounds to `destination` ending evenly at `per_second` for `seconds`."""
    step = 1 / per_second
    for _ in range(int(per_second * seconds)):
        clock.t += step
        ahead.answered(destination)


def test_a_destination_starts_at_the_floor() -> None:
    ahead = Ahead(64, 1024, Clock())
    assert (ahead.floor, ahead.ceiling) == (256, 1024)
    assert ahead.size("a") == 256


def test_a_fast_destination_holds_up_to_the_ceiling_and_a_slow_one_the_floor() -> None:
    clock = Clock()
    ahead = Ahead(64, 1024, clock)
    rounds(ahead, clock, "fast", 8000, 2 * WINDOW)
    assert ahead.size("fast") == 1024  # 8,000/s x HORIZON is past the ceiling
    rounds(ahead, clock, "mid", 2400, 2 * WINDOW)
    assert abs(ahead.size("mid") - 2400 * HORIZON) <= 0.02 * 2400 * HORIZON
    rounds(ahead, clock, "slow", 100, 2 * WINDOW)
    assert ahead.size("slow") == 256
    assert ahead.size("fast") == 256  # no round ended for two windows: back to the floor


def test_the_ceiling_and_floor_stay_within_max_in_flight() -> None:
    clock = Clock()
    ahead = Ahead(64, 300, clock)
    assert (ahead.floor, ahead.ceiling) == (256, 300)
    rounds(ahead, clock, "a", 8000, 2 * WINDOW)
    assert ahead.size("a") == 300
    assert Ahead(64, 100, clock).floor == 100


def test_a_rate_that_falls_brings_the_size_down_within_a_window() -> None:
    clock = Clock()
    ahead = Ahead(16, 1024, clock)
    rounds(ahead, clock, "a", 4000, 2 * WINDOW)
    assert ahead.size("a") == 256  # 16 x 16
    rounds(ahead, clock, "a", 500, 2 * WINDOW)
    assert ahead.size("a") == 125
