"""Start-up of a run: everything that must be checked before servers and trainers start.

Order: config → env spec → tasks → model → run directory → chat template →
env preflight (e.g. a sandbox) → inference servers reachable.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import functools
import inspect
import os
import tempfile
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from agentrl.config import RunConfig, dump_config
from agentrl.env import Env, call_maybe_async, provides
from agentrl.errors import ComponentError, TaskSpecError, UserError
from agentrl.inference.protocol import SamplingParams
from agentrl.loading.task_sources import read_task_source
from agentrl.orchestration.phases import PhaseClock
from agentrl.orchestration.tree_runs import resolve_tree
from agentrl.reporting.run_dir import RunDir
from agentrl.rollout import AgentLoop, LoopConfig
from agentrl.rollout.stages import Stage
from agentrl.runtime.cpus import check_cpus, pinned

__all__ = [
    "ATTACHED_KEY_ENV",
    "ComponentError",
    "Prepared",
    "attached_key",
    "check_servers",
    "load_tasks_for",
    "loop_config",
    "preflight_env",
    "prepare",
    "resolve_model_dir",
    "server_config",
]


def load_tasks_for(
    cfg: RunConfig, env_cls: type[Env]
) -> tuple[list[Mapping[str, Any]], list[Mapping[str, Any]]]:
    """Train and held-out tasks: from ``cfg.tasks`` or the env's ``default_tasks``
    (called with ``cfg.task_kwargs``), and ``cfg.eval.tasks``.

    A source (a task file, a ``datasets`` directory or ``.arrow`` file, ``hf:PATH[:SPLIT]``;
    :mod:`agentrl.loading.task_sources`) has its columns mapped by ``cfg.task_columns`` and
    its rows validated by the env's ``load_tasks`` when it has one. The held-out tasks are
    the first ``eval.num_tasks`` rows of ``eval.tasks`` when it is set (and every row of
    ``tasks`` trains); else the first tenth (at most ``eval.num_tasks``) of ``tasks`` is
    held out, or the env's ``default_tasks(split="test")`` gives them.
    """
    if cfg.task_columns and not (cfg.tasks or cfg.eval.tasks):
        raise TaskSpecError(
            f"task_columns={cfg.task_columns} maps the columns of tasks= and eval.tasks=, and "
            "neither is set (the env's built-in tasks need no mapping)"
        )
    # An agent (agent.solve) gets its tasks' rows as they are; an env validates them.
    own = not cfg.agent.solve and provides(env_cls, "load_tasks")
    read = functools.partial(
        read_task_source, env_cls=env_cls if own else None, columns=cfg.task_columns
    )
    rows = read(cfg.tasks, setting="tasks") if cfg.tasks else None
    held_out = None
    if cfg.eval.tasks:
        held_out = read(cfg.eval.tasks, setting="eval.tasks", limit=cfg.eval.num_tasks)
    if rows is not None:
        if held_out is not None:
            return rows, held_out
        n_eval = min(cfg.eval.num_tasks, max(1, len(rows) // 10))
        if len(rows) <= n_eval:
            raise TaskSpecError(
                f"tasks={cfg.tasks}: holds {len(rows)} task(s), and the first {n_eval} are held "
                "out for evaluation, which leaves none to train on; give more, or a separate "
                "held-out source with eval.tasks="
            )
        return rows[n_eval:], rows[:n_eval]
    if not provides(env_cls, "default_tasks"):
        raise TaskSpecError(
            f"env {cfg.env!r} has no built-in tasks (no default_tasks); give a task file "
            "with tasks=PATH"
        )
    kwargs = cfg.task_kwargs
    if kwargs is None:
        from agentrl.models.registry import suited_task_kwargs

        kwargs = suited_task_kwargs(cfg.model.path, cfg.env)
    default = env_cls.default_tasks
    try:  # checked against the signature, so a TypeError inside the generator is not hidden
        inspect.signature(default).bind(split="train", n=1, seed=cfg.seed, **kwargs)
    except TypeError as e:
        raise TaskSpecError(
            f"task_kwargs {kwargs} do not fit {cfg.env}'s default_tasks: {e}"
        ) from e
    train_rows = list(default(split="train", n=4096, seed=cfg.seed, **kwargs))
    if held_out is not None:
        return train_rows, held_out
    eval_rows = list(default(split="test", n=cfg.eval.num_tasks, seed=cfg.seed, **kwargs))
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
        tool_parser=r.tool_parser,
        reasoning_parser=r.reasoning_parser,
        template_strategy=r.template_strategy,
        inject_tools=r.inject_tools,
        stages=tuple(Stage(**s.model_dump()) for s in r.stages),
        role_adapters=cfg.trainer.lora is not None and cfg.trainer.lora.per_role,
    )


def resolve_model_dir(cfg: RunConfig, say: Callable[[str], None]) -> str:
    """``model.path``: a named model such as ``smollm2-135m`` resolves to its cached
    directory (fetched if missing), ``tiny`` (or None) to the tiny model's (built if
    missing), anything else is a directory or hub id, unchanged."""
    from agentrl.models.registry import is_tiny

    if is_tiny(cfg.model.path):
        from agentrl.models.tiny import TinyRecipe, ensure_tiny_model

        return str(ensure_tiny_model(TinyRecipe(seed=cfg.model.tiny_seed), log=say))
    from agentrl.models.gguf import ModelImportError
    from agentrl.models.registry import resolve_model

    assert cfg.model.path is not None
    try:
        return resolve_model(cfg.model.path, log=say)
    except ModelImportError as e:
        raise ComponentError(f"model {cfg.model.path!r}: {e}") from e


ATTACHED_KEY_ENV = "AGENTRL_INFERENCE_API_KEY"
"""Where the key of attached servers is read when ``inference.api_key`` is unset."""


def attached_key(cfg: RunConfig) -> str | None:
    """The bearer key of the servers in ``inference.urls``: ``inference.api_key``, else
    :data:`ATTACHED_KEY_ENV`, else None."""
    key = cfg.inference.api_key
    return key.get_secret_value() if key is not None else os.environ.get(ATTACHED_KEY_ENV)


def server_config(cfg: RunConfig, model_dir: str, log_dir: str | None) -> Any:
    """The vLLM server settings of ``cfg``, with the run's key (used off loopback only)."""
    from agentrl.inference.auth import new_key
    from agentrl.inference.server import ServerConfig
    from agentrl.orchestration.adapter_weights import served_rank

    inf = cfg.inference
    return ServerConfig(
        model=model_dir,
        dtype=inf.dtype,
        max_model_len=inf.max_model_len,
        kv_cache_gib=inf.kv_cache_gb,
        gpu_memory_utilization=inf.gpu_memory_utilization,
        startup_timeout_s=inf.startup_timeout_s,
        extra_args=tuple(inf.extra_args),
        log_dir=log_dir,
        cpus=tuple(check_cpus(inf.cpus, "inference.cpus")),
        api_key=new_key(),
        lora_max_rank=served_rank(cfg.trainer),  # trainer.lora.serve: adapter
    )


