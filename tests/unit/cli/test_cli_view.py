"""`agentrl view`: one recorded episode, its template strategy, samples and reasoning."""

from __future__ import annotations

from typer.testing import CliRunner

from agentrl.cli.app import app
from agentrl.reporting.run_dir import RunDir
from agentrl.types import Message, Trajectory
from tests.helpers.trajectories import per_turn_trajectory


def test_view_shows_per_turn_samples_and_reasoning(tmp_path):
    RunDir(tmp_path).save_trajectories(2, [per_turn_trajectory()])
    out = CliRunner().invoke(app, ["view", str(tmp_path)])
    assert out.exit_code == 0, out.output
    assert "strategy per_turn (2 samples)" in out.output
    assert "[assistant reasoning] I should compute it." in out.output
    assert "[assistant reasoning] The tool said 4." in out.output
    assert "[assistant] let me run it" in out.output
    # Reasoning comes before the answer it led to.
    assert out.output.index("The tool said 4.") < out.output.index("[assistant] 4")


def test_view_as_sampled_episode_has_no_sample_count_or_reasoning(tmp_path):
    t = Trajectory(
        task_id="t",
        group_id="g",
        episode_id="g/0",
        token_ids=[1, 2, 3],
        loss_mask=[0, 1, 1],
        rollout_logprobs=[0.0, -0.5, -0.5],
        weight_versions=[-1, 0, 0],
        messages=[Message.user("hi"), Message.assistant("hello")],
    )
    RunDir(tmp_path).save_trajectories(1, [t])
    out = CliRunner().invoke(app, ["view", str(tmp_path), "--step", "1"])
    assert out.exit_code == 0, out.output
    assert "strategy as_sampled\n" in out.output
    assert "samples" not in out.output and "reasoning" not in out.output
    assert "[assistant] hello" in out.output
