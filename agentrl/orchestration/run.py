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
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from agentrl.config import RunConfig, load_config
from agentrl.cpus import PinnedThread
from agentrl.inference.weight_sync import PauseMode
from agentrl.llm import LLMClient
from agentrl.logging.early_stop import RunWatch
from agentrl.logging.progress import ProgressLog, plot_curve
from agentrl.logging.quiet import quiet_dependency_warnings
from agentrl.logging.run_dir import RunDir
from agentrl.orchestration.driver import Driver, GroupRunner, StepOutput
from agentrl.orchestration.evaluate import evaluate
from agentrl.orchestration.heap import frozen_heap
from agentrl.orchestration.phases import describe_phases
from agentrl.orchestration.resume import (
    find_resume_checkpoint,
    log_tasks,
    rewind_logs,
    save_run_checkpoint,
)
from agentrl.orchestration.reward_scoring import check_reward_model, open_reward_model
from agentrl.orchestration.startup import (
    ComponentError,
    Prepared,
    check_servers,
    detect_api,
    open_env_resources,
    pin_run,
    preflight_env,
    prepare,
    server_config,
    with_env_resources,
)
from agentrl.orchestration.tasks import TaskStream
from agentrl.orchestration.trainer_memory import preflight_trainer_memory
from agentrl.orchestration.trainer_process import ProcessTrainer
from agentrl.orchestration.trainer_thread import ThreadedTrainer
from agentrl.rewards import ScoredRunner
from agentrl.rollout import AgentLoop, RolloutRunner
from agentrl.trainer.checkpoint import CheckpointError, select_checkpoint

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


