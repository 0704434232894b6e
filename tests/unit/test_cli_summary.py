"""The closing line of `agentrl train` on held-out success."""

from __future__ import annotations

from agentrl.cli import eval_summary


def test_fresh_run_shows_before_after_and_change() -> None:
    line = eval_summary({"success": 0.25}, {"success": 0.75}, 8)
    assert line == "held-out success: 0.250 → 0.750 (+0.500) after 8 steps"


def test_resumed_run_has_no_starting_figure_and_no_nan() -> None:
    line = eval_summary({}, {"success": 0.5}, 4)
    assert "nan" not in line
    assert line.startswith("held-out success: 0.500 (resumed run") and line.endswith("4 steps")
