"""The training loop of a run: evaluate, train with the Driver, checkpoint, evaluate again.

:func:`drive` is shared by the local run (:mod:`agentrl.orchestration.run`) and the Ray
placement (:mod:`agentrl.orchestration.placement.train`), which differ only in how they
start the servers, the trainer and the rollout side.

Discarded episodes (agent, env, server, template errors) are saved with their
tracebacks in ``RUN_DIR/discarded/``, the first traceback is printed once, and after
``orchestration.max_all_discarded_steps`` consecutive steps in which every episode was
discarded the run checkpoints and stops with :class:`AllDiscardedError`.
"""

from __future__ import annotations

import asyncio
import contextlib
import inspect
import json
import signal
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from agentrl.inference.protocol import LLMClient
from agentrl.inference.weight_sync import PauseMode, SyncReport
from agentrl.orchestration.driver import Driver, GroupRunner, StepOutput, SyncWeights
from agentrl.orchestration.evaluate import evaluate
from agentrl.orchestration.heap import frozen_heap
from agentrl.orchestration.phases import describe_phases
from agentrl.orchestration.prefix_cache import PrefixCacheMeter
from agentrl.orchestration.resume import (
    find_resume_checkpoint,
    log_tasks,
    rewind_logs,
    save_run_checkpoint,
)
from agentrl.orchestration.startup import ComponentError, Prepared
from agentrl.orchestration.tasks import TaskStream
from agentrl.reporting.discards import eval_line
from agentrl.reporting.early_stop import RunWatch
from agentrl.reporting.progress import ProgressLog, plot_curve
from agentrl.reporting.run_dir import RunDir
from agentrl.trainer.engine.checkpoint import CheckpointError, select_checkpoint

__all__ = ["AllDiscardedError", "RunResult", "drive", "evaluate_held_out"]


class AllDiscardedError(ComponentError):
    """The run stopped because every episode of ``orchestration.max_all_discarded_steps``
    consecutive steps was discarded; the message names the reasons, the first error and
    the setting. The checkpoint of the last step is saved, and ``summary.json`` holds the
    message under ``failed``."""


@dataclass
class RunResult:
    """What a finished (or interrupted) run leaves behind."""

    run_dir: Path
    steps_done: int
    eval_before: dict[str, float]
    eval_after: dict[str, float]
    interrupted: bool = False
    early_stop: str | None = None


