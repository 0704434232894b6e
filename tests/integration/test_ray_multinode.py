"""A short training run with its components on different nodes of a Ray cluster.

The cluster is three Ray nodes on this machine (``ray.cluster_utils.Cluster``): a
head with no CPUs, node A advertising ``inference`` and node B advertising
``rollout`` and ``trainer`` (two of each). The vLLM replica must land on A, the two
rollout workers and the two trainer workers (one FSDP2 group, gloo) on B; two sync
steps must change the trainer's weights, push them to the replica (weight version 2),
run the second step's episodes on version 1 and return the step metrics.
"""

from __future__ import annotations

import contextlib
import importlib.util
import os
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import httpx
import pytest

from agentrl import Env, Message, StepResult
from agentrl.inference.auth import is_loopback

pytestmark = [pytest.mark.integration]  # one Ray module at a time: tests/conftest.py

MB = 1024 * 1024
HERE = Path(__file__).resolve()


class LengthEnv(Env):
    """One turn; the reward depends on the reply's length, so a group's rewards differ.

    Its run resources stand for a per-worker pool: opened in the process that runs the
    episodes (its pid reaches every env and each trajectory's metrics), and marked in
    ``marks`` when closed.
    """

    max_turns = 1

    def __init__(self, *, marks: str = "", pool_pid: int = 0) -> None:
        self.pool_pid = pool_pid

    @classmethod
    def run_resources(cls, **kw: Any) -> contextlib.AbstractAsyncContextManager[Any] | None:
        @contextlib.asynccontextmanager
        async def pool() -> AsyncIterator[dict[str, Any]]:
            yield {"pool_pid": os.getpid()}
            (Path(kw["marks"]) / f"closed-{os.getpid()}").touch()

        return pool()

    def reset(self, task: dict[str, Any], *, seed: int | None = None) -> list[Message]:
        return [Message.user(f"Say something about {task['topic']}.")]

    def step(self, action: Any) -> StepResult:
        reward = (len(action.text) % 7) / 6.0
        return StepResult(reward=reward, terminated=True, metrics={"pool_pid": self.pool_pid})

    @staticmethod
    def default_tasks(split: str = "train", n: int = 8, seed: int = 0) -> list[dict[str, Any]]:
        return [{"id": f"{split}-{i}", "topic": f"topic {i}"} for i in range(min(n, 16))]


@pytest.fixture
def cluster():
    """Head (0 CPUs) + node A {inference: 1} + node B {rollout: 2, trainer: 2}; torn down after."""
    if importlib.util.find_spec("ray") is None:
        pytest.fail("this test needs Ray (pip install -e '.[ray]')")
    if importlib.util.find_spec("vllm") is None:
        pytest.fail("integration tests need vLLM (pip install -e '.[cpu]')")
    import ray
    from ray.cluster_utils import Cluster

    c = Cluster(
        initialize_head=True,
        head_node_args={"num_cpus": 0, "object_store_memory": 100 * MB},
    )
    try:
        c.add_node(num_cpus=1, resources={"inference": 1}, object_store_memory=200 * MB)
        c.add_node(num_cpus=2, resources={"rollout": 2, "trainer": 2}, object_store_memory=200 * MB)
        c.wait_for_nodes()
        ray.init(address=c.address, namespace="agentrl-test", log_to_driver=False)
        yield c
    finally:
        ray.shutdown()
        c.shutdown()


def _node_with(resource: str) -> str:
    import ray

    nodes = [n["NodeID"] for n in ray.nodes() if n["Alive"] and resource in n["Resources"]]
    assert len(nodes) == 1, nodes
    return str(nodes[0])


