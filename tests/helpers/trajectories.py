"""Trajectories shared by the run-dir, CLI and inspector tests."""

from __future__ import annotations

from agentrl.types import Message, StopReason, ToolCall, Trajectory, TurnSpan


def per_turn_trajectory() -> Trajectory:
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
