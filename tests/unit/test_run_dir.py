"""Run directory: metrics lines and columnar trajectory files that round-trip."""

from __future__ import annotations

import math
from dataclasses import MISSING, fields

import pyarrow.parquet as pq
import pytest

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


def _per_turn_trajectory() -> Trajectory:
    """Two per_turn samples, every Trajectory and Message field off its default."""
    return Trajectory(
        task_id="t2",
        group_id="g2",
        episode_id="g2/1",
        token_ids=[1, 2, 3, 4, 1, 2, 5, 6, 7],
        loss_mask=[0, 0, 1, 1, 0, 0, 0, 1, 1],
        rollout_logprobs=[0.0, 0.0, -0.5, -0.125, 0.0, 0.0, 0.0, -2.0, -0.75],
        weight_versions=[-1, -1, 2, 2, -1, -1, -1, 3, 3],
        prompt_length=2,
        spans=[
            TurnSpan(0, 2, "prompt"),
            TurnSpan(2, 4, "model", 0.5),
            TurnSpan(4, 7, "observation"),
            TurnSpan(7, 9, "model", 1.5),
        ],
        reward=2.0,
        stop_reason=StopReason.MAX_TOKENS,
        messages=[
            Message.system("be brief"),
            Message.user("2+2?"),
            Message(
                "assistant",
                "let me run it",
                (ToolCall("python", {"code": "print(2+2)"}, id="c1"),),
                reasoning="I should compute it.",
            ),
            Message.tool("4", tool_call_id="c1", name="python"),
            Message("assistant", "4", reasoning="The tool said 4."),
        ],
        num_turns=2,
        metrics={"tool_calls": 1.0},
        info={"answer": "4", "nested": {"k": [1, 2]}},
        error="a note",
        strategy="per_turn",
        sample_starts=[0, 4],
        tool_calls=[
            {"turn": 0, "id": "c1", "name": "python", "latency_s": 0.25, "error": None,
             "output_chars": 1}
        ],
    )  # fmt: skip


def test_per_turn_trajectory_round_trips_every_field(tmp_path):
    t = _per_turn_trajectory()
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
    t = _per_turn_trajectory()
    t.rollout_logprobs = [-0.1 * i for i in range(len(t.token_ids))]
    (back,) = read_trajectories(RunDir(tmp_path).save_trajectories(1, [t]))
    assert back.rollout_logprobs == pytest.approx(t.rollout_logprobs, rel=1e-6)


def test_file_without_new_columns_reads_with_defaults(tmp_path):
    """A file written before ``strategy``/``sample_starts``/``tool_calls`` existed still reads."""
    t = _per_turn_trajectory()
    path = RunDir(tmp_path).save_trajectories(1, [t])
    table = pq.read_table(path)
    later = ("strategy", "sample_starts", "tool_calls")
    old = table.drop_columns([c for c in later if c in table.column_names])
    pq.write_table(old, path)
    (back,) = read_trajectories(path)
    assert back.strategy == "as_sampled" and back.sample_starts == [] and back.tool_calls == []
    assert back.samples() == [(0, len(t.token_ids))]
    assert back.messages == t.messages