async def test_short_training_across_three_nodes(
    cluster: Any, untrained_model_dir: Path, tmp_path: Path
) -> None:
    from agentrl.config import (
        EvalConfig,
        InferenceConfig,
        ModelConfig,
        RolloutConfig,
        RunConfig,
    )
    from agentrl.config.ray import RayConfig, RoleSpec
    from agentrl.orchestration.placement.train import start_deployment, train_on_ray
    from agentrl.reporting.run_dir import read_trajectories
    from agentrl.trainer import OptimConfig, TrainerConfig

    cfg = RunConfig(
        env=f"{HERE}:LengthEnv",
        env_kwargs={"marks": str(tmp_path)},
        steps=2,
        save_every=1,
        output_dir=str(tmp_path),
        run_name="ray",
        model=ModelConfig(path=str(untrained_model_dir)),
        # --enforce-eager: no torch.compile warm-up (the claim is the placement, not speed).
        inference=InferenceConfig(
            max_model_len=1024,
            kv_cache_gb=1,
            startup_timeout_s=420,
            extra_args=["--enforce-eager"],
        ),
        rollout=RolloutConfig(
            tasks_per_step=2,
            group_size=2,
            max_turns=1,
            max_total_tokens=256,
            max_tokens_per_turn=16,
            max_concurrency=8,
            episode_timeout_s=120,
        ),
        eval=EvalConfig(num_tasks=2),
        trainer=TrainerConfig(optim=OptimConfig(lr=1e-4)),
    )
    ray_cfg = RayConfig(
        address=cluster.address,
        rollout=RoleSpec(count=2, num_cpus=0.5, resources={"rollout": 1}, strategy="SPREAD"),
        trainer=RoleSpec(count=2, num_cpus=0.5, resources={"trainer": 1}),  # one FSDP2 group
        placement_timeout_s=60,
        call_timeout_s=300,
    )
    dep = await start_deployment(cfg, ray_cfg, str(untrained_model_dir), str(tmp_path / "logs"))
    try:
        node_a, node_b = _node_with("inference"), _node_with("rollout")
        assert dep.nodes == {
            "inference": [node_a],
            "rollout": [node_b, node_b],
            "trainer": [node_b, node_b],
        }
        assert node_a != node_b
        assert all(u.startswith("http://") for u in dep.urls)
        if not is_loopback(urlsplit(dep.urls[0]).hostname or ""):  # the replica binds node A's IP
            assert dep.fleet.router.api_key  # its dev routes need the run's key
            async with httpx.AsyncClient(timeout=30) as http:
                assert (await http.post(dep.urls[0] + "/pause")).status_code == 401
        before = dep.trainer.weights_checksum()

        steps: list[dict[str, float]] = []
        result = await train_on_ray(
            cfg, ray_cfg, say=lambda _m: None, on_step=lambda _s, m: steps.append(m),
            deployment=dep,
        )  # fmt: skip

        assert result.steps_done == 2 and not result.interrupted
        assert len(steps) == 2
        for i, m in enumerate(steps, 1):
            assert m["groups"] == 2.0 and m["step"] == float(i) and "optim/lr" in m, sorted(m)
        assert [m["weight_version"] for m in steps] == [1.0, 2.0]
        assert dep.fleet.weight_version == 2
        assert dep.trainer.weights_checksum() != before
        # The second step's episodes were generated by the replica on the pushed weights.
        second = read_trajectories(result.run_dir / "trajectories" / "step_000002.parquet")
        versions = {
            v for t in second for v, m in zip(t.weight_versions, t.loss_mask, strict=True) if m
        }
        assert versions == {1}, versions
        first = read_trajectories(result.run_dir / "trajectories" / "step_000001.parquet")
        pools = {int(t.metrics["pool_pid"]) for t in [*first, *second]}
        info = await dep.info()
        assert info["replicas"][0]["node_id"] == node_a
        assert [w["node_id"] for w in info["rollout_workers"]] == [node_b, node_b]
        done = [w["groups_done"] for w in info["rollout_workers"]]
        assert min(done) >= 1 and sum(done) >= 4, done  # least-busy dispatch used both
        assert (result.run_dir / "final_model" / "config.json").is_file()
        assert any((result.run_dir / "checkpoints").iterdir())
    finally:
        await dep.close()
    # Each rollout worker opened the env's run resources in its own process (not the
    # driver), gave them to every env it made, and closed them when the deployment closed.
    assert len(pools) == 2 and os.getpid() not in pools and 0 not in pools, pools
    assert {n for n in os.listdir(tmp_path) if n.startswith("closed-")} == {
        f"closed-{p}" for p in pools
    }
