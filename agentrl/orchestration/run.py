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
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from agentrl.config import RunConfig, load_config
from agentrl.inference.weight_sync import PauseMode
from agentrl.llm import LLMClient
from agentrl.logging.early_stop import RunWatch
from agentrl.logging.progress import ProgressLog, plot_curve
from agentrl.logging.run_dir import RunDir
from agentrl.orchestration.driver import Driver, GroupRunner
from agentrl.orchestration.evaluate import evaluate
from agentrl.orchestration.startup import (
    ComponentError,
    Prepared,
    check_servers,
    preflight_env,
    prepare,
    server_config,
)
from agentrl.orchestration.tasks import TaskStream
from agentrl.orchestration.trainer_memory import preflight_trainer_memory
from agentrl.rollout import AgentLoop, RolloutRunner

if TYPE_CHECKING:
    from agentrl.inference.fleet import Fleet

__all__ = ["ComponentError", "RunResult", "drive", "evaluate_model", "train", "train_from_cli"]


@dataclass
class RunResult:
    """What a finished (or interrupted) run leaves behind."""

    run_dir: Path
    steps_done: int
    eval_before: dict[str, float]
    eval_after: dict[str, float]
    interrupted: bool = False
    early_stop: str | None = None


def _checkpoint(trainer: Any, run: RunDir, driver: Driver, extra: dict[str, Any]) -> Path:
    state = {"step": driver.step, "stream": driver.stream.state_dict(), **extra}
    return Path(trainer.save_checkpoint(run.checkpoints, extra={"run": state}))


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

    watch = RunWatch(cfg.early_stop, say)  # live red flags (agentrl doctor run) + early_stop

    async def run_eval(step: int) -> dict[str, float]:
        res = await _evaluate(prep, llm)
        run.log(step, res, kind="eval")
        progress.eval(step, res)
        say(f"eval @ step {step}: success {res['success']:.3f}")
        watch.eval(step, res)
        return res

    progress = ProgressLog(
        cfg.steps, run.path, wandb_mode=cfg.wandb, config=cfg.model_dump(mode="json")
    )
    try:
        return await _loop(prep, driver, trainer, run_eval, progress, resume, say, on_step, watch)
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
    watch: RunWatch,
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
            if watch.step(out.step, out.metrics):  # an early_stop rule holds: end after this step
                stop.set()
            if out.step % cfg.save_every == 0:
                await asyncio.to_thread(_checkpoint, trainer, run, driver, {})
            if cfg.eval.every and out.step % cfg.eval.every == 0 and out.step < cfg.steps:
                await run_eval(out.step)
        interrupted = stop.is_set() and watch.reason is None
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
    stopped = {"early_stop": watch.reason} if watch.reason else {}
    await asyncio.to_thread(_checkpoint, trainer, run, driver, stopped)
    if interrupted:
        say(f"interrupted: checkpoint saved; continue with --resume {run.path}")
        return RunResult(run.path, driver.step, before, {}, interrupted=True)
    after = await run_eval(driver.step)
    await asyncio.to_thread(trainer.save_hf, run.final_model)
    (run.path / "summary.json").write_text(
        json.dumps({"eval_before": before, "eval_after": after, "steps": driver.step, **stopped})
    )
    return RunResult(run.path, driver.step, before, after, early_stop=watch.reason)


async def train(
    cfg: RunConfig,
    *,
    resume: str | Path | None = None,
    say: Callable[[str], None] = print,
    on_step: Callable[[int, dict[str, float]], None] | None = None,
) -> RunResult:
    """Runs training as configured. See the module docstring for the order of start-up."""
    if cfg.agent.solve:
        from agentrl.orchestration.agent_mode import check_agent

        check_agent(cfg)  # before anything starts: a bad spec or Ray placement fails here
    if cfg.ray.address is not None:
        from agentrl.orchestration.ray_train import train_on_ray

        return await train_on_ray(cfg, cfg.ray, resume=resume, say=say, on_step=on_step)
    from agentrl.trainer import Trainer

    prep = prepare(cfg, resume, say)
    cfg, _ = preflight_trainer_memory(cfg, prep.model_dir, say)  # before any server starts
    await preflight_env(prep.env_cls, cfg.env_kwargs)
    log_dir = str(prep.run.path / "logs")
    fleet = await _open_fleet(prep, num_servers=cfg.inference.num_servers, log_dir=log_dir)
    gateway = None
    try:
        trainer = await asyncio.to_thread(
            Trainer, cfg.trainer, prep.model_dir, max_seq_len=cfg.rollout.max_total_tokens
        )
        runner: GroupRunner
        if cfg.agent.solve:  # bring-your-own agent: episodes run through the gateway
            from agentrl.orchestration.agent_mode import make_agent_runner, open_gateway

            gateway = await open_gateway(cfg, fleet, prep.tokenizer)
            runner = make_agent_runner(cfg, gateway, group_size=cfg.rollout.group_size)
        else:
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
        if gateway is not None:
            await gateway.close()
        await fleet.close()


async def _open_fleet(prep: Prepared, *, num_servers: int, log_dir: str | None) -> Fleet:
    """Attaches to ``inference.urls`` (checked first), or launches ``num_servers`` servers."""
    from agentrl.inference.fleet import Fleet
    from agentrl.inference.server import ServerStartError

    cfg = prep.cfg
    if cfg.inference.urls:
        await check_servers(cfg.inference.urls)
        return await Fleet.attach(cfg.inference.urls)
    try:
        return await Fleet.launch(server_config(cfg, prep.model_dir, log_dir), num_servers)
    except ServerStartError as e:  # before the trainer starts: the run stops with vLLM's reason
        raise ComponentError(f"inference server cannot start: {e}") from e


async def _evaluate(prep: Prepared, llm: LLMClient) -> dict[str, float]:
    """The held-out evaluation of ``prep.cfg.eval`` with ``llm``."""
    cfg = prep.cfg
    if cfg.agent.solve:
        from agentrl.orchestration.agent_mode import evaluate_agent

        return await evaluate_agent(cfg, llm, prep.tokenizer, prep.eval_rows)
    return await evaluate(
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


async def evaluate_model(cfg: RunConfig, *, say: Callable[[str], None] = print) -> dict[str, float]:
    """Serves ``cfg.model`` and evaluates it on the env's held-out tasks (``agentrl eval``)."""
    prep = prepare(cfg, None, say, keep_run=False)
    await preflight_env(prep.env_cls, cfg.env_kwargs)
    fleet = await _open_fleet(prep, num_servers=1, log_dir=None)
    try:
        return await _evaluate(prep, fleet)
    finally:
        await fleet.close()


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
