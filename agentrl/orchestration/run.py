"""``agentrl train``: builds every component from a RunConfig and runs the driver.

Order of start-up, so that a bad input fails before anything expensive starts:
config → env spec → tasks → model → run directory → inference servers → trainer.
A crash in any component stops the run with the component named; the last
checkpoint stays valid, and ``agentrl train --resume RUN_DIR`` continues.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import signal
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from agentrl.config import RunConfig, dump_config, load_config
from agentrl.data import read_rows
from agentrl.env import Env
from agentrl.llm import SamplingParams
from agentrl.logging.run_dir import RunDir
from agentrl.orchestration.driver import Driver
from agentrl.orchestration.evaluate import evaluate
from agentrl.orchestration.tasks import TaskStream
from agentrl.rollout import AgentLoop, LoopConfig, RolloutRunner

__all__ = ["ComponentError", "RunResult", "load_tasks_for", "train"]


class ComponentError(RuntimeError):
    """A component of the run failed; the message names it."""


@dataclass
class RunResult:
    """What a finished (or interrupted) run leaves behind."""

    run_dir: Path
    steps_done: int
    eval_before: dict[str, float]
    eval_after: dict[str, float]
    interrupted: bool = False


def load_tasks_for(
    cfg: RunConfig, env_cls: type[Env]
) -> tuple[list[Mapping[str, Any]], list[Mapping[str, Any]]]:
    """Train and held-out tasks: from ``cfg.tasks`` or the env's ``default_tasks``.

    A task file is read with the env's ``load_tasks(path)`` when it has one (which
    validates each row), else as plain rows; the first tenth (at most
    ``eval.num_tasks``) is held out.
    """
    if cfg.tasks:
        loader = getattr(env_cls, "load_tasks", None)
        rows = loader(cfg.tasks) if loader else [r for _, r in read_rows(cfg.tasks)]
        n_eval = min(cfg.eval.num_tasks, max(1, len(rows) // 10))
        return rows[n_eval:], rows[:n_eval]
    default = getattr(env_cls, "default_tasks", None)
    if default is None:
        raise ValueError(
            f"env {cfg.env!r} has no built-in tasks (no default_tasks); give a task file "
            "with tasks=PATH"
        )
    train_rows = default(split="train", n=4096, seed=cfg.seed)
    eval_rows = default(split="test", n=cfg.eval.num_tasks, seed=cfg.seed)
    return train_rows, eval_rows


def loop_config(cfg: RunConfig) -> LoopConfig:
    r = cfg.rollout
    return LoopConfig(
        max_turns=r.max_turns,
        max_total_tokens=r.max_total_tokens,
        max_tokens_per_turn=r.max_tokens_per_turn,
        episode_timeout_s=r.episode_timeout_s,
        sampling=SamplingParams(temperature=r.temperature, top_p=r.top_p),
        tool_timeout_s=r.tool_timeout_s,
        max_tool_output_chars=r.max_tool_output_chars,
    )


def _model_dir(cfg: RunConfig, say: Callable[[str], None]) -> str:
    if cfg.model.path:
        return cfg.model.path
    from agentrl.models.tiny import TinyRecipe, ensure_tiny_model

    return str(ensure_tiny_model(TinyRecipe(seed=cfg.model.tiny_seed), log=say))


async def _fleet(cfg: RunConfig, model_dir: str, run: RunDir) -> Any:
    from agentrl.inference.fleet import Fleet
    from agentrl.inference.server import ServerConfig

    inf = cfg.inference
    if inf.urls:
        return await Fleet.attach(inf.urls)
    server = ServerConfig(
        model=model_dir,
        max_model_len=inf.max_model_len,
        kv_cache_gib=max(1, round(inf.kv_cache_gb)),
        gpu_memory_utilization=inf.gpu_memory_utilization,
        startup_timeout_s=inf.startup_timeout_s,
        extra_args=tuple(inf.extra_args),
        log_dir=str(run.path / "logs"),
    )
    return await Fleet.launch(server, inf.num_servers)


def _checkpoint(trainer: Any, run: RunDir, driver: Driver, extra: dict[str, Any]) -> Path:
    state = {"step": driver.step, "stream": driver.stream.state_dict(), **extra}
    return Path(trainer.save_checkpoint(run.checkpoints, extra={"run": state}))


async def train(
    cfg: RunConfig,
    *,
    resume: str | Path | None = None,
    say: Callable[[str], None] = print,
    on_step: Callable[[int, dict[str, float]], None] | None = None,
) -> RunResult:
    """Runs training as configured. See the module docstring for the order of start-up."""
    if cfg.ray.address is not None:
        from agentrl.orchestration.ray_train import train_on_ray

        return await train_on_ray(cfg, cfg.ray, resume=resume, say=say, on_step=on_step)
    from agentrl.env_registry import resolve_env

    env_cls = resolve_env(cfg.env)
    train_rows, eval_rows = load_tasks_for(cfg, env_cls)

    def env_factory() -> Env:
        return env_cls(**cfg.env_kwargs)

    model_dir = _model_dir(cfg, say)
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    if resume:
        run = RunDir(resume)
    else:
        name = cfg.run_name or time.strftime("%Y%m%d-%H%M%S")
        run = RunDir(Path(cfg.output_dir) / name)
        dump_config(cfg, run.path / "config.yaml")
    say(f"run directory: {run.path}")
    lcfg = loop_config(cfg)
    AgentLoop(_NoLLM(), tokenizer, lcfg)  # refuses a bad chat template before servers start

    from agentrl.trainer import Trainer

    fleet = await _fleet(cfg, model_dir, run)
    try:
        trainer = await asyncio.to_thread(Trainer, cfg.trainer, model_dir)
        stream = TaskStream(train_rows, seed=cfg.seed)
        runner = RolloutRunner(
            AgentLoop(fleet, tokenizer, lcfg),
            env_factory,
            group_size=cfg.rollout.group_size,
            max_concurrency=cfg.rollout.max_concurrency,
        )

        async def sync(weights: dict[str, Any], mode: str) -> int:
            try:
                report = await fleet.sync_weights(weights, mode=mode)
            except Exception as e:
                raise ComponentError(f"weight sync failed: {e!r}") from e
            return int(report.version)

        stop = asyncio.Event()
        driver = Driver(
            runner,
            trainer,
            sync,
            stream,
            cfg.orchestration,
            tasks_per_step=cfg.rollout.tasks_per_step,
            seed=cfg.seed,
            stop=stop,
        )
        if resume:
            extra = await asyncio.to_thread(trainer.load_checkpoint, run.checkpoints)
            state = extra.get("run", {})
            driver.step = int(state.get("step", 0))
            stream.load_state_dict(state["stream"])
            await sync(trainer.state_dict_for_inference(), "wait")
            say(f"resumed at step {driver.step}")

        async def run_eval(step: int) -> dict[str, float]:
            res = await evaluate(
                fleet,
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
        interrupted = False
        try:
            async for out in await driver.run(cfg.steps):
                run.log(out.step, out.metrics)
                run.save_trajectories(out.step, out.trajectories)
                if on_step:
                    on_step(out.step, out.metrics)
                if out.step % cfg.save_every == 0:
                    await asyncio.to_thread(_checkpoint, trainer, run, driver, {})
                if cfg.eval.every and out.step % cfg.eval.every == 0 and out.step < cfg.steps:
                    await run_eval(out.step)
            interrupted = stop.is_set()
        except Exception as e:
            with contextlib.suppress(Exception):
                await asyncio.to_thread(_checkpoint, trainer, run, driver, {"crashed": repr(e)})
            component = "weight sync" if isinstance(e, ComponentError) else "trainer"
            raise ComponentError(
                f"{component} failed at step {driver.step + 1}: {e!r}; the last checkpoint "
                f"is kept in {run.checkpoints} (resume with --resume {run.path})"
            ) from e
        finally:
            with contextlib.suppress(NotImplementedError, RuntimeError):
                loop.remove_signal_handler(signal.SIGINT)
        await asyncio.to_thread(_checkpoint, trainer, run, driver, {})
        if interrupted:
            say(f"interrupted: checkpoint saved; continue with --resume {run.path}")
            return RunResult(run.path, driver.step, before, {}, interrupted=True)
        after = await run_eval(driver.step)
        await asyncio.to_thread(trainer.save_hf, run.final_model)
        (run.path / "summary.json").write_text(
            json.dumps({"eval_before": before, "eval_after": after, "steps": driver.step})
        )
        return RunResult(run.path, driver.step, before, after)
    finally:
        await fleet.close()


class _NoLLM:
    async def generate(self, *a: Any, **k: Any) -> Any:
        raise RuntimeError("not for generation")


def train_from_cli(
    config: str | None, overrides: Sequence[str], resume: str | None, say: Callable[[str], None]
) -> RunResult:
    """Loads the config (from the run directory when resuming) and runs :func:`train`."""
    if resume:
        saved = Path(resume) / "config.yaml"
        cfg = load_config(saved if saved.is_file() else config, list(overrides))
    else:
        cfg = load_config(config, list(overrides))
    return asyncio.run(train(cfg, resume=resume, say=say))
