"""RolloutRunner: many episodes at once, G per task, none lost."""

from __future__ import annotations

import asyncio
import traceback
import uuid
from collections import Counter
from collections.abc import AsyncIterator, Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from agentrl.env import Env
from agentrl.rollout.agent_loop import AgentLoop
from agentrl.rollout.tree import TreeSampler, TreeSpec
from agentrl.types import StopReason, Trajectory

__all__ = ["RolloutResult", "RolloutRunner"]


@dataclass
class RolloutResult:
    """Episodes of one batch, grouped by task.

    Attributes:
        groups: One list of G trajectories per task, in task order.
        stop_reasons: How many episodes ended for each reason.
        metrics: Aggregates (episodes, turns, mean reward, time shares, tool metrics).
    """

    groups: list[list[Trajectory]] = field(default_factory=list)
    stop_reasons: dict[str, int] = field(default_factory=dict)
    metrics: dict[str, float] = field(default_factory=dict)

    @property
    def trajectories(self) -> list[Trajectory]:
        return [t for g in self.groups for t in g]


def _task_id(task: Mapping[str, Any], index: int) -> str:
    for key in ("id", "task_id", "uid"):
        if key in task:
            return str(task[key])
    return str(index)


class RolloutRunner:
    """Runs G episodes per task, at most ``max_concurrency`` at a time.

    Args:
        loop: The AgentLoop that runs one episode.
        env_factory: Makes a fresh Env per episode (e.g. the Env class).
        group_size: Episodes per task (G of GRPO); with ``tree``, leaves per task.
        max_concurrency: Most episodes in flight (with ``tree``: most trees).
        tree: Sample each group as tree rollouts of this shape (``agentrl.rollout.tree``);
            None: G independent episodes.

    Example:
        >>> runner = RolloutRunner(loop, MyEnv, group_size=4)  # doctest: +SKIP
        >>> result = await runner.run(tasks)  # doctest: +SKIP
    """

    def __init__(
        self,
        loop: AgentLoop,
        env_factory: Callable[[], Env],
        *,
        group_size: int = 1,
        max_concurrency: int = 64,
        tree: TreeSpec | None = None,
    ) -> None:
        if group_size < 1 or max_concurrency < 1:
            raise ValueError("group_size and max_concurrency must be ≥ 1")
        self.loop = loop
        self.env_factory = env_factory
        self.group_size = group_size
        self.tree = tree
        self._sem = asyncio.Semaphore(max_concurrency)

    async def _episode(
        self, task: Mapping[str, Any], task_id: str, group_id: str, k: int, seed: int | None
    ) -> Trajectory:
        episode_id = f"{group_id}/{k}"
        async with self._sem:
            try:
                env = self.env_factory()
            except Exception:
                t = Trajectory(task_id=task_id, group_id=group_id, episode_id=episode_id)
                t.stop_reason, t.error = StopReason.ENV_ERROR, traceback.format_exc()
                return t
            return await self.loop.run(
                env, task, task_id=task_id, group_id=group_id, episode_id=episode_id, seed=seed
            )

    async def run_group(
        self, task: Mapping[str, Any], *, index: int, seed: int | None = 0, tag: str = ""
    ) -> list[Trajectory]:
        """Runs the G episodes of one task; ``tag`` makes the group id unique across batches."""
        return await self._group(task, index, seed, tag or uuid.uuid4().hex[:8])

    async def _group(
        self, task: Mapping[str, Any], index: int, seed: int | None, batch: str
    ) -> list[Trajectory]:
        task_id = _task_id(task, index)
        group_id = f"{batch}:{index}:{task_id}"
        if self.tree is not None:
            return await TreeSampler(self.loop, self.tree).group(
                self.env_factory, task, task_id=task_id, group_id=group_id,
                leaves=self.group_size,
                seed=None if seed is None else seed + index * self.group_size,
                slot=lambda: self._sem,
            )  # fmt: skip
        seeds = [
            None if seed is None else seed + index * self.group_size + k
            for k in range(self.group_size)
        ]
        return list(
            await asyncio.gather(
                *(
                    self._episode(task, task_id, group_id, k, seeds[k])
                    for k in range(self.group_size)
                )
            )
        )

    async def stream(
        self, tasks: Sequence[Mapping[str, Any]], *, seed: int | None = 0
    ) -> AsyncIterator[list[Trajectory]]:
        """Yields each task's group as soon as all its episodes have ended."""
        batch = uuid.uuid4().hex[:8]
        pending = [
            asyncio.create_task(self._group(task, i, seed, batch)) for i, task in enumerate(tasks)
        ]
        try:
            for fut in asyncio.as_completed(pending):
                yield await fut
        finally:
            for p in pending:
                p.cancel()
            await asyncio.gather(*pending, return_exceptions=True)

    async def run(
        self, tasks: Sequence[Mapping[str, Any]], *, seed: int | None = 0
    ) -> RolloutResult:
        """Runs every task's group and returns them in task order with aggregate metrics."""
        batch = uuid.uuid4().hex[:8]
        groups = list(
            await asyncio.gather(*(self._group(t, i, seed, batch) for i, t in enumerate(tasks)))
        )
        return summarize(groups)


def summarize(groups: list[list[Trajectory]]) -> RolloutResult:
    """Counts stop reasons and aggregates per-episode metrics of ``groups``."""
    trajs = [t for g in groups for t in g]
    reasons = Counter(str(t.stop_reason) for t in trajs)
    metrics: dict[str, float] = {"episodes": float(len(trajs))}
    if trajs:
        n = len(trajs)
        metrics["reward_mean"] = sum(t.reward for t in trajs) / n
        metrics["turns_mean"] = sum(t.num_turns for t in trajs) / n
        metrics["turns_total"] = float(sum(t.num_turns for t in trajs))
        metrics["model_tokens_total"] = float(sum(t.num_model_tokens for t in trajs))
        totals: Counter[str] = Counter()
        for t in trajs:
            totals.update(t.metrics)
        metrics.update({f"sum/{k}": float(v) for k, v in totals.items()})
        leaves = [t for t in trajs if "tree" in t.info]
        if leaves:  # tree rollouts: generated tokens per leaf (a shared turn counted once)
            made = sum(t.metrics.get("tree_generated_tokens", 0.0) for t in leaves)
            metrics["tree/generated_tokens_per_leaf"] = made / len(leaves)
    for reason, count in reasons.items():
        metrics[f"stop/{reason}"] = float(count)
    return RolloutResult(groups=groups, stop_reasons=dict(reasons), metrics=metrics)
