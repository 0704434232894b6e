"""Held-out evaluation: success rate, pass@k and mean reward of the served policy.

An episode that broke for a reason not the policy's doing (agent, env, server, template
or reward-model error: a failure stop reason) is counted in ``discarded`` and its
reason in ``stop/<reason>``; it counts as not succeeding. When every episode is
discarded, ``success`` 0.0 is no measurement: the run's lines say "not measured"
(:func:`agentrl.reporting.discards.eval_line`).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import replace
from typing import Any

from agentrl.env import Env
from agentrl.inference.protocol import LLMClient
from agentrl.rollout import AgentLoop, LoopConfig, RolloutRunner
from agentrl.rollout.runner import RolloutResult
from agentrl.types import Trajectory

__all__ = ["EvalResult", "eval_metrics", "evaluate"]


class EvalResult(dict[str, float]):
    """An evaluation's numbers (a plain ``dict`` to every reader: logged, printed, compared)
    that also carries its discarded episodes, (stop reason, episode) each, in
    :attr:`discarded`, for the run to save with their tracebacks."""

    discarded: list[tuple[str, Trajectory]]

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.discarded = []


async def evaluate(
    llm: LLMClient,
    tokenizer: Any,
    env_factory: Callable[[], Env],
    tasks: Sequence[Mapping[str, Any]],
    loop_config: LoopConfig,
    *,
    k: int = 1,
    temperature: float = 0.0,
    success_threshold: float = 1.0,
    max_concurrency: int = 256,
) -> EvalResult:
    """Runs ``k`` episodes per task and reports how often the policy succeeds.

    An episode succeeds when its reward is at least ``success_threshold``.

    Returns:
        ``success`` (mean over all episodes), ``pass@k`` (fraction of tasks with at
        least one success), ``reward_mean``, ``turns_mean``, ``episodes``, ``discarded``
        and stop-reason counts.
    """
    cfg = replace(loop_config, sampling=replace(loop_config.sampling, temperature=temperature))
    runner = RolloutRunner(
        AgentLoop(llm, tokenizer, cfg), env_factory, group_size=k, max_concurrency=max_concurrency
    )
    result = await runner.run(tasks, seed=12345)
    return eval_metrics(result, k=k, success_threshold=success_threshold)


def eval_metrics(result: RolloutResult, *, k: int, success_threshold: float) -> EvalResult:
    """Success, pass@k, mean reward, mean turns, discarded episodes and stop-reason counts
    of ``result`` (the discarded episodes themselves in :attr:`EvalResult.discarded`)."""
    trajs = result.trajectories
    broken = [(str(t.stop_reason), t) for t in trajs if t.stop_reason.is_failure]
    wins = [t.reward >= success_threshold for t in trajs]
    out = {
        "success": sum(wins) / max(len(wins), 1),
        f"pass@{k}": sum(any(t.reward >= success_threshold for t in g) for g in result.groups)
        / max(len(result.groups), 1),
        "reward_mean": result.metrics.get("reward_mean", 0.0),
        "turns_mean": result.metrics.get("turns_mean", 0.0),
        "episodes": float(len(trajs)),
        "discarded": float(len(broken)),
    }
    out.update({f"stop/{r}": float(c) for r, c in result.stop_reasons.items()})
    res = EvalResult(out)
    res.discarded = broken
    return res
