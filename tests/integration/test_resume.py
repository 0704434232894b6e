"""Crash and resume of real `agentrl train` runs (issue #18): SIGKILL after step N, resume.

One real vLLM-CPU server (the untrained tiny model) serves the module; each run
attaches to it with ``inference.urls`` and pushes its own weights first. The run is
killed with SIGKILL once a step is logged (its checkpoint may or may not be on disk
yet: both must resume cleanly), then resumed. ``tasks.jsonl`` (the task indices each
step consumed) and ``metrics.jsonl`` must show every step once, no task twice, and
in sync mode none skipped.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from agentrl.orchestration.run import train_from_cli
from agentrl.reporting.run_dir import RunDir, read_trajectories

pytestmark = [pytest.mark.integration, pytest.mark.timeout(900)]


@pytest.fixture(scope="module")
def server_url(attached_server_url: str) -> str:
    """The session's shared vLLM-CPU server (each run pushes its own weights first)."""
    return attached_server_url


def _args(model_dir: Path, url: str, tmp: Path, mode: str) -> list[str]:
    items = {
        "model.path": str(model_dir),
        "inference.urls": f'["{url}"]',
        "output_dir": str(tmp),
        "run_name": "r",
        "steps": 50,
        "save_every": 1,
        "rollout.tasks_per_step": 2,
        "rollout.group_size": 2,
        "rollout.max_turns": 1,
        "rollout.max_tokens_per_turn": 8,
        "rollout.max_total_tokens": 384,
        "eval.num_tasks": 1,
        "eval.every": 0,
        "orchestration.mode": mode,
        "orchestration.max_staleness": 1,
        "wandb": "disabled",
        # retool's preset shows SmolLM2 three worked examples: they alone would fill this
        # test's 384-token episodes, and the untrained tiny model needs no teaching.
        "env_kwargs.worked_examples": 0,
    }
    return [f"{k}={v}" for k, v in items.items()]


def _tasks(run: Path) -> list[dict]:
    path = run / "tasks.jsonl"
    if not path.is_file():
        return []
    return [json.loads(x) for x in path.read_text().splitlines() if x.strip()]


def _kill_after_step(args: list[str], run: Path, step: int) -> None:
    proc = subprocess.Popen(
        [sys.executable, "-m", "agentrl.cli", "train", *args],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True,
    )  # fmt: skip
    deadline = time.monotonic() + 600
    try:
        while len(_tasks(run)) < step:
            assert proc.poll() is None, proc.stdout.read() if proc.stdout else ""
            assert time.monotonic() < deadline, f"no step {step} within 600 s"
            time.sleep(0.2)
    finally:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.communicate(timeout=60)


@pytest.mark.parametrize("mode", ["sync", "fully_async"])
def test_sigkill_after_step_n_then_resume_trains_each_task_once(
    untrained_model_dir, server_url, tmp_path, mode
):
    run = tmp_path / "r"
    _kill_after_step(_args(untrained_model_dir, server_url, tmp_path, mode), run, step=2)
    killed_at = len(_tasks(run))
    said: list[str] = []
    result = train_from_cli(None, ["steps=4"], str(run), said.append)
    assert result.steps_done == 4 and not result.interrupted
    resumed = [m for m in said if m.startswith("resumed from ")]
    assert len(resumed) == 1, said
    resumed_at = int(resumed[0].split(" at step ")[1].split()[0])
    assert 1 <= resumed_at <= killed_at

    # Every step once, in order, in both logs (steps logged but not checkpointed before
    # the kill were moved aside and trained again).
    tasks = _tasks(run)
    assert [t["step"] for t in tasks] == [1, 2, 3, 4]
    train = [m for m in RunDir(run).metrics() if m["kind"] == "train"]
    assert [m["step"] for m in train] == [1, 2, 3, 4]
    # No task consumed twice across the kill; in sync mode none skipped either.
    flat = [i for t in tasks for i in t["tasks"]]
    assert len(flat) == len(set(flat)) == 8, tasks
    if mode == "sync":
        assert sorted(flat) == list(range(8))
    else:  # the staleness bound holds from the first resumed step (measured after its sync)
        assert all(m["staleness/max"] <= 1 + 1 for m in train[resumed_at:]), train
    # The trajectories of each step are the tasks it logged.
    for t in tasks:
        path = run / "trajectories" / f"step_{t['step']:06d}.parquet"
        got = {int(x.group_id.split(":")[1]) for x in read_trajectories(path)}
        assert got <= set(t["tasks"])


def test_a_corrupt_newest_checkpoint_resumes_from_the_previous_one(
    untrained_model_dir, server_url, tmp_path
):
    run = tmp_path / "r"
    args = [
        a for a in _args(untrained_model_dir, server_url, tmp_path, "sync") if "steps=" not in a
    ]
    first = train_from_cli(None, [*args, "steps=2"], None, lambda _m: None)
    assert first.steps_done == 2
    bad = run / "checkpoints" / "step_2" / "model_policy.pt"
    bad.write_bytes(bad.read_bytes()[:1000])  # truncated, as by a crash of the disk
    said: list[str] = []
    result = train_from_cli(None, ["steps=3"], str(run), said.append)
    assert result.steps_done == 3
    assert any("step_2 is unusable" in m and str(bad) in m for m in said), said
    assert "falling back to checkpoint step_1" in said
    assert any(m.startswith("resumed from ") and "at step 1" in m for m in said), said
    tasks = _tasks(run)
    assert [t["step"] for t in tasks] == [1, 2, 3]
    flat = [i for t in tasks for i in t["tasks"]]
    assert sorted(flat) == list(range(6))  # step 2's tasks trained once more, not twice
