"""Two training steps on the generated ``tiny`` SWE level with real Docker: the episodes run
in containers lent by the run's warm pool, each reward is the fresh-container grader's
verdict on the hidden tests, and no container outlives the run. The Docker grader also
validates a sample of the generated tasks (the unit tests check all of them in-process)."""

from __future__ import annotations

import random

import pytest

from agentrl.config import load_config
from agentrl.envs.swe.ladder import generate_tasks
from agentrl.envs.swe.validate import validate_tasks
from agentrl.orchestration.run import train
from agentrl.reporting.run_dir import RunDir, read_trajectories
from agentrl.sandbox.docker_owner import RUN_ID
from tests.integration import docker_fixtures
from tests.integration.docker_fixtures import containers

docker_image = docker_fixtures.docker_image  # the session fixture, under its own name

pytestmark = [pytest.mark.integration, pytest.mark.timeout(900)]


def _containers() -> list[str]:
    """Containers this process created (other tests may run Docker at the same time)."""
    return containers({"agentrl.run": RUN_ID})


async def test_two_steps_on_tiny_are_graded_in_fresh_containers(
    docker_image, untrained_model_dir, attached_server_url, tmp_path
):
    before = set(_containers())
    overrides = {
        "env": "swe", "model.path": str(untrained_model_dir),
        "inference.urls": f'["{attached_server_url}"]', "output_dir": str(tmp_path),
        "run_name": "t",
        "steps": 2, "task_kwargs.level": "tiny", "env_kwargs.worked_examples": 1,
        "env_kwargs.sandbox_pool_size": 2, "env_kwargs.grader_pool_size": 2,
        "rollout.tasks_per_step": 2, "rollout.group_size": 2, "rollout.max_turns": 2,
        "rollout.max_tokens_per_turn": 24, "rollout.max_total_tokens": 2000,
        "eval.num_tasks": 2, "wandb": "disabled",
    }  # fmt: skip
    cfg = load_config(None, [f"{k}={v}" for k, v in overrides.items()])
    result = await train(cfg, say=lambda _m: None)
    assert result.steps_done == 2
    for step in (1, 2):
        trajs = read_trajectories(result.run_dir / "trajectories" / f"step_{step:06d}.parquet")
        assert len(trajs) == 4
        for t in trajs:
            assert t.info["swe_task"].startswith("tiny-"), t.info["swe_task"]
            # The hidden tests (two of them: the function, its neighbours) ran in the
            # grader's container, and the reward is their verdict.
            ran = t.info["swe_tests_passed"] + t.info["swe_tests_failed"]
            assert ran == 2, (t.stop_reason, t.info)
            assert t.reward == float(t.info["swe_tests_failed"] == 0)
    train_lines = [m for m in RunDir(result.run_dir).metrics() if m["kind"] == "train"]
    assert all(m["episode_mean/swe_grade_time_s"] > 0 for m in train_lines)
    assert all(0 < m["episode_mean/swe_pool_busy"] <= 1 for m in train_lines)  # pool leases
    assert set(_containers()) <= before  # pools and graders removed with the run


async def test_a_sample_of_generated_tasks_is_valid_under_the_docker_grader(docker_image):
    tasks = generate_tasks("train") + generate_tasks("test")
    sample = random.Random(0).sample(tasks, 12)
    results = await validate_tasks(sample, concurrency=2)
    assert [r.message() for r in results if not r.ok] == []
