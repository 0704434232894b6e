"""The closing lines of `agentrl train`: held-out success, and what to do next."""

from __future__ import annotations

from agentrl.cli.app import eval_summary


def test_fresh_run_shows_before_after_and_change() -> None:
    line = eval_summary({"success": 0.25}, {"success": 0.75}, 8)
    assert line == "held-out success: 0.250 → 0.750 (+0.500) after 8 steps"


def test_resumed_run_has_no_starting_figure_and_no_nan() -> None:
    line = eval_summary({}, {"success": 0.5}, 4)
    assert "nan" not in line
    assert line.startswith("held-out success: 0.500 (resumed run") and line.endswith("4 steps")


def test_what_next_names_the_run_and_its_env(tmp_path):
    from agentrl.cli.app import _next_steps

    (tmp_path / "final_model").mkdir()
    (tmp_path / "config.yaml").write_text("env: my_env.py:Mine\n")
    text = _next_steps(tmp_path)
    assert text.startswith("what next:")
    assert f"agentrl view {tmp_path} --web" in text
    assert f"agentrl eval --env my_env.py:Mine --model {tmp_path / 'final_model'}" in text
    assert "agentrl eval --env SPEC" in _next_steps(tmp_path / "missing")