async def check_servers(
    urls: Sequence[str], timeout_s: float = 10.0, api_key: str | None = None
) -> dict[str, str]:
    """The given servers that do not answer at start-up, with why (url → reason).

    A run starts on the servers that answer; the others join once they answer (the
    fleet's health checks load the current weights into them first), as a server that
    restarts mid-run does.

    Raises:
        ComponentError: No server answers; the message names each one.
    """
    import httpx

    from agentrl.inference.auth import auth_headers

    async with httpx.AsyncClient(timeout=timeout_s, headers=auth_headers(api_key)) as http:

        async def one(url: str) -> str | None:
            try:
                r = await http.get(url.rstrip("/") + "/health")
            except httpx.HTTPError as e:
                return f"{type(e).__name__}: {e}"
            return None if r.status_code == 200 else f"/health answered {r.status_code}"

        found = await asyncio.gather(*(one(u) for u in urls))
    down = {u: why for u, why in zip(urls, found, strict=True) if why is not None}
    if urls and len(down) == len(urls):
        raise ComponentError(
            "cannot reach the inference servers given in inference.urls: "
            + "; ".join(f"{u}: {why}" for u, why in down.items())
        )
    return down


GENERATE_ROUTE = "/inference/v1/generate"


async def detect_api(
    urls: Sequence[str], timeout_s: float = 10.0, api_key: str | None = None
) -> str:
    """``generate`` when every server's ``/openapi.json`` lists vLLM's token route, else
    ``completions`` (a server without an OpenAPI document, or another server)."""
    import httpx

    from agentrl.inference.auth import auth_headers

    async with httpx.AsyncClient(timeout=timeout_s, headers=auth_headers(api_key)) as http:

        async def has_route(url: str) -> bool:
            try:
                r = await http.get(url.rstrip("/") + "/openapi.json")
                return r.status_code == 200 and GENERATE_ROUTE in r.json().get("paths", {})
            except (httpx.HTTPError, ValueError, AttributeError):
                return False

        found = await asyncio.gather(*(has_route(u) for u in urls))
    return "generate" if urls and all(found) else "completions"