async def drive(
    prep: Prepared,
    *,
    runner: GroupRunner,
    trainer: Any,
    llm: LLMClient,
    push: Callable[[Any, PauseMode], Awaitable[int]],
    resume: bool,
    say: Callable[[str], None],
    on_step: Callable[[int, dict[str, float]], None] | None = None,
    initial_push: Callable[[Any], Awaitable[int]] | None = None,
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
        initial_push: Loads the trainer's starting weights into the servers before anything
            is generated, keeping the starting version (servers that were attached, not
            launched from the model, may serve other weights); returns that version.
            A resumed run instead pushes the checkpoint's weights as a new version.
    """
    cfg, run = prep.cfg, prep.run

    async def sync(weights: Any, mode: PauseMode) -> int:
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
        driver.version = await sync(weights, "wait")
    elif initial_push is not None:
        weights = await asyncio.to_thread(trainer.state_dict_for_inference)
        try:
            driver.version = await initial_push(weights)
        except Exception as e:
            raise ComponentError(f"loading the starting weights into the servers: {e!r}") from e

    watch = RunWatch(cfg.early_stop, say)  # live red flags (agentrl doctor run) + early_stop

    async def run_eval(step: int) -> dict[str, float]:
        with prep.clock.phase("evaluation"):
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
        with frozen_heap():  # full collections walk only what the run creates
            return await _loop(
                prep, driver, trainer, run_eval, progress, resume, say, on_step, watch
            )
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

    before = await run_eval(driver.step) if not resume else {}
    loop = asyncio.get_running_loop()
    with contextlib.suppress(NotImplementedError, RuntimeError):
        loop.add_signal_handler(signal.SIGINT, stop.set)
    clock = prep.clock
    evaluated, started = clock.seconds.get("evaluation", 0.0), time.monotonic()
    try:
        async for out in await driver.run(cfg.steps):
            record(out)
            if on_step:
                on_step(out.step, out.metrics)
            if watch.step(out.step, out.metrics):  # an early_stop rule holds: end after this step
                stop.set()
            if out.step % cfg.save_every == 0:
                await asyncio.to_thread(checkpoint, {})
            if cfg.eval.every and out.step % cfg.eval.every == 0 and out.step < cfg.steps:
                await driver.settle()  # (overlap_push) the servers hold this step's weights
                await run_eval(out.step)
        interrupted = stop.is_set() and watch.reason is None
    except Exception as e:
        raise await _crashed(e, driver, run, record, checkpoint, lambda: saved, say) from e
    finally:
        with contextlib.suppress(NotImplementedError, RuntimeError):
            loop.remove_signal_handler(signal.SIGINT)
        # Training: the steps' wall time, less the evaluations between them.
        mid_evals = clock.seconds.get("evaluation", 0.0) - evaluated
        clock.add("training", time.monotonic() - started - mid_evals)
    stopped = {"early_stop": watch.reason} if watch.reason else {}
    try:
        await asyncio.to_thread(checkpoint, stopped)
    except CheckpointError as e:
        raise ComponentError(f"checkpoint at step {driver.step} failed: {e}") from e
    if interrupted:
        say(f"interrupted: checkpoint saved; continue with --resume {run.path}")
        return RunResult(run.path, driver.step, before, {}, interrupted=True)
    after = await run_eval(driver.step)
    await asyncio.to_thread(trainer.save_hf, run.final_model)
    seconds = clock.summary()
    say(describe_phases(seconds))
    (run.path / "summary.json").write_text(
        json.dumps(
            {
                "eval_before": before,
                "eval_after": after,
                "steps": driver.step,
                **stopped,
                "seconds": seconds,
            }
        )
    )
    return RunResult(run.path, driver.step, before, after, early_stop=watch.reason)


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


async def train(
    cfg: RunConfig,
    *,
    resume: str | Path | None = None,
    say: Callable[[str], None] = print,
    on_step: Callable[[int, dict[str, float]], None] | None = None,
) -> RunResult:
    """Runs training as configured. See the module docstring for the order of start-up."""
    quiet_dependency_warnings()  # at the run's start, not at import: agentrl.logging.quiet
    if cfg.agent.solve:
        from agentrl.orchestration.agent_mode import check_agent

        check_agent(cfg)  # before anything starts: a bad spec or Ray placement fails here
    check_reward_model(cfg)  # reward.model: a bad path is one clear error, before anything
    if cfg.ray.address is not None:
        from agentrl.orchestration.ray_train import train_on_ray

        return await train_on_ray(cfg, cfg.ray, resume=resume, say=say, on_step=on_step)
    prep = prepare(cfg, resume, say)
    with pin_run(cfg):  # this thread and what it starts: the rollout side, until the end
        return await _train_local(prep, resume=resume, say=say, on_step=on_step)


async def _train_local(
    prep: Prepared,
    *,
    resume: str | Path | None,
    say: Callable[[str], None],
    on_step: Callable[[int, dict[str, float]], None] | None,
) -> RunResult:
    cfg = prep.cfg
    if cfg.trainer.loss.name == "dpo" and cfg.trainer.dpo.pairs:  # a bad file fails here
        from agentrl.trainer.pairs_file import PairsFileError, load_pairs_file

        try:
            load_pairs_file(cfg.trainer.dpo.pairs, prep.tokenizer)
        except PairsFileError as e:
            raise ComponentError(f"trainer.dpo.pairs: {e}") from e
    cfg, _ = preflight_trainer_memory(cfg, prep.model_dir, say)  # before any server starts
    await preflight_env(prep.env_cls, cfg.env_kwargs)
    async with contextlib.AsyncExitStack() as stack:  # closed in reverse, however it ends
        # The env's run-wide resources (e.g. a sandbox pool) first: closed last.
        prep = with_env_resources(
            prep, await open_env_resources(prep.env_cls, cfg.env_kwargs, stack)
        )
        log_dir = str(prep.run.path / "logs")
        with prep.clock.phase("servers"):
            fleet = await _open_fleet(prep, num_servers=cfg.inference.num_servers, log_dir=log_dir)
        stack.push_async_callback(fleet.close)
        with prep.clock.phase("trainer start"):
            trainer = await _start_trainer(cfg, prep.model_dir, stack)
        runner: GroupRunner
        if cfg.agent.solve:  # bring-your-own agent: episodes run through the gateway
            from agentrl.orchestration.agent_mode import make_agent_runner, open_gateway

            gateway = await open_gateway(cfg, fleet, prep.tokenizer)
            stack.push_async_callback(gateway.close)
            runner = make_agent_runner(cfg, gateway, group_size=cfg.rollout.group_size)
        else:
            runner = RolloutRunner(
                AgentLoop(fleet, prep.tokenizer, prep.loop_config),
                prep.env_factory,
                group_size=cfg.rollout.group_size,
                max_concurrency=cfg.rollout.max_concurrency,
            )
        if cfg.reward.model:  # a reward model scores each group (its server dies with the run)
            rm = await open_reward_model(cfg, prep.tokenizer, log_dir)
            stack.push_async_callback(rm.close)
            runner = ScoredRunner(runner, rm.scorer)

        async def push(weights: Any, mode: PauseMode) -> int:
            return int((await fleet.sync_weights(weights, mode=mode)).version)

        async def load_start(weights: Any) -> int:  # attached servers: same version
            report = await fleet.sync_weights(weights, mode="wait", version=fleet.weight_version)
            return int(report.version)

        return await drive(
            prep,
            runner=runner,
            trainer=trainer,
            llm=fleet,
            push=push,
            resume=bool(resume),
            say=say,
            on_step=on_step,
            initial_push=load_start if cfg.inference.urls else None,
        )


async def _start_trainer(
    cfg: RunConfig, model_dir: str, stack: contextlib.AsyncExitStack
) -> ThreadedTrainer | ProcessTrainer:
    """The run's trainer, on ``trainer.worker``: a thread or a process of its own, pinned to
    ``trainer.cpus`` (the event loop may be pinned elsewhere by ``rollout.cpus``); closed
    with ``stack``."""
    max_seq_len = cfg.rollout.max_total_tokens
    if cfg.trainer.worker == "process":
        proc = await ProcessTrainer.start(cfg.trainer, model_dir, max_seq_len=max_seq_len)
        stack.callback(proc.close)
        return proc
    from agentrl.trainer import Trainer

    # Every trainer call runs on this thread; built there too, so its torch state is that
    # thread's. Closed once its current call returns.
    thread = PinnedThread(cfg.trainer.cpus)
    stack.callback(thread.close)
    built = await asyncio.to_thread(
        thread.call, Trainer, cfg.trainer, model_dir, max_seq_len=max_seq_len
    )
    return ThreadedTrainer(built, thread)


async def _open_fleet(prep: Prepared, *, num_servers: int, log_dir: str | None) -> Fleet:
    """Attaches to ``inference.urls`` (checked first), or launches ``num_servers`` servers."""
    from agentrl.inference.fleet import Fleet
    from agentrl.inference.server import ServerStartError

    cfg = prep.cfg
    api: str = cfg.inference.api
    if cfg.inference.urls:
        await check_servers(cfg.inference.urls)
        if api == "auto":
            api = await detect_api(cfg.inference.urls)
        return await Fleet.attach(cfg.inference.urls, api=api)
    try:
        config = server_config(cfg, prep.model_dir, log_dir)
        return await Fleet.launch(config, num_servers, api="generate" if api == "auto" else api)
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
    quiet_dependency_warnings()
    prep = prepare(cfg, None, say, keep_run=False)
    await preflight_env(prep.env_cls, cfg.env_kwargs)
    async with contextlib.AsyncExitStack() as shared:
        extra = await open_env_resources(prep.env_cls, cfg.env_kwargs, shared)
        prep = with_env_resources(prep, extra)
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
