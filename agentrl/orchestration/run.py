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
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from agentrl.config import RunConfig, dump_config, load_config
from agentrl.data import read_rows
from agentrl.env import Env, call_maybe_async
from agentrl.inference.weight_sync import PauseMode
from agentrl.llm import LLMClient, SamplingParams
from agentrl.logging.progress import ProgressLog, plot_curve
from agentrl.logging.run_dir import RunDir
from agentrl.orchestration.driver import Driver, GroupRunner
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


def server_config(cfg: RunConfig, model_dir: str, log_dir: str | None) -> Any:
    """The vLLM server settings of ``cfg``."""
    from agentrl.inference.server import ServerConfig

    inf = cfg.inference
    return ServerConfig(
        model=model_dir,
        max_model_len=inf.max_model_len,
        kv_cache_gib=max(1, round(inf.kv_cache_gb)),
        gpu_memory_utilization=inf.gpu_memory_utilization,
        startup_timeout_s=inf.startup_timeout_s,
        extra_args=tuple(inf.extra_args),
        log_dir=log_dir,
    )


async def check_servers(urls: Sequence[str], timeout_s: float = 10.0) -> None:
    """Fails at start-up, naming the servers, when any given server does not answer."""
    import httpx

    async with httpx.AsyncClient(timeout=timeout_s) as http:

        async def one(url: str) -> str | None:
            try:
                r = await http.get(url.rstrip("/") + "/health")
            except httpx.HTTPError as e:
                return f"{url}: {type(e).__name__}: {e}"
            return None if r.status_code == 200 else f"{url}: /health answered {r.status_code}"

        bad = [b for b in await asyncio.gather(*(one(u) for u in urls)) if b]
    if bad:
        raise ComponentError(
            "cannot reach the inference servers given in inference.urls: " + "; ".join(bad)
        )


async def preflight_env(env_cls: type[Env], kwargs: Mapping[str, Any]) -> None:
    """Runs the env class's optional ``preflight(**env_kwargs)`` (e.g. start a sandbox once)."""
    check = getattr(env_cls, "preflight", None)
    if check is None:
        return
    try:
        await call_maybe_async(check, **kwargs)
    except Exception as e:
        raise ComponentError(f"env {env_cls.__name__} cannot start: {e}") from e


def _checkpoint(trainer: Any, run: RunDir, driver: Driver, extra: dict[str, Any]) -> Path:
    state = {"step": driver.step, "stream": driver.stream.state_dict(), **extra}
    return Path(trainer.save_checkpoint(run.checkpoints, extra={"run": state}))


@dataclass
class Prepared:
    """What every run needs before its servers and trainer start."""

    cfg: RunConfig
    env_cls: type[Env]
    env_factory: Callable[[], Env]
    train_rows: list[Mapping[str, Any]]
    eval_rows: list[Mapping[str, Any]]
    model_dir: str
    tokenizer: Any
    run: RunDir
    loop_config: LoopConfig


def prepare(cfg: RunConfig, resume: str | Path | None, say: Callable[[str], None]) -> Prepared:
    """Checks the env, reads the tasks, finds the model and opens the run directory.

    Everything here fails fast, before any server or trainer starts.
    """
    from transformers import AutoTokenizer

    from agentrl.env_registry import resolve_env

    env_cls = resolve_env(cfg.env)
    train_rows, eval_rows = load_tasks_for(cfg, env_cls)

    def env_factory() -> Env:
        return env_cls(**cfg.env_kwargs)

    model_dir = _model_dir(cfg, say)
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    if resume:
        run = RunDir(resume)
    else:
        run = RunDir(Path(cfg.output_dir) / (cfg.run_name or time.strftime("%Y%m%d-%H%M%S")))
        dump_config(cfg, run.path / "config.yaml")
    say(f"run directory: {run.path}")
    lcfg = loop_config(cfg)
    AgentLoop(_NoLLM(), tokenizer, lcfg)  # refuses a bad chat template before servers start
    return Prepared(
        cfg, env_cls, env_factory, train_rows, eval_rows, model_dir, tokenizer, run, lcfg
    )


