"""The real ``drive`` loop with an in-process policy and a counting trainer.

The trainer records the stream index of every group it trains on, and its whole state
goes through the checkpoint, so a task trained twice or lost across a crash shows up.
Used by the resume and heap tests of the orchestration.
"""

from __future__ import annotations

import asyncio
import random
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import torch

from agentrl import Env, StepResult
from agentrl.config import load_config
from agentrl.orchestration.run import drive
from agentrl.orchestration.startup import Prepared, loop_config
from agentrl.reporting.run_dir import RunDir
from agentrl.rollout import AgentLoop, RolloutRunner
from agentrl.testing.scripted_server import ScriptedLLM, TextPolicy
from agentrl.trainer.engine.checkpoint import atomic_checkpoint_dir

TASKS: list[Mapping[str, Any]] = [{"id": f"t{i}"} for i in range(64)]


class CoinEnv(Env):
    def reset(self, task, *, seed=None):
        self.rng = random.Random(seed)
        return f"task {task['id']}"

    async def step(self, action):
        await asyncio.sleep(0.001 * self.rng.randint(0, 3))
        return StepResult(reward=float(self.rng.random() < 0.5), terminated=True)


class CountingTrainer:
    """Trains by recording task indices; its state is saved and loaded like a real trainer's."""

    def __init__(self, fail_update: int | None = None, blob: int = 0) -> None:
        self.blob = torch.zeros(blob // 4)  # makes checkpoints this big
        self.global_step = 0
        self.trained: list[list[int]] = []  # per update: stream indices of its groups
        self.fail_update = fail_update

    def step(self, trajectories):
        indices = sorted({int(t.group_id.split(":")[1]) for t in trajectories})
        if self.fail_update == self.global_step + 1:
            self.trained.append(indices)  # half-applied: the state changed, then it failed
            raise RuntimeError("update failed midway")
        self.trained.append(indices)
        self.global_step += 1
        return {"loss": 0.0, "step": float(self.global_step)}

    def state_dict_for_inference(self):
        return {"w": self.global_step}

    def save_checkpoint(self, root, extra=None):
        state = {"global_step": self.global_step, "trained": self.trained, "extra": extra or {}}

        def write(d: Path) -> None:
            with open(d / "trainer_state.pt", "wb") as f:
                torch.save({**state, "blob": self.blob}, f)

        return atomic_checkpoint_dir(root, self.global_step, write)

    def load_checkpoint(self, path):
        path = Path(path)
        if not (path / "trainer_state.pt").is_file():  # a root: its latest
            path = path / (path / "latest").read_text().strip()
        state = torch.load(path / "trainer_state.pt", weights_only=False)
        self.global_step, self.trained = state["global_step"], state["trained"]
        return state["extra"]

    def save_hf(self, path):
        Path(path).mkdir(parents=True, exist_ok=True)


def _prep(tmp: Path, tokenizer, mode: str, steps: int) -> Prepared:
    cfg = load_config(
        None,
        [f"steps={steps}", "eval.every=0", "eval.num_tasks=2", "wandb=disabled", "save_every=1",
         "rollout.group_size=2", "rollout.tasks_per_step=2", f"orchestration.mode={mode}",
         "orchestration.max_staleness=1"],
    )  # fmt: skip
    return Prepared(
        cfg, CoinEnv, CoinEnv, TASKS, TASKS[:2], "unused", tokenizer, RunDir(tmp),
        loop_config(cfg),
    )  # fmt: skip


def run_drive(
    tmp,
    tokenizer,
    trainer,
    *,
    mode,
    steps,
    resume,
    fail_push=None,
    on_step=None,
    initial_push=None,
):
    prep = _prep(tmp, tokenizer, mode, steps)
    llm = ScriptedLLM(TextPolicy(tokenizer, lambda _: "ok"))
    runner = RolloutRunner(AgentLoop(llm, tokenizer, prep.loop_config), CoinEnv, group_size=2)
    pushes = 0

    async def push(weights, pause_mode):
        nonlocal pushes
        pushes += 1
        if pushes == fail_push:
            raise ConnectionError("server hung up during the weight sync")
        llm.weight_version += 1
        return llm.weight_version

    said: list[str] = []
    coro = drive(
        prep, runner=runner, trainer=trainer, llm=llm, push=push, resume=resume, say=said.append,
        on_step=on_step, initial_push=initial_push and (lambda w: initial_push(llm, w)),
    )  # fmt: skip
    return asyncio.run(coro), said