async def drive(
    prep: Prepared,
    *,
    runner: GroupRunner,
    trainer: Any,
    llm: LLMClient,
    push: SyncWeights,
    resume: bool,
    say: Callable[[str], None],
    on_step: Callable[[int, dict[str, float]], object] | None = None,
    initial_push: Callable[[Any], Awaitable[int]] | None = None,
) -> RunResult:
    """Evaluates, trains with the :class:`Driver`, checkpoints and evaluates again.

    Args:
        prep: From :func:`prepare`.
        runner: Runs groups of episodes.
        trainer: ``step``, ``state_dict_for_inference``, ``save_checkpoint``,
            ``load_checkpoint``, ``save_hf``.
        llm: The client evaluations sample from.
        push: Pushes weights to the servers (pause mode given), returns the version or
            the sync's report.
        resume: Continue from the run directory's last checkpoint.
        say: Progress messages.
        on_step: Called with each step's metrics; when it returns an awaitable, the run
            awaits it before going on.
        initial_push: Loads the trainer's starting weights into the servers before anything
            is generated, keeping the starting version (servers that were attached, not
            launched from the model, may serve other weights); returns that version.
            A resumed run instead pushes the checkpoint's weights as a new version.
    """
    cfg, run = prep.cfg, prep.run

    async def sync(weights: Any, mode: PauseMode) -> int | SyncReport:
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
        ckpt = prep.checkpoint or find_resume_checkpoint(run.path, say)
        try:
            extra = await asyncio.to_thread(trainer.load_checkpoint, ckpt)
        except CheckpointError as e:
            raise ComponentError(f"--resume {run.path}: cannot resume, {e}") from e
        state = extra.get("run", {})
        driver.step = int(state.get("step", 0))
        driver.stream.load_state_dict(state["stream"])
        rewind_logs(run, driver.step, say)
        outstanding = state["stream"].get("outstanding", [])
        say(
            f"resumed from {ckpt} at step {driver.step} (next task index "
            f"{state['stream'].get('next')}, {len(outstanding)} unfinished tasks re-issued)"
        )
    if resume:  # the servers generate with the checkpoint's weights from the start
        weights = await asyncio.to_thread(trainer.state_dict_for_inference)
        driver.version = driver.record_sync(await sync(weights, "wait"))
    elif initial_push is not None:
        weights = await asyncio.to_thread(trainer.state_dict_for_inference)
        try:
            driver.version = await initial_push(weights)
        except Exception as e:
            raise ComponentError(f"loading the starting weights into the servers: {e!r}") from e

    # Live red flags (agentrl doctor run), early_stop rules and discarded episodes.
    watch = RunWatch(
        cfg.early_stop,
        say,
        max_all_discarded_steps=cfg.orchestration.max_all_discarded_steps,
        run_dir=run.path,
    )

    async def run_eval(step: int) -> dict[str, float]:
        with prep.clock.phase("evaluation"):
            res = await evaluate_held_out(prep, llm)
        run.log(step, res, kind="eval")
        progress.eval(step, res)
        say(eval_line(step, res))
        broken = getattr(res, "discarded", [])  # an EvalResult carries its broken episodes
        saved = run.save_discarded(step, broken, evaluation=True)
        watch.discarded(f"eval @ step {step}", broken, saved)
        watch.eval(step, res)
        return res

    progress = ProgressLog(
        cfg.steps, run.path, wandb_mode=cfg.wandb, config=cfg.model_dump(mode="json")
    )
    try:
        with frozen_heap():  # full collections walk only what the run creates
            return await _loop(
                prep, driver, trainer, run_eval, progress, resume, say, on_step, watch,
                PrefixCacheMeter(llm),
            )  # fmt: skip
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
    on_step: Callable[[int, dict[str, float]], object] | None,
    watch: RunWatch,
    cache: PrefixCacheMeter,
) -> RunResult:
    cfg, run, stop = prep.cfg, prep.run, driver.stop
    saved = driver.step if resume else -1  # the step the newest checkpoint holds

    def checkpoint(extra: dict[str, Any]) -> None:
        nonlocal saved
        save_run_checkpoint(trainer, run, driver, extra)
        saved = driver.step

    def record(out: StepOutput) -> None:
        run.log(out.step, out.metrics)
        log_tasks(run, out)
        progress.step(out.step, out.metrics)
        run.save_trajectories(out.step, out.trajectories)
        saved = run.save_discarded(out.step, out.discarded)
        watch.discarded(f"step {out.step}", out.discarded, saved)

    before = await run_eval(driver.step) if not resume else {}
    await cache.mark()
    loop = asyncio.get_running_loop()
    with contextlib.suppress(NotImplementedError, RuntimeError):
        loop.add_signal_handler(signal.SIGINT, stop.set)
    clock = prep.clock
    evaluated, started = clock.seconds.get("evaluation", 0.0), time.monotonic()
    try:
        async for out in await driver.run(cfg.steps):
            out.metrics.update(await cache.step())
            record(out)
            if on_step and inspect.isawaitable(res := on_step(out.step, out.metrics)):
                await res
            # An early_stop rule holds, or every episode was discarded for too many steps:
            # end after this step.
            if watch.step(out.step, out.metrics):
                stop.set()
            if out.step % cfg.save_every == 0:
                await asyncio.to_thread(checkpoint, {})
            mid_eval = cfg.eval.every and out.step % cfg.eval.every == 0 and out.step < cfg.steps
            if mid_eval and watch.failed is None:
                await driver.settle()  # (overlap_push) the servers hold this step's weights
                await run_eval(out.step)
                await cache.mark()
        interrupted = stop.is_set() and watch.reason is None and watch.failed is None
    except Exception as e:
        raise await _crashed(e, driver, run, record, checkpoint, lambda: saved, say) from e
    finally:
        with contextlib.suppress(NotImplementedError, RuntimeError):
            loop.remove_signal_handler(signal.SIGINT)
        # Training: the steps' wall time, less the evaluations between them.
        mid_evals = clock.seconds.get("evaluation", 0.0) - evaluated
        clock.add("training", time.monotonic() - started - mid_evals)
    stopped = {"early_stop": watch.reason} if watch.reason else {}
    if watch.failed:
        stopped = {"failed": watch.failed}
    try:
        await asyncio.to_thread(checkpoint, stopped)
    except CheckpointError as e:
        raise ComponentError(f"checkpoint at step {driver.step} failed: {e}") from e
    if watch.failed:  # no final evaluation, no final model: nothing was learned
        _write_summary(run, before, {}, driver.step, stopped, clock.summary())
        raise AllDiscardedError(
            f"{watch.failed}; checkpoint of step {driver.step} saved (once the cause is "
            f"fixed, continue with --resume {run.path})"
        )
    if interrupted:
        say(f"interrupted: checkpoint saved; continue with --resume {run.path}")
        return RunResult(run.path, driver.step, before, {}, interrupted=True)
    after = await run_eval(driver.step)
    await asyncio.to_thread(trainer.save_hf, run.final_model)
    seconds = clock.summary()
    say(describe_phases(seconds))
    _write_summary(run, before, after, driver.step, stopped, seconds)
    return RunResult(run.path, driver.step, before, after, early_stop=watch.reason)


