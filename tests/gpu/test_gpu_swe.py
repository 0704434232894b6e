"""configs/swe-gpu.yaml's machinery on one GPU: a bf16 LoRA policy served by CUDA vLLM,
fully_async with partial rollouts, episodes in Docker sandboxes graded in fresh containers.

The preset's model and SWE-bench images need a hub and a registry; here the untrained tiny
model plays the policy on the generated ``tiny`` ladder (its reward may well be 0: the test
checks that episodes ran in containers, were graded, and that adapter-sized syncs reached
the server). The GPU machine needs a Docker engine (``make docker``)."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests.gpu.conftest import need_gpu_vllm

pytestmark = [pytest.mark.gpu]
ROOT = Path(__file__).resolve().parents[2]


def test_swe_gpu_preset_trains_a_step_with_graded_docker_episodes(tiny_dir, tmp_path):
    need_gpu_vllm()
    if shutil.which("docker") is None or subprocess.run(["docker", "info"]).returncode:
        pytest.fail("the SWE GPU test needs a Docker engine here: run `make docker` first")
    overrides = [
        f"model.path={tiny_dir}", "tasks=null", "eval.tasks=null", "task_kwargs.level=tiny",
        "steps=2", "rollout.tasks_per_step=2", "rollout.group_size=2", "rollout.max_turns=2",
        "rollout.max_total_tokens=2048", "rollout.max_tokens_per_turn=64",
        "inference.max_model_len=4096", "inference.gpu_memory_utilization=0.3",
        "trainer.update.token_budget=4096", "trainer.lora.rank=8", "trainer.lora.alpha=16",
        "eval.num_tasks=2", "eval.every=0", "env_kwargs.sandbox_pool_size=4",
        "env_kwargs.grader_pool_size=2", f"output_dir={tmp_path}", "run_name=swe-gpu",
    ]  # fmt: skip
    cmd = [sys.executable, "-m", "agentrl", "train", "--config", "configs/swe-gpu.yaml"]
    done = subprocess.run([*cmd, *overrides], cwd=ROOT, timeout=1200)
    assert done.returncode == 0
    lines = [json.loads(x) for x in (tmp_path / "swe-gpu" / "metrics.jsonl").read_text().split()]
    train = [m for m in lines if m["kind"] == "train"]
    assert len(train) == 2
    assert all(m.get("episode_mean/swe_grade_time_s", 0) > 0 for m in train)  # graded
    assert 0 < max(m["sync/bytes"] for m in train) < 50e6  # an adapter, not the model
    left = subprocess.run(
        ["docker", "ps", "-q", "--filter", "label=agentrl.sandbox=1"],
        capture_output=True, text=True, check=True,
    )  # fmt: skip
    assert left.stdout.split() == []
