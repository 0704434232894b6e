"""``agentrl train``: builds every component from a RunConfig and runs the driver.

Order of start-up, so that a bad input fails before anything expensive starts:
config → env spec → tasks → model → run directory → inference servers → trainer.
A crash in any component stops the run with the component named; the last
checkpoint stays valid, and ``agentrl train --resume RUN_DIR`` continues.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from agentrl.config import RunConfig, load_config
from agentrl.inference.weight_sync import PauseMode, SyncReport
from agentrl.orchestration.adapter_weights import AdapterSnapshots, serves_adapters
from agentrl.orchestration.driver import GroupRunner
from agentrl.orchestration.reward_scoring import check_reward_model, open_reward_model
from agentrl.orchestration.startup import (
    ComponentError,
    Prepared,
    attached_key,
    check_servers,
    detect_api,
    open_env_resources,
    pin_run,
    preflight_env,
    prepare,
    server_config,
    with_env_resources,
)
from agentrl.orchestration.trainer_memory import preflight_trainer_memory
from agentrl.orchestration.trainer_process import ProcessTrainer
from agentrl.orchestration.trainer_thread import ThreadedTrainer
from agentrl.orchestration.tree_runs import tree_spec
from agentrl.reporting.quiet import quiet_dependency_warnings
from agentrl.rewards import ScoredRunner
from agentrl.rollout import AgentLoop, RolloutRunner
from agentrl.runtime.cpus import PinnedThread

if TYPE_CHECKING:
    from agentrl.inference.fleet import Fleet

from agentrl.orchestration.training import RunResult, drive, evaluate_held_out

__all__ = ["ComponentError", "RunResult", "drive", "evaluate_model", "train", "train_from_cli"]


async def train(
    cfg: RunConfig,
    *,
    resume: str | Path | None = None,
    say: Callable[[str], None] = print,
    on_step: Callable[[int, dict[str, float]], None] | None = None,
) -> RunResult:
    """Runs training as configured. See the module docstring for the order of start-up."""
    quiet_dependency_warnings()  # at the run's start, not at import: agentrl.reporting.quiet
    if cfg.agent.solve:
        from agentrl.orchestration.agent_mode import check_agent

        check_agent(cfg)  # before anything starts: a bad spec or Ray placement fails here
    check_reward_model(cfg)  # reward.model: a bad path is one clear error, before anything
    if cfg.ray.address is not None:
        from agentrl.orchestration.placement.train import train_on_ray

        if serves_adapters(cfg.trainer):
            raise ComponentError(
                "trainer.lora.serve: adapter is not supported on Ray placements yet; "
                "set trainer.lora.serve: merged"
            )
        if cfg.rollout.tree is not None:
            raise ComponentError(
                "rollout.tree is not supported on Ray placements yet; unset rollout.tree "
                "or ray.address"
            )

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
        from agentrl.trainer.objectives.pairs_file import PairsFileError, load_pairs_file

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
            fleet = await _open_fleet(
                prep, num_servers=cfg.inference.num_servers, log_dir=log_dir, say=say
            )
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
                tree=tree_spec(cfg),
            )
        if cfg.reward.model:  # a reward model scores each group (its server dies with the run)
            rm = await open_reward_model(cfg, prep.tokenizer, log_dir)
            stack.push_async_callback(rm.close)
            runner = ScoredRunner(runner, rm.scorer)

        async def push(weights: Any, mode: PauseMode) -> SyncReport:
            return await fleet.sync_weights(weights, mode=mode)

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
) -> ThreadedTrainer | ProcessTrainer | AdapterSnapshots:
    """The run's trainer, on ``trainer.worker``: a thread or a process of its own, pinned to
    ``trainer.cpus`` (the event loop may be pinned elsewhere by ``rollout.cpus``); closed
    with ``stack``. With ``trainer.lora.serve: adapter`` it pushes its adapter alone."""
    trainer = await _start_worker(cfg, model_dir, stack)
    if not serves_adapters(cfg.trainer):
        return trainer
    lora = cfg.trainer.lora
    snaps = AdapterSnapshots(trainer, roles=lora.roles if lora and lora.per_role else ())
    stack.callback(snaps.close)
    return snaps


async def _start_worker(
    cfg: RunConfig, model_dir: str, stack: contextlib.AsyncExitStack
) -> ThreadedTrainer | ProcessTrainer:
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


async def _open_fleet(
    prep: Prepared, *, num_servers: int, log_dir: str | None, say: Callable[[str], None]
) -> Fleet:
    """Attaches to ``inference.urls`` (checked first), or launches ``num_servers`` servers."""
    from agentrl.inference.fleet import Fleet
    from agentrl.inference.server import ServerStartError

    cfg = prep.cfg
    api: str = cfg.inference.api
    if cfg.inference.urls:
        key = attached_key(cfg)
        down = await check_servers(cfg.inference.urls, api_key=key)
        up = [u for u in cfg.inference.urls if u not in down]
        if api == "auto":
            api = await detect_api(up, api_key=key)
        fleet = await Fleet.attach(
            cfg.inference.urls, api=api, api_key=key, lora_adapters=serves_adapters(cfg.trainer)
        )
        for url, why in down.items():  # it joins, with the current weights, once it answers
            fleet.router.set_healthy(url, False)
            say(
                f"warning: inference server {url} does not answer ({why}); starting on the "
                f"{len(up)} that do, it joins once it answers"
            )
        return fleet
    try:
        config = server_config(cfg, prep.model_dir, log_dir)
        return await Fleet.launch(
            config,
            num_servers,
            api="generate" if api == "auto" else api,
            lora_adapters=serves_adapters(cfg.trainer),
        )
    except ServerStartError as e:  # before the trainer starts: the run stops with vLLM's reason
        raise ComponentError(f"inference server cannot start: {e}") from e


async def evaluate_model(cfg: RunConfig, *, say: Callable[[str], None] = print) -> dict[str, float]:
    """Serves ``cfg.model`` and evaluates it on the env's held-out tasks (``agentrl eval``)."""
    quiet_dependency_warnings()
    prep = prepare(cfg, None, say, keep_run=False)
    await preflight_env(prep.env_cls, cfg.env_kwargs)
    async with contextlib.AsyncExitStack() as shared:
        extra = await open_env_resources(prep.env_cls, cfg.env_kwargs, shared)
        prep = with_env_resources(prep, extra)
        fleet = await _open_fleet(prep, num_servers=1, log_dir=None, say=say)
        try:
            return await evaluate_held_out(prep, fleet)
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