async def preflight_env(env_cls: type[Env], kwargs: Mapping[str, Any]) -> None:
    """Runs the env class's optional ``preflight(**env_kwargs)`` (e.g. start a sandbox once)."""
    if not provides(env_cls, "preflight"):
        return
    try:
        await call_maybe_async(env_cls.preflight, **kwargs)
    except Exception as e:
        raise ComponentError(f"env {env_cls.__name__} cannot start: {e}") from e


async def open_env_resources(
    env_cls: type[Env], kwargs: Mapping[str, Any], stack: contextlib.AsyncExitStack
) -> dict[str, Any]:
    """Enters the env class's ``run_resources(**env_kwargs)`` on ``stack`` (closed with it).

    Returns the extra keyword arguments of every env of the run (empty when it shares none).
    """
    try:
        opened = env_cls.run_resources(**kwargs)
        extra = await stack.enter_async_context(opened) if opened is not None else None
    except Exception as e:
        raise ComponentError(
            f"env {env_cls.__name__}: its shared resources cannot start: {e}"
        ) from e
    return dict(extra or {})


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
    checkpoint: Path | None = None
    """With ``--resume``: the checkpoint to continue from (checked at start-up)."""
    clock: PhaseClock = dataclasses.field(default_factory=PhaseClock)
    """Wall seconds per phase of the run so far (``model`` is counted here)."""


def with_env_resources(prep: Prepared, extra: Mapping[str, Any]) -> Prepared:
    """``prep`` whose envs also get ``extra`` (the run's shared resources)."""
    if not extra:
        return prep
    env_cls, kwargs = prep.env_cls, {**prep.cfg.env_kwargs, **extra}
    return dataclasses.replace(prep, env_factory=lambda: env_cls(**kwargs))


def prepare(
    cfg: RunConfig,
    resume: str | Path | None,
    say: Callable[[str], None],
    *,
    keep_run: bool = True,
) -> Prepared:
    """Checks the env, reads the tasks, finds the model and opens the run directory.

    Everything here fails fast, before any server or trainer starts. With
    ``keep_run=False`` (evaluation only) the run directory is a temporary one.
    """
    from transformers import AutoTokenizer

    from agentrl.loading.envs import resolve_env

    checkpoint = None
    if resume:  # a run with nothing to resume from fails before anything is built
        from agentrl.orchestration.resume import find_resume_checkpoint

        checkpoint = find_resume_checkpoint(Path(resume), say)
    env_cls = resolve_env(cfg.env)
    cfg = resolve_roles(resolve_supervision(cfg, env_cls), env_cls)
    if keep_run:  # training: an env that cannot fork stops a tree run here (evaluation is flat)
        cfg = resolve_tree(cfg, env_cls, say)
    train_rows, eval_rows = load_tasks_for(cfg, env_cls)
    if cfg.inference.cpus and cfg.inference.urls:
        raise UserError(
            "inference.cpus pins the servers agentrl launches; with inference.urls, pin "
            "the servers where they are started (e.g. taskset -c)"
        )
    check_run_cpus(cfg)

    def env_factory() -> Env:
        return env_cls(**cfg.env_kwargs)

    clock = PhaseClock()
    with clock.phase("model"):
        model_dir = resolve_model_dir(cfg, say)
    try:
        tokenizer = AutoTokenizer.from_pretrained(model_dir)
    except (OSError, ValueError) as e:  # not a directory, no tokenizer files, unknown hub id
        first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        raise UserError(
            f"model {model_dir!r}: cannot load its tokenizer ({first}); give model.path a "
            "model directory with tokenizer files, or a named model (agentrl model list)"
        ) from e
    if resume:
        run = RunDir(resume)
    elif not keep_run:
        run = RunDir(tempfile.mkdtemp(prefix="agentrl-eval-"))
    else:
        run = RunDir(Path(cfg.output_dir) / (cfg.run_name or time.strftime("%Y%m%d-%H%M%S")))
        dump_config(cfg, run.path / "config.yaml")
        say(f"run directory: {run.path}")
    lcfg = loop_config(cfg)
    AgentLoop(_NoLLM(), tokenizer, lcfg)  # refuses a bad chat template before servers start
    return Prepared(
        cfg, env_cls, env_factory, train_rows, eval_rows, model_dir, tokenizer, run, lcfg,
        checkpoint, clock,
    )  # fmt: skip


