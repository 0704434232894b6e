"""``agentrl train`` on a Ray cluster: the same run as :func:`agentrl.orchestration.run.train`,
with the inference replicas, rollout workers and trainer workers as Ray actors.

The driver process (this one) resolves the env and reads the tasks, runs the
:class:`~agentrl.orchestration.driver.Driver`, evaluations, logging and the run
directory. The model directory, the env's code and the run directory must be at
the same path on every node (a shared filesystem, or the same image).
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

from agentrl.config import RunConfig
from agentrl.config.ray import RayConfig
from agentrl.orchestration.placement.cluster import RayDeployment, connect
from agentrl.orchestration.placement.node_loss import (
    NodeLostError,
    node_lost_message,
    trainer_loss,
)
from agentrl.orchestration.startup import (
    Prepared,
    loop_config,
    pin_run,
    preflight_env,
    prepare,
    server_config,
)
from agentrl.orchestration.training import RunResult, drive
from agentrl.trainer.engine.checkpoint import CheckpointError, select_checkpoint

__all__ = ["start_deployment", "train_on_ray"]


async def start_deployment(
    cfg: RunConfig, ray_cfg: RayConfig, model_dir: str, log_dir: str | None = None
) -> RayDeployment:
    """Places and starts the run's actors as ``cfg`` and ``ray_cfg`` say."""
    return await RayDeployment.start(
        ray_cfg,
        server=server_config(cfg, model_dir, log_dir),
        trainer_config=cfg.trainer,
        model_dir=model_dir,
        env_spec=cfg.env,
        env_kwargs=cfg.env_kwargs,
        loop_config=loop_config(cfg),
        group_size=cfg.rollout.group_size,
        max_concurrency=cfg.rollout.max_concurrency,
        request_timeout_s=cfg.inference.request_timeout_s,
    )


async def train_on_ray(
    cfg: RunConfig,
    ray_cfg: RayConfig | None = None,
    *,
    resume: str | Path | None = None,
    say: Callable[[str], None] = print,
    on_step: Callable[[int, dict[str, float]], object] | None = None,
    deployment: RayDeployment | None = None,
) -> RunResult:
    """Runs training with its components on a Ray cluster.

    Args:
        cfg: The run configuration.
        ray_cfg: Where things go (default ``cfg.ray``).
        resume: Run directory to continue.
        say: Progress messages.
        on_step: Called with each step's metrics (an awaitable it returns is awaited).
        deployment: Actors already started (kept running afterwards); default: start
            them from ``cfg`` and stop them at the end.
    """
    ray_cfg = ray_cfg or cfg.ray
    prep = prepare(cfg, resume, say)
    with pin_run(cfg):  # the driver's thread (Ray's actors are placed by Ray, not pinned)
        return await _train_prepared(prep, ray_cfg, resume, say, on_step, deployment)


async def _train_prepared(
    prep: Prepared,
    ray_cfg: RayConfig,
    resume: str | Path | None,
    say: Callable[[str], None],
    on_step: Callable[[int, dict[str, float]], object] | None,
    deployment: RayDeployment | None,
) -> RunResult:
    cfg = prep.cfg
    await preflight_env(prep.env_cls, cfg.env_kwargs)
    owned = deployment is None
    shutdown = False
    if deployment is None:
        shutdown = connect(ray_cfg)
        say(f"placing actors on the Ray cluster ({ray_cfg.address})")
        try:
            deployment = await start_deployment(
                cfg, ray_cfg, prep.model_dir, str(prep.run.path / "logs")
            )
        except BaseException:
            _shutdown(shutdown)
            raise
    dep = deployment
    say(f"actors placed: {json.dumps(dep.nodes)}")
    try:
        return await drive(
            prep,
            runner=dep.runner,
            trainer=dep.trainer,
            llm=dep.fleet,
            push=dep.sync,
            resume=bool(resume),
            say=say,
            on_step=on_step,
        )
    except Exception as e:
        cause = await trainer_loss(dep.trainer_workers, dep.nodes.get("trainer", []))
        if cause is None:
            raise
        raise NodeLostError(
            node_lost_message(cause, prep.run.path, _newest(prep.run.checkpoints),
                              ray_cfg.trainer.bundle())
        ) from e  # fmt: skip
    finally:
        if owned:
            await dep.close()
            _shutdown(shutdown)


def _newest(checkpoints: Path) -> str:
    try:
        return str(select_checkpoint(checkpoints))
    except CheckpointError:
        return f"none (nothing in {checkpoints}: the run starts again from step 0)"


def _shutdown(initialized_here: bool) -> None:
    if initialized_here:
        import ray

        ray.shutdown()
