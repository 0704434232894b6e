"""Crash / resume of a run (issue #18): checkpoints hold one step's state; resumes keep bounds.

The run is the real ``drive`` loop (driver, task stream, run directory, checkpoint
files) with an in-process policy; the trainer is a counter whose whole state (its
step and every task index it trained on) goes through the checkpoint, so a task
trained twice or lost across the crash shows up in what it recorded.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from agentrl.config import OrchestrationConfig
from agentrl.orchestration.driver import Driver
from agentrl.orchestration.startup import ComponentError
from agentrl.orchestration.tasks import TaskStream
from agentrl.reporting.run_dir import RunDir
from agentrl.rollout import AgentLoop, RolloutRunner
from agentrl.testing.scripted_server import ScriptedLLM, TextPolicy
from tests.helpers.disk import small_disk
from tests.helpers.drive import TASKS, CoinEnv, CountingTrainer, run_drive


def _train_steps(run: Path) -> list[int]:
    return [m["step"] for m in RunDir(run).metrics() if m["kind"] == "train"]


@pytest.mark.parametrize("mode", ["sync", "fully_async"])
def test_a_failed_weight_push_after_step_n_resumes_without_repeating_or_losing_tasks(
    tmp_path: Path, tokenizer, mode: str
) -> None:
    # The second push (after the trainer's step 2) fails: the run stops with a message.
    with pytest.raises(ComponentError, match="weight sync failed") as err:
        run_drive(
            tmp_path, tokenizer, CountingTrainer(), mode=mode, steps=4, resume=False, fail_push=2
        )
    assert "resume with --resume" in str(err.value)

    resumed = CountingTrainer()
    result, said = run_drive(tmp_path, tokenizer, resumed, mode=mode, steps=4, resume=True)
    assert result.steps_done == 4
    # The trainer's own record, carried through the checkpoint: 4 updates, no task twice.
    flat = [i for step in resumed.trained for i in step]
    assert len(flat) == len(set(flat)) == 8, resumed.trained
    assert len(resumed.trained) == 4 and resumed.global_step == 4
    # fully_async pushes step 2's weights while step 3 trains (overlap_push): the failure
    # surfaces after step 3's update, which is then checkpointed with its tasks.
    at = 2 if mode == "sync" else 3
    assert any(m.startswith("resumed from ") and f"at step {at}" in m for m in said), said
    # Step numbers: each once, in order; the trainer's step agrees with the run's.
    assert _train_steps(tmp_path) == [1, 2, 3, 4]
    tasks = [json.loads(x) for x in (tmp_path / "tasks.jsonl").read_text().splitlines()]
    assert [t["step"] for t in tasks] == [1, 2, 3, 4]
    logged = [i for t in tasks for i in t["tasks"]]
    assert sorted(logged) == sorted(flat)
    if mode == "sync":  # nothing skipped either
        assert sorted(flat) == list(range(8))


def test_a_trainer_failing_mid_update_saves_no_checkpoint_and_resume_redoes_the_step(
    tmp_path: Path, tokenizer
) -> None:
    with pytest.raises(ComponentError) as err:
        run_drive(tmp_path, tokenizer, CountingTrainer(fail_update=2), mode="sync", steps=3,
             resume=False)  # fmt: skip
    # No checkpoint of the half-applied update; the message says so and names the good one.
    assert (tmp_path / "checkpoints" / "latest").read_text() == "step_1"
    assert "mid-update" in str(err.value) and "step_1" in str(err.value)
    resumed = CountingTrainer()
    result, _ = run_drive(tmp_path, tokenizer, resumed, mode="sync", steps=3, resume=True)
    assert result.steps_done == 3 and resumed.global_step == 3
    assert resumed.trained == [[0, 1], [2, 3], [4, 5]]  # the half-done update is not kept
    assert _train_steps(tmp_path) == [1, 2, 3]


def test_resume_moves_log_lines_of_unsaved_steps_aside(tmp_path: Path, tokenizer) -> None:
    run_drive(tmp_path, tokenizer, CountingTrainer(), mode="sync", steps=2, resume=False)
    # As if the process was killed after logging step 3 but before its checkpoint.
    run = RunDir(tmp_path)
    run.log(3, {"loss": 1.0})
    with (tmp_path / "tasks.jsonl").open("a") as f:
        f.write(json.dumps({"step": 3, "tasks": [4, 5]}) + "\n")
    resumed = CountingTrainer()
    _, said = run_drive(tmp_path, tokenizer, resumed, mode="sync", steps=4, resume=True)
    assert _train_steps(tmp_path) == [1, 2, 3, 4]
    assert any("superseded.jsonl" in m for m in said)
    superseded = (tmp_path / "superseded.jsonl").read_text().splitlines()
    assert len(superseded) == 2 and all('"step": 3' in x or '"step":3' in x for x in superseded)


async def test_fully_async_resume_keeps_the_staleness_bound_from_its_first_step(
    tokenizer,
) -> None:
    llm = ScriptedLLM(TextPolicy(tokenizer, lambda _: "ok"))
    runner = RolloutRunner(AgentLoop(llm, tokenizer), CoinEnv, group_size=2)
    started: list[int] = []
    real_group = runner.run_group

    async def run_group(task: Any, **kw: Any):
        started.append(llm.weight_version)
        return await real_group(task, **kw)

    runner.run_group = run_group  # type: ignore[method-assign]
    trained: list[int] = []

    class Trainer:
        def step(self, trajectories):
            trained.append(len(started))
            return {}

        def state_dict_for_inference(self):
            return {}

    async def sync(weights, mode):
        llm.weight_version += 1
        return llm.weight_version

    cfg = OrchestrationConfig(mode="fully_async", max_staleness=1)
    driver = Driver(runner, Trainer(), sync, TaskStream(TASKS), cfg, tasks_per_step=4)
    driver.step = 8  # as after loading a step-8 checkpoint
    llm.weight_version = driver.version = 1  # the checkpoint's weights were pushed on resume
    outs = [o async for o in await driver.run(11)]
    assert [o.step for o in outs] == [9, 10, 11]
    # Before the first update only (1 + max_staleness) batches may have started.
    assert trained[0] <= (1 + 1) * 4, trained
    # The bound is on starts, counted from the checkpoint's step: the k-th group may start
    # once (k // 4) - 1 of this run's steps are pushed, i.e. on weights of version
    # 1 + that or newer. (A group finishing after later ones is trained later; how stale
    # it is then depends on the machine's timing, and staleness/max reports it.)
    assert len(started) >= 12
    assert all(v >= k // 4 for k, v in enumerate(started)), started


def test_a_full_disk_at_a_checkpoint_stops_the_run_with_one_message_and_resume_works(
    tmp_path: Path, tokenizer
) -> None:
    disk = tmp_path / "disk"
    with small_disk(disk, 1600 << 10) as (_, fill, grow):
        run = disk / "run"
        with pytest.raises(ComponentError) as err:
            run_drive(run, tokenizer, CountingTrainer(blob=1 << 20), mode="sync", steps=3,
                 resume=False, on_step=lambda step, _m: fill() if step == 2 else None)  # fmt: skip
        msg = str(err.value)
        assert msg.startswith("checkpoint at step 2 failed: disk full:"), msg
        assert str(run / "checkpoints" / "step_2") in msg
        assert f"the last good checkpoint is {run / 'checkpoints' / 'step_1'}" in msg
        assert sorted(p.name for p in (run / "checkpoints").iterdir()) == ["latest", "step_1"]
        grow()  # space freed: the run resumes from step 1 and trains each task once
        resumed = CountingTrainer(blob=1 << 20)
        result, _ = run_drive(run, tokenizer, resumed, mode="sync", steps=3, resume=True)
        assert result.steps_done == 3 and resumed.trained == [[0, 1], [2, 3], [4, 5]]
        assert _train_steps(run) == [1, 2, 3]


def test_attached_servers_get_the_trainers_weights_before_generating(
    tmp_path: Path, tokenizer
) -> None:
    loaded: list[tuple[dict, int]] = []

    async def initial_push(llm: ScriptedLLM, weights: dict) -> int:
        loaded.append((weights, len(llm.requests)))  # requests sampled before it
        return llm.weight_version  # the starting weights keep the starting version

    trainer = CountingTrainer()
    run_drive(tmp_path, tokenizer, trainer, mode="sync", steps=1, resume=False,
         initial_push=initial_push)  # fmt: skip
    assert loaded == [({"w": 0}, 0)]  # the trainer's starting weights, before any sample
    lines = [m for m in RunDir(tmp_path).metrics() if m["kind"] == "train"]
    assert lines[0]["weight_version"] == 1.0  # numbering unchanged: v0 start, v1 after step 1
