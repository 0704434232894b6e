"""Placement errors and rollout-worker failover on a small real Ray instance (no vLLM)."""

from __future__ import annotations

import importlib.util
import os
from typing import Any

import pytest

from agentrl.types import Trajectory

pytestmark = [pytest.mark.integration]  # one Ray module at a time: tests/conftest.py


@pytest.fixture(scope="module")
def local_ray():
    """One Ray node with 2 logical CPUs and {"rollout": 2}; shut down after."""
    if importlib.util.find_spec("ray") is None:
        pytest.fail("this test needs Ray (pip install -e '.[ray]')")
    import ray

    ray.init(
        address="local",  # its own instance, not a cluster another test runs meanwhile
        num_cpus=2,
        resources={"rollout": 2},
        object_store_memory=80 * 1024 * 1024,
        namespace="agentrl-test-placement",
        log_to_driver=False,
        include_dashboard=False,
    )
    try:
        yield ray
    finally:
        ray.shutdown()


class _Worker:
    """Stands in for a RolloutWorker; the one built with ``crash=True`` dies on its first group."""

    def __init__(self, crash: bool) -> None:
        self.crash = crash

    async def run_group(
        self, task: dict[str, Any], index: int, seed: int | None, tag: str
    ) -> list[Trajectory]:
        if self.crash:
            os._exit(1)
        return [Trajectory(task_id=str(index), group_id=tag, episode_id=f"{tag}/0")]


def test_missing_resource_fails_fast_naming_it(local_ray: Any) -> None:
    from agentrl.config.ray import RoleSpec
    from agentrl.orchestration.placement.cluster import PlacementError, create_placement_group

    spec = RoleSpec(count=1, num_cpus=1, resources={"inference": 1})
    with pytest.raises(PlacementError, match=r"inference.*'inference': 1\.0"):
        create_placement_group("inference", spec, timeout_s=2)
    pg = create_placement_group("rollout", RoleSpec(count=2, num_cpus=0.5,
                                resources={"rollout": 1}), timeout_s=30)  # fmt: skip
    assert pg.bundle_count == 2
    local_ray.util.remove_placement_group(pg)


async def test_group_is_resent_when_its_worker_dies(local_ray: Any) -> None:
    from agentrl.orchestration.placement.adapters import RayRolloutRunner

    cls: Any = local_ray.remote(_Worker).options(num_cpus=0.1, max_restarts=0)
    crashing, healthy = cls.remote(True), cls.remote(False)
    runner = RayRolloutRunner([crashing, healthy], group_size=1, timeout_s=60, max_retries=1)
    try:
        group = await runner.run_group({"id": "a"}, index=7, seed=0, tag="t")
        assert [t.task_id for t in group] == ["7"]
        assert runner.dead == {0}
        # Later groups go to the live worker only.
        assert len(await runner.run_group({"id": "b"}, index=8, seed=0, tag="t")) == 1
        assert runner.sent == [1, 2]
    finally:
        for a in (crashing, healthy):
            local_ray.kill(a)


def test_ray_config_rejects_unknown_keys() -> None:
    from pydantic import ValidationError

    from agentrl.config.ray import RayConfig, RoleSpec

    with pytest.raises(ValidationError):
        RayConfig.model_validate({"adress": "auto"})
    assert RoleSpec(num_cpus=2, num_gpus=0, resources={"trainer": 1}).bundle() == {
        "trainer": 1.0,
        "CPU": 2.0,
    }
