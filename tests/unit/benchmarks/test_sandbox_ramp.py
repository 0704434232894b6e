"""benchmarks/sandbox_ramp.py's verdict: where the ramp of sandboxes degrades."""

from __future__ import annotations

from collections import Counter

from benchmarks.sandbox_ramp import DEGRADE_FACTOR, Level, degrades_at


def _level(n: int, p99_ms: float, failures: int = 0) -> Level:
    lat = [0.005] * 99 + [p99_ms / 1e3] * 2  # the p99 is the slow tail
    return Level(n, lat=lat, failures=Counter({"grep: exit 2": failures} if failures else {}))


def test_first_level_past_4x_the_first_p99_degrades() -> None:
    assert DEGRADE_FACTOR == 4.0
    levels = [_level(8, 50), _level(16, 190), _level(32, 210), _level(64, 900)]
    assert degrades_at(levels) == 32


def test_failures_degrade_a_level_even_when_fast() -> None:
    assert degrades_at([_level(8, 50), _level(16, 50, failures=1), _level(32, 60)]) == 16


def test_none_degraded_and_levels_not_held_are_skipped() -> None:
    assert degrades_at([_level(8, 50), _level(16, 120), Level(32)]) == 0
    assert degrades_at([Level(8)]) == 0
