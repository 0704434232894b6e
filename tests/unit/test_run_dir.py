"""Run directory: metrics lines and columnar trajectory files that round-trip."""

from __future__ import annotations

import math

from agentrl.logging.run_dir import RunDir, read_trajectories
from agentrl.types import Message, StopReason, ToolCall, Trajectory, TurnSpan


def test_trajectories_round_trip(tmp_path):
    t = Trajectory(
        task_id="t1",
        group_id="g",
        episode_id="g/0",
        token_ids=[5, 6, 7, 2],
        loss_mask=[0, 0, 1, 1],
        rollout_logprobs=[0.0, 0.0, -0.5, -0.25],
        weight_versions=[-1, -1, 3, 4],
        prompt_length=2,
        spans=[TurnSpan(0, 2, "prompt"), TurnSpan(2, 4, "model", 1.0)],
        reward=1.0,
        stop_reason=StopReason.MAX_TURNS,
        messages=[
            Message.user("hi"),
            Message.assistant("", (ToolCall("python", {"code": "1"}, id="c"),)),
        ],
        num_turns=1,
        metrics={"tool_calls": 1.0},
        info={"answer": "3"},
        error=None,
    )
    run = RunDir(tmp_path / "run")
    path = run.save_trajectories(1, [t])
    assert path.name == "step_000001.parquet"
    assert read_trajectories(path) == [t]


def test_metrics_lines(tmp_path):
    run = RunDir(tmp_path)
    run.log(1, {"reward_mean": 0.5, "kl": math.nan})
    run.log(1, {"success": 0.25}, kind="eval")
    lines = list(run.metrics())
    assert [(m["step"], m["kind"]) for m in lines] == [(1, "train"), (1, "eval")]
    assert lines[0]["reward_mean"] == 0.5 and lines[0]["kl"] is None
