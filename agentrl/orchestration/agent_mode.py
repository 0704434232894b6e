"""Bring-your-own-agent runs: the gateway and AgentRunner in place of the AgentLoop.

``agentrl train --agent my_agent.py:solve`` uses the same driver, modes, groups,
trainer, checkpoints and logging as an env run; only who drives the episodes
changes. Tasks still come from ``tasks`` (a file, read as plain rows) or from the
env's built-in generator (``--env``), so an agent can train on an env's tasks.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from agentrl.config import RunConfig
from agentrl.gateway.agent_runner import AgentRunner, AgentSpecError, load_agent
from agentrl.gateway.server import Gateway
from agentrl.gateway.session import GatewayLimits
from agentrl.inference.protocol import LLMClient
from agentrl.orchestration.evaluate import eval_metrics
from agentrl.orchestration.startup import ComponentError, loop_config
from agentrl.rollout import AgentLoop

__all__ = [
    "check_agent",
    "evaluate_agent",
    "gateway_limits",
    "make_agent_runner",
    "open_gateway",
]


class _NoLLM:
    async def generate(self, *a: Any, **k: Any) -> Any:
        raise RuntimeError("not for generation")


def gateway_limits(
    cfg: RunConfig, tokenizer: Any, *, max_temperature: float | None = None
) -> tuple[GatewayLimits, Any]:
    """The run's limits as the gateway applies them, and the run's turn parser.

    The chat template is inspected as for the AgentLoop (same strategy, same tools
    fallback, same parsers), so an agent's episodes are tokenized like an env's.
    """
    lc = loop_config(cfg)
    loop = AgentLoop(_NoLLM(), tokenizer, lc)
    limits = GatewayLimits(
        loop=lc,
        max_temperature=cfg.agent.max_temperature if max_temperature is None else max_temperature,
        strategy=loop.strategy,
        inject_tools=loop.inject_tools,
        forced_tool_choice=cfg.agent.forced_tool_choice,
        forced_tool_choice_tries=cfg.agent.forced_tool_choice_tries,
        max_model_len=cfg.inference.max_model_len,
    )
    return limits, loop.parser


def check_agent(cfg: RunConfig) -> None:
    """Fails at start-up, naming the cause, when ``cfg.agent`` cannot run."""
    if cfg.ray.address is not None:
        raise ComponentError(
            "agent.solve runs on one machine for now (the gateway and the agents share the "
            "driver's event loop); unset ray.address"
        )
    _agent(cfg)


def _agent(cfg: RunConfig) -> tuple[Any, Any]:
    if cfg.agent.solve is None:
        raise ComponentError("agent.solve is not set")
    try:
        return load_agent(cfg.agent.solve, cfg.agent.score)
    except AgentSpecError as e:
        raise ComponentError(f"agent: {e}") from e


async def open_gateway(
    cfg: RunConfig, llm: LLMClient, tokenizer: Any, *, max_temperature: float | None = None
) -> Gateway:
    """A started gateway in front of ``llm`` with the run's limits."""
    limits, parser = gateway_limits(cfg, tokenizer, max_temperature=max_temperature)
    gw = Gateway(llm, tokenizer, limits, host=cfg.agent.host, port=cfg.agent.port, parser=parser)
    return await gw.start()


def make_agent_runner(cfg: RunConfig, gateway: Gateway, *, group_size: int) -> AgentRunner:
    """An AgentRunner for ``cfg.agent`` (loaded now, so a bad spec fails at start-up)."""
    solve, score = _agent(cfg)
    return AgentRunner(
        gateway,
        solve,
        score=score,
        group_size=group_size,
        max_concurrency=cfg.rollout.max_concurrency,
        episode_timeout_s=cfg.rollout.episode_timeout_s,
        request_timeout_s=cfg.agent.request_timeout_s,
    )


async def evaluate_agent(
    cfg: RunConfig, llm: LLMClient, tokenizer: Any, tasks: Sequence[Mapping[str, Any]]
) -> dict[str, float]:
    """Held-out evaluation of the agent: ``eval.samples_per_task`` episodes per task.

    The agent's temperature is lowered to ``eval.temperature``; success and pass@k
    count episodes (a rewritten history's later segments are not counted twice).
    """
    gw = await open_gateway(cfg, llm, tokenizer, max_temperature=cfg.eval.temperature)
    try:
        runner = make_agent_runner(cfg, gw, group_size=cfg.eval.samples_per_task)
        result = await runner.run(tasks, seed=12345)
    finally:
        await gw.close()
    return eval_metrics(
        result, k=cfg.eval.samples_per_task, success_threshold=cfg.eval.success_threshold
    )
