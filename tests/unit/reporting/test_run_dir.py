"""Run directory: metrics lines and columnar trajectory files that round-trip."""

from __future__ import annotations

import math
from dataclasses import MISSING, fields

import pyarrow.parquet as pq
import pytest

from agentrl.reporting.run_dir import RunDir, read_trajectories
from agentrl.types import Message, StopReason, ToolCall, Trajectory, TurnSpan
from tests.helpers.trajectories import per_turn_trajectory


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


def test_per_turn_trajectory_round_trips_every_field(tmp_path):
    t = per_turn_trajectory()
    # The fixture really exercises every field: none is left at its default.
    for f in fields(Trajectory):
        default = f.default_factory() if f.default_factory is not MISSING else f.default
        assert getattr(t, f.name) != default, f.name
    for f in fields(Message):
        assert any(getattr(m, f.name) != f.default for m in t.messages), f.name

    path = RunDir(tmp_path).save_trajectories(3, [t])
    (back,) = read_trajectories(path)
    assert back == t
    assert back.samples() == [(0, 4), (4, 9)]
    assert back.position_ids() == t.position_ids()
    assert [m.reasoning for m in back.messages] == [
        "",
        "",
        "I should compute it.",
        "",
        "The tool said 4.",
    ]


def test_logprobs_are_stored_as_float32(tmp_path):
    t = per_turn_trajectory()
    t.rollout_logprobs = [-0.1 * i for i in range(len(t.token_ids))]
    (back,) = read_trajectories(RunDir(tmp_path).save_trajectories(1, [t]))
    assert back.rollout_logprobs == pytest.approx(t.rollout_logprobs, rel=1e-6)


def test_file_without_new_columns_reads_with_defaults(tmp_path):
    """A file written before ``strategy``/``sample_starts``/``tool_calls`` existed still reads."""
    t = per_turn_trajectory()
    path = RunDir(tmp_path).save_trajectories(1, [t])
    table = pq.read_table(path)
    later = ("strategy", "sample_starts", "tool_calls")
    old = table.drop_columns([c for c in later if c in table.column_names])
    pq.write_table(old, path)
    (back,) = read_trajectories(path)
    assert back.strategy == "as_sampled" and back.sample_starts == [] and back.tool_calls == []
    assert back.samples() == [(0, len(t.token_ids))]
    assert back.messages == t.messages
