"""Live red flags and early stop inside the real training loop (``drive``), in-process."""

from __future__ import annotations

import asyncio
import json
import random
from pathlib import Path
from typing import Any

from agentrl import Env, StepResult
from agentrl.config import load_config
from agentrl.orchestration.run import drive
from agentrl.orchestration.startup import Prepared, loop_config
from agentrl.reporting.run_dir import RunDir
from agentrl.rollout import AgentLoop, RolloutRunner
from agentrl.testing.scripted_server import ScriptedLLM, TextPolicy

TASKS = [{"id": f"t{i}"} for i in range(16)]


class CoinEnv(Env):
    def reset(self, task, *, seed=None):
        self.rng = random.Random(seed)
        return f"task {task['id']}"

    def step(self, action):
        return StepResult(reward=float(self.rng.random() < 0.5), terminated=True)


class DriftingTrainer:
    """Reports KL 0.1 on step 1, then 3.0: the policy drifts from step 2 on."""

    def __init__(self) -> None:
        self.steps = 0
        self.checkpoints: list[dict[str, Any]] = []

    def step(self, trajectories):
        self.steps += 1
        return {"reward/mean": 0.5, "kl/ref_kl": 0.1 if self.steps == 1 else 3.0}

    def state_dict_for_inference(self):
        return {"w": self.steps}

    def save_checkpoint(self, root, extra=None):
        self.checkpoints.append(dict(extra or {}))
        path = Path(root) / f"step_{self.steps}"
        path.mkdir(parents=True, exist_ok=True)
        return path

    def save_hf(self, path):
        Path(path).mkdir(parents=True, exist_ok=True)


def test_drift_is_flagged_live_and_the_run_stops_early(tmp_path: Path, tokenizer) -> None:
    cfg = load_config(
        None,
        ["steps=10", "eval.every=0", "eval.num_tasks=2", "wandb=disabled", "save_every=100",
         "rollout.group_size=2", "rollout.tasks_per_step=2", 'early_stop=["kl > 2 for 2 steps"]'],
    )  # fmt: skip
    prep = Prepared(
        cfg, CoinEnv, CoinEnv, TASKS, TASKS[:2], "unused", tokenizer, RunDir(tmp_path),
        loop_config(cfg),
    )  # fmt: skip
    llm = ScriptedLLM(TextPolicy(tokenizer, lambda _: "ok"))
    runner = RolloutRunner(AgentLoop(llm, tokenizer, prep.loop_config), CoinEnv, group_size=2)
    trainer = DriftingTrainer()

    async def push(weights, mode):
        llm.weight_version += 1
        return llm.weight_version

    said: list[str] = []
    result = asyncio.run(
        drive(prep, runner=runner, trainer=trainer, llm=llm, push=push, resume=False,
              say=said.append)
    )  # fmt: skip
    # KL > 2 on steps 2 and 3 → the rule holds after step 3; the run ends there, not at 10.
    reason = "kl > 2 for 2 steps: kl/ref_kl = 3 at step 3 (since step 2)"
    assert result.steps_done == 3 and trainer.steps == 3
    assert result.early_stop == reason and not result.interrupted
    assert trainer.checkpoints[-1]["run"]["early_stop"] == reason
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert summary["early_stop"] == reason and summary["steps"] == 3
    # The red flag was printed once, when it first appeared (after step 3: 2 steps > 2).
    flags = [m for m in said if m.startswith("[red flag]")]
    assert len(flags) == 1 and flags[0].startswith("[red flag] step 2: kl_high")
    assert said.index(flags[0]) < said.index(f"early stop after step 3: {reason}")