async def drive(
    prep: Prepared,
    *,
    runner: GroupRunner,
    trainer: Any,
    llm: LLMClient,
    push: Callable[[dict[str, Any], PauseMode], Awaitable[int]],
    resume: bool,
    say: Callable[[str], None],
    on_step: Callable[[int, dict[str, float]], None] | None = None,
) -> RunResult:
    """Evaluates, trains with the :class:`Driver`, checkpoints and evaluates again.

    Args:
        prep: From :func:`prepare`.
        runner: Runs groups of episodes.
        trainer: ``step``, ``state_dict_for_inference``, ``save_checkpoint``,
            ``load_checkpoint``, ``save_hf``.
        llm: The client evaluations sample from.
        push: Pushes weights to the servers (pause mode given), returns the version.
        resume: Continue from the run directory's last checkpoint.
        say: Progress messages.
        on_step: Called with each step's metrics.
    """
    cfg, run = prep.cfg, prep.run

    async def sync(weights: dict[str, Any], mode: PauseMode) -> int:
        try:
            return await push(weights, mode)
        except Exception as e:
            raise ComponentError(f"weight sync failed: {e!r}") from e

    stop = asyncio.Event()
    driver = Driver(
        runner,
        trainer,
        sync,
        TaskStream(prep.train_rows, seed=cfg.seed),
        cfg.orchestration,
        tasks_per_step=cfg.rollout.tasks_per_step,
        seed=cfg.seed,
        stop=stop,
    )
    if resume:
        extra = await asyncio.to_thread(trainer.load_checkpoint, run.checkpoints)
        state = extra.get("run", {})
        driver.step = int(state.get("step", 0))
        driver.stream.load_state_dict(state["stream"])
        await sync(await asyncio.to_thread(trainer.state_dict_for_inference), "wait")
        say(f"resumed at step {driver.step}")

    async def run_eval(step: int) -> dict[str, float]:
        res = await evaluate(
            llm,
            prep.tokenizer,
            prep.env_factory,
            prep.eval_rows,
            prep.loop_config,
            k=cfg.eval.samples_per_task,
            temperature=cfg.eval.temperature,
            success_threshold=cfg.eval.success_threshold,
            max_concurrency=cfg.rollout.max_concurrency,
        )
        run.log(step, res, kind="eval")
        progress.eval(step, res)
        say(f"eval @ step {step}: success {res['success']:.3f}")
        return res

    progress = ProgressLog(
        cfg.steps, run.path, wandb_mode=cfg.wandb, config=cfg.model_dump(mode="json")
    )
    try:
        return await _loop(prep, driver, trainer, run_eval, progress, resume, say, on_step)
    finally:
        progress.close()
        if any(True for _ in run.metrics()):
            plot_curve(run.metrics(), run.path / "curve.png")


async def _loop(
    prep: Prepared,
    driver: Driver,
    trainer: Any,
    run_eval: Callable[[int], Awaitable[dict[str, float]]],
    progress: ProgressLog,
    resume: bool,
    say: Callable[[str], None],
    on_step: Callable[[int, dict[str, float]], None] | None,
) -> RunResult:
    cfg, run, stop = prep.cfg, prep.run, driver.stop
    before = await run_eval(driver.step) if not resume else {}
    loop = asyncio.get_running_loop()
    with contextlib.suppress(NotImplementedError, RuntimeError):
        loop.add_signal_handler(signal.SIGINT, stop.set)
    try:
        async for out in await driver.run(cfg.steps):
            run.log(out.step, out.metrics)
            progress.step(out.step, out.metrics)
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
        component = "weight sync" if isinstance(e, ComponentError) else "trainer or rollout"
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
    from agentrl.inference.fleet import Fleet
    from agentrl.trainer import Trainer

    prep = prepare(cfg, resume, say)
    await preflight_env(prep.env_cls, cfg.env_kwargs)
    if cfg.inference.urls:
        await check_servers(cfg.inference.urls)
        fleet = await Fleet.attach(cfg.inference.urls)
    else:
        log_dir = str(prep.run.path / "logs")
        fleet = await Fleet.launch(
            server_config(cfg, prep.model_dir, log_dir), cfg.inference.num_servers
        )
    try:
        trainer = await asyncio.to_thread(Trainer, cfg.trainer, prep.model_dir)
        runner = RolloutRunner(
            AgentLoop(fleet, prep.tokenizer, prep.loop_config),
            prep.env_factory,
            group_size=cfg.rollout.group_size,
            max_concurrency=cfg.rollout.max_concurrency,
        )

        async def push(weights: dict[str, Any], mode: PauseMode) -> int:
            return int((await fleet.sync_weights(weights, mode=mode)).version)

        return await drive(
            prep,
            runner=runner,
            trainer=trainer,
            llm=fleet,
            push=push,
            resume=bool(resume),
            say=say,
            on_step=on_step,
        )
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
