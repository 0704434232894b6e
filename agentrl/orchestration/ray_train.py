"""``agentrl train`` on a Ray cluster: the same run as :func:`agentrl.orchestration.run.train`,
with the inference replicas, rollout workers and trainer workers as Ray actors.

The driver process (this one) resolves the env and reads the tasks, runs the
:class:`~agentrl.orchestration.driver.Driver`, evaluations, logging and the run
directory. The model directory, the env's code and the run directory must be at
the same path on every node (a shared filesystem, or the same image).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import signal
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from agentrl.config import RunConfig, dump_config
from agentrl.logging.run_dir import RunDir
from agentrl.orchestration.driver import Driver
from agentrl.orchestration.evaluate import evaluate
from agentrl.orchestration.ray_cluster import RayDeployment, connect
from agentrl.orchestration.ray_config import RayConfig
from agentrl.orchestration.run import (
    ComponentError,
    RunResult,
    _checkpoint,
    _model_dir,
    _NoLLM,
    load_tasks_for,
    loop_config,
)
from agentrl.orchestration.tasks import TaskStream
from agentrl.rollout import AgentLoop

__all__ = ["start_deployment", "train_on_ray"]


async def start_deployment(
    cfg: RunConfig, ray_cfg: RayConfig, model_dir: str, log_dir: str | None = None
) -> RayDeployment:
    """Places and starts the run's actors as ``cfg`` and ``ray_cfg`` say."""
    from agentrl.inference.server import ServerConfig

    inf = cfg.inference
    server = ServerConfig(
        model=model_dir,
        max_model_len=inf.max_model_len,
        kv_cache_gib=max(1, round(inf.kv_cache_gb)),
        gpu_memory_utilization=inf.gpu_memory_utilization,
        startup_timeout_s=inf.startup_timeout_s,
        extra_args=tuple(inf.extra_args),
        log_dir=log_dir,
    )
    return await RayDeployment.start(
        ray_cfg,
        server=server,
        trainer_config=cfg.trainer,
        model_dir=model_dir,
        env_spec=cfg.env,
        env_kwargs=cfg.env_kwargs,
        loop_config=loop_config(cfg),
        group_size=cfg.rollout.group_size,
        max_concurrency=cfg.rollout.max_concurrency,
        request_timeout_s=inf.request_timeout_s,
    )


