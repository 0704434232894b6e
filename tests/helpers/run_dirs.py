"""A run directory as ``agentrl train`` leaves it, for the inspector's API and CLI tests."""

from __future__ import annotations

from pathlib import Path

from agentrl.models.tokenizer import build_tokenizer
from agentrl.reporting.run_dir import RunDir
from agentrl.types import Message, StopReason, ToolCall, Trajectory, TurnSpan

STOPS = [StopReason.DONE, StopReason.MAX_TOKENS, StopReason.DONE, StopReason.TIMEOUT]


def tool_episode(tok, step: int, k: int) -> Trajectory:
    """Prompt, a model turn with two tool calls, their outputs, a final model turn."""

    def ids(text: str) -> list[int]:
        return tok.encode(text, add_special_tokens=False)

    prompt, turn1 = ids(f"task {k}: what is 6*7?"), ids(" I will call two tools")
    obs, turn2 = ids(" results: 42 and 7"), ids(" the answer is 42")
    tokens = prompt + turn1 + obs + turn2
    a, b, c = len(prompt), len(prompt) + len(turn1), len(prompt) + len(turn1) + len(obs)
    mask = [0] * a + [1] * (b - a) + [0] * (c - b) + [1] * (len(tokens) - c)
    reward = [1.0, 0.0, 0.5, -1.0][k]
    calls = (ToolCall("python", {"code": "6*7"}, id="c1"), ToolCall("calc", {"x": 7}, id="c2"))
    per_turn = k == 2
    return Trajectory(
        task_id=f"math/{k % 2}",
        group_id=f"g{step}",
        episode_id=f"g{step}/{k}",
        token_ids=tokens,
        loss_mask=mask,
        rollout_logprobs=[-0.25 * (i % 3) if m else 0.0 for i, m in enumerate(mask)],
        weight_versions=[step if m else -1 for m in mask],
        prompt_length=a,
        spans=[
            TurnSpan(0, a, "prompt"),
            TurnSpan(a, b, "model", 0.0),
            TurnSpan(b, c, "observation"),
            TurnSpan(c, len(tokens), "model", reward),
        ],
        reward=reward,
        stop_reason=STOPS[k],
        messages=[
            Message.user(f"task {k}: what is 6*7?"),
            Message.assistant("I will call two tools", calls),
            # Outputs in the other order than the calls: paired by id, not position.
            Message.tool("7", tool_call_id="c2", name="calc"),
            Message.tool("42", tool_call_id="c1", name="python"),
            Message.assistant("the answer is 42"),
        ],
        num_turns=2,
        metrics={"tool_time_s": 0.5, "tool_calls": 2.0, "tool_errors": 0.0},
        info={"answer": "42"},
        error="Traceback: boom" if k == 3 else None,
        strategy="per_turn" if per_turn else "as_sampled",
        sample_starts=[0, b] if per_turn else [],
        # One record per tool message, in message order (as the AgentLoop writes them).
        tool_calls=[
            {"turn": 0, "id": "c2", "name": "calc", "latency_s": 0.125, "error": None,
             "output_chars": 1},
            {"turn": 0, "id": "c1", "name": "python", "latency_s": 0.375,
             "error": "tool_timeouts", "output_chars": 2},
        ] if k != 1 else [],
    )  # fmt: skip


def write_run(path: Path, steps: int = 3, per_step: int = 4) -> RunDir:
    """A run dir as `agentrl train` leaves it: trajectories, metrics (train + eval), config."""
    tok = build_tokenizer(0)
    run = RunDir(path)
    for step in range(1, steps + 1):
        run.save_trajectories(step, [tool_episode(tok, step, k) for k in range(per_step)])
    for step in range(1, 7):  # reward 0 for 6 steps: the dashboard's reward_flat_zero flag
        run.log(step, {"reward/mean": 0.0, "actor/entropy": 1.0 / step, "perf/tokens_per_s": 9.0})
    run.log(3, {"success": 0.25}, kind="eval")
    (path / "config.yaml").write_text("model:\n  path: null\n  tiny_seed: 0\n")
    return run