def resolve_supervision(cfg: RunConfig, env_cls: type[Env]) -> RunConfig:
    """``trainer.advantage.supervision: auto`` → what the env declares (``process_rewards``)."""
    adv = cfg.trainer.advantage
    if adv.supervision != "auto":
        return cfg
    mode = "process" if env_cls.process_rewards else "outcome"
    trainer = cfg.trainer.model_copy(
        update={"advantage": adv.model_copy(update={"supervision": mode})}
    )
    return cfg.model_copy(update={"trainer": trainer})


def resolve_roles(cfg: RunConfig, env_cls: type[Env]) -> RunConfig:
    """``trainer.lora.per_role``: the adapters' roles are the env's (``Env.roles``).

    Raises:
        UserError: ``per_role`` with an env that declares fewer than two roles.
    """
    lora = cfg.trainer.lora
    if lora is None or not lora.per_role:
        return cfg
    roles = list(env_cls.roles)
    if len(roles) < 2:
        raise UserError(
            f"trainer.lora.per_role: env {env_cls.__name__} declares "
            f"{len(roles)} role{'' if len(roles) == 1 else 's'} {tuple(roles)}; one adapter "
            "per role needs two or more (Env.roles): set trainer.lora.per_role=false"
        )
    trainer = cfg.trainer.model_copy(update={"lora": lora.model_copy(update={"roles": roles})})
    return cfg.model_copy(update={"trainer": trainer})


def check_run_cpus(cfg: RunConfig) -> None:
    """Refuses CPU sets a run cannot apply (:func:`pin_run` applies them).

    Raises:
        UserError: A CPU this process may not use, or ``rollout.cpus`` without
            ``trainer.cpus``.
    """
    check_cpus(cfg.inference.cpus, "inference.cpus")
    check_cpus(cfg.trainer.cpus, "trainer.cpus")
    check_cpus(cfg.rollout.cpus, "rollout.cpus")
    if cfg.rollout.cpus and not cfg.trainer.cpus:
        raise UserError(
            "rollout.cpus moves the rollout side off the trainer's CPUs: set trainer.cpus "
            "too (e.g. inference.cpus=[0] rollout.cpus=[0] trainer.cpus=[1])"
        )


def pin_run(cfg: RunConfig) -> contextlib.AbstractContextManager[None]:
    """Pins this thread, the one that runs the event loop (the rollout side, and the
    processes it starts), to ``rollout.cpus``, or to ``trainer.cpus`` without it, until the
    ``with`` block ends. The trainer's own thread (run.py) pins itself to ``trainer.cpus``;
    torch gets one thread per trainer CPU."""
    check_run_cpus(cfg)
    if cfg.rollout.cpus:
        return pinned(cfg.rollout.cpus, "rollout.cpus", torch_threads=len(cfg.trainer.cpus))
    return pinned(cfg.trainer.cpus, "trainer.cpus")


class _NoLLM:
    async def generate(self, *a: Any, **k: Any) -> Any:
        raise RuntimeError("not for generation")
