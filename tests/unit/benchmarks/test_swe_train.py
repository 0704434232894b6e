"""benchmarks/swe_train.py's figures from a run directory, with values worked out by hand."""

from __future__ import annotations

import json

import pytest

from agentrl.reporting.run_dir import RunDir
from agentrl.types import StopReason, Trajectory
from benchmarks.swe_train import run_figures


def _episode(resolved: float, gen: float, tool: float, env: float, grade: float) -> Trajectory:
    return Trajectory(
        task_id="t", group_id="g", episode_id="g/0", token_ids=[1, 2], loss_mask=[0, 1],
        rollout_logprobs=[0.0, -1.0], weight_versions=[-1, 0], prompt_length=1,
        reward=resolved, stop_reason=StopReason.DONE,
        metrics={"swe_resolved": resolved, "generate_time_s": gen, "tool_time_s": tool,
                 "env_time_s": env, "swe_grade_time_s": grade, "swe_pool_busy": 0.5},
    )  # fmt: skip


def test_figures_by_hand(tmp_path):
    run = RunDir(tmp_path / "r")
    run.save_trajectories(1, [_episode(1.0, 6, 1, 3, 1), _episode(0.0, 6, 1, 3, 1)])
    run.save_trajectories(2, [_episode(1.0, 6, 1, 3, 1), _episode(1.0, 6, 1, 3, 1)])
    lines = [
        {"kind": "eval", "step": 0, "success": 0.25, "episodes": 8},
        {"kind": "train", "step": 1, "time/generate": 30, "time/update": 60, "time/sync": 0},
        {"kind": "train", "step": 2, "time/generate": 30, "time/update": 60, "time/sync": 0},
        {"kind": "eval", "step": 2, "success": 0.5, "episodes": 8},
    ]
    (tmp_path / "r" / "metrics.jsonl").write_text("".join(json.dumps(m) + "\n" for m in lines))
    seconds = {"evaluation": 60, "total": 300}
    (tmp_path / "r" / "summary.json").write_text(json.dumps({"seconds": seconds}))
    f = run_figures(tmp_path / "r", 0.0)  # 0: the run's own total, 300 s
    assert (f["before"], f["after"], f["gain"], f["steps"]) == (0.25, 0.5, 0.25, 2)
    assert f["curve"] == [0.5, 1.0]
    assert f["episodes_per_hour"] == pytest.approx(4 / (180 / 3600))  # 80
    # 300 s: 60 evaluation, 60 generation, 120 update, the other 60 start-up.
    assert f["share"] == pytest.approx(
        {"start_up": 0.2, "evaluation": 0.2, "generation": 0.2, "update": 0.4, "sync": 0.0}
    )
    # Each episode: 6 s model, 1 s tools, 3 s env of which 1 s grading (of 10 s).
    assert f["episode_share"] == pytest.approx(
        {"model": 0.6, "tools": 0.1, "env": 0.3, "grading": 0.1}
    )
    assert f["pool_busy"] == 0.5