async def train_on_ray(
    cfg: RunConfig,
    ray_cfg: RayConfig | None = None,
    *,
    resume: str | Path | None = None,
    say: Callable[[str], None] = print,
    on_step: Callable[[int, dict[str, float]], None] | None = None,
    deployment: RayDeployment | None = None,
) -> RunResult:
    """Runs training with its components on a Ray cluster.

    Args:
        cfg: The run configuration.
        ray_cfg: Where things go (default ``cfg.ray``).
        resume: Run directory to continue.
        say: Progress messages.
        on_step: Called with each step's metrics.
        deployment: Actors already started (kept running afterwards); default: start
            them from ``cfg`` and stop them at the end.
    """
    from agentrl.env_registry import resolve_env

    ray_cfg = ray_cfg or cfg.ray
    env_cls = resolve_env(cfg.env)
    train_rows, eval_rows = load_tasks_for(cfg, env_cls)

    def env_factory() -> Any:
        return env_cls(**cfg.env_kwargs)

    model_dir = _model_dir(cfg, say)
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    if resume:
        run = RunDir(resume)
    else:
        run = RunDir(Path(cfg.output_dir) / (cfg.run_name or time.strftime("%Y%m%d-%H%M%S")))
        dump_config(cfg, run.path / "config.yaml")
    say(f"run directory: {run.path}")
    lcfg = loop_config(cfg)
    AgentLoop(_NoLLM(), tokenizer, lcfg)  # refuses a bad chat template before actors start

    owned = deployment is None
    shutdown = False
    if deployment is None:
        shutdown = connect(ray_cfg)
        say(f"placing actors on the Ray cluster ({ray_cfg.address})")
        try:
            deployment = await start_deployment(cfg, ray_cfg, model_dir, str(run.path / "logs"))
        except BaseException:
            _shutdown(shutdown)
            raise
    dep = deployment
    say(f"actors placed: {json.dumps(dep.nodes)}")
    try:
        stream = TaskStream(train_rows, seed=cfg.seed)

        async def sync(weights: dict[str, Any], mode: str) -> int:
            try:
                return await dep.sync(weights, mode)
            except Exception as e:
                raise ComponentError(f"weight sync failed: {e!r}") from e

        stop = asyncio.Event()
        driver = Driver(
            dep.runner,
            dep.trainer,
            sync,
            stream,
            cfg.orchestration,
            tasks_per_step=cfg.rollout.tasks_per_step,
            seed=cfg.seed,
            stop=stop,
        )
        if resume:
            extra = await asyncio.to_thread(dep.trainer.load_checkpoint, run.checkpoints)
            state = extra.get("run", {})
            driver.step = int(state.get("step", 0))
            stream.load_state_dict(state["stream"])
            await sync(await asyncio.to_thread(dep.trainer.state_dict_for_inference), "wait")
            say(f"resumed at step {driver.step}")

        async def run_eval(step: int) -> dict[str, float]:
            res = await evaluate(
                dep.fleet,
                tokenizer,
                env_factory,
                eval_rows,
                lcfg,
                k=cfg.eval.samples_per_task,
                temperature=cfg.eval.temperature,
                success_threshold=cfg.eval.success_threshold,
                max_concurrency=cfg.rollout.max_concurrency,
            )
            run.log(step, res, kind="eval")
            say(f"eval @ step {step}: success {res['success']:.3f}")
            return res

        before = await run_eval(driver.step) if not resume else {}
        loop = asyncio.get_running_loop()
        with contextlib.suppress(NotImplementedError, RuntimeError):
            loop.add_signal_handler(signal.SIGINT, stop.set)
        try:
            async for out in await driver.run(cfg.steps):
                run.log(out.step, out.metrics)
                run.save_trajectories(out.step, out.trajectories)
                if on_step:
                    on_step(out.step, out.metrics)
                if out.step % cfg.save_every == 0:
                    await asyncio.to_thread(_checkpoint, dep.trainer, run, driver, {})
                if cfg.eval.every and out.step % cfg.eval.every == 0 and out.step < cfg.steps:
                    await run_eval(out.step)
            interrupted = stop.is_set()
        except Exception as e:
            with contextlib.suppress(Exception):
                await asyncio.to_thread(_checkpoint, dep.trainer, run, driver, {"crashed": repr(e)})
            component = "weight sync" if isinstance(e, ComponentError) else "trainer or rollout"
            raise ComponentError(
                f"{component} failed at step {driver.step + 1}: {e!r}; the last checkpoint "
                f"is kept in {run.checkpoints} (resume with --resume {run.path})"
            ) from e
        finally:
            with contextlib.suppress(NotImplementedError, RuntimeError):
                loop.remove_signal_handler(signal.SIGINT)
        await asyncio.to_thread(_checkpoint, dep.trainer, run, driver, {})
        if interrupted:
            say(f"interrupted: checkpoint saved; continue with --resume {run.path}")
            return RunResult(run.path, driver.step, before, {}, interrupted=True)
        after = await run_eval(driver.step)
        await asyncio.to_thread(dep.trainer.save_hf, run.final_model)
        (run.path / "summary.json").write_text(
            json.dumps({"eval_before": before, "eval_after": after, "steps": driver.step})
        )
        return RunResult(run.path, driver.step, before, after)
    finally:
        if owned:
            await dep.close()
            _shutdown(shutdown)


def _shutdown(initialized_here: bool) -> None:
    if initialized_here:
        import ray

        ray.shutdown()