def _write_summary(
    run: RunDir,
    before: dict[str, float],
    after: dict[str, float],
    steps: int,
    stopped: dict[str, str],
    seconds: dict[str, float],
) -> None:
    (run.path / "summary.json").write_text(
        json.dumps(
            {
                "eval_before": before,
                "eval_after": after,
                "steps": steps,
                **stopped,
                "seconds": seconds,
            }
        )
    )


async def _crashed(
    e: Exception,
    driver: Driver,
    run: RunDir,
    record: Callable[[StepOutput], None],
    checkpoint: Callable[[dict[str, Any]], None],
    saved: Callable[[], int],
    say: Callable[[str], None],
) -> ComponentError:
    """Keeps what a failed run can keep consistently; returns the error naming the cause.

    A step trained before its weight push failed is logged and checkpointed (its
    trainer state, tasks and number agree). Nothing is saved when the trainer failed
    mid-update (its state is neither step's) or when saving itself failed.
    """
    step = driver.finish_unreported()
    if step is not None:
        with contextlib.suppress(Exception):
            record(step)
    resume = f"resume with --resume {run.path}"
    if isinstance(e, CheckpointError):
        return ComponentError(
            f"checkpoint at step {driver.step} failed: {e}; the last good checkpoint is "
            f"{_newest(run)} ({resume})"
        )
    where = f"at step {driver.step + 1}" if step is None else f"after step {driver.step}"
    if driver.training:
        kept = "the trainer failed mid-update, so its state is not saved"
    elif saved() == driver.step:
        kept = "the checkpoint of this step is already saved"
    else:
        try:
            await asyncio.to_thread(checkpoint, {"crashed": repr(e)})
            kept = f"checkpoint of step {driver.step} saved"
        except Exception as ce:
            kept = f"a checkpoint could not be saved ({ce})"
    component = "weight sync" if isinstance(e, ComponentError) else "trainer or rollout"
    return ComponentError(
        f"{component} failed {where}: {e!r}; {kept}; the last good checkpoint is "
        f"{_newest(run)} ({resume})"
    )


def _newest(run: RunDir) -> str:
    try:
        return str(select_checkpoint(run.checkpoints))
    except CheckpointError:
        return f"none (nothing in {run.checkpoints})"


async def evaluate_held_out(prep: Prepared, llm: LLMClient) -> dict[str, float]:
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
