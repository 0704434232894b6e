"""Episodes scored by a reward model, as the env's reward or combined with it.

Each finished group's episodes are rendered (their messages through the reward
model's chat template, or their exact token ids) and scored in one batch; the
episode's reward becomes ``env_weight * env_reward + weight * clip(rm_score)``.
The batch-level normalisation and clipping of the total are the trainer's
(``trainer.shaping.reward_normalize`` / ``reward_clip``).

A failed scoring (server down, timeout, an episode too long for the reward
model, a conversation its template cannot render) ends that episode's scoring
with :attr:`StopReason.REWARD_ERROR` and the reason in ``Trajectory.error``: it
is not trained on, and the driver counts it (``discard/episode:reward_error``);
the run goes on.
"""

from __future__ import annotations

import math
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Literal, Protocol

from agentrl.types import StopReason, Trajectory

__all__ = ["RewardMix", "ScoredRunner", "Scorer", "SequenceScorer", "reward_model_metrics"]


class SequenceScorer(Protocol):
    """What scores token sequences (``agentrl.inference.reward_model.RewardModelClient``)."""

    async def score(self, sequences: Sequence[Sequence[int]]) -> list[float]: ...


@dataclass(frozen=True)
class RewardMix:
    """How the reward model's score and the env's reward combine.

    Attributes:
        weight: Weight of the reward model's score.
        env_weight: Weight of the env's reward (0: the reward model alone).
        clip: Clip the score to [-clip, clip] before weighting (None: off).
    """

    weight: float = 1.0
    env_weight: float = 0.0
    clip: float | None = None

    def combine(self, env_reward: float, score: float) -> float:
        if self.clip is not None:
            score = min(max(score, -self.clip), self.clip)
        return self.env_weight * env_reward + self.weight * score


class Scorer:
    """Renders episodes for a reward model, scores them, and sets their rewards.

    Args:
        model: Scores token sequences (the reward model's client).
        tokenizer: The reward model's tokenizer (for ``input="messages"``).
        mix: How score and env reward combine.
        input: "messages" (the conversation through the reward model's chat
            template) or "tokens" (the episode's exact token ids; the reward model
            must share the policy's tokenizer).
        max_len: The reward model's context; longer episodes fail their scoring.
    """

    def __init__(
        self,
        model: SequenceScorer,
        tokenizer: Any,
        *,
        mix: RewardMix | None = None,
        input: Literal["messages", "tokens"] = "messages",
        max_len: int = 8192,
    ) -> None:
        self.model = model
        self.tokenizer = tokenizer
        self.mix = mix or RewardMix()
        self.input = input
        self.max_len = max_len

    def render(self, traj: Trajectory) -> list[int]:
        """The token ids the reward model scores for ``traj``.

        Raises:
            ValueError: The template cannot render the conversation, or it is too long.
        """
        if self.input == "tokens":
            ids = list(traj.token_ids)
        else:
            try:
                text = self.tokenizer.apply_chat_template(
                    [m.to_dict() for m in traj.messages], tokenize=False
                )
            except Exception as e:
                raise ValueError(f"the reward model's chat template failed: {e!r}") from e
            ids = list(self.tokenizer.encode(text, add_special_tokens=False))
        if not ids:
            raise ValueError("nothing to score (empty episode)")
        if len(ids) > self.max_len:
            raise ValueError(
                f"episode is {len(ids)} tokens, over the reward model's context ({self.max_len})"
            )
        return ids

    async def score_group(self, group: Sequence[Trajectory]) -> None:
        """Scores the group's finished episodes in one batch and sets their rewards."""
        todo: list[tuple[Trajectory, list[int]]] = []
        for t in group:
            if t.stop_reason.is_failure:  # not trained on: scoring it would be waste
                continue
            try:
                todo.append((t, self.render(t)))
            except ValueError as e:
                _fail(t, str(e))
        if not todo:
            return
        t0 = time.perf_counter()
        try:
            scores = await self.model.score([ids for _, ids in todo])
        except Exception as e:  # RewardModelError, or anything else: one reason per episode
            for t, _ in todo:
                _fail(t, str(e) or repr(e))
            return
        latency = time.perf_counter() - t0
        for (t, _), s in zip(todo, scores, strict=True):
            if not math.isfinite(s):
                _fail(t, f"reward model returned {s}")
                continue
            t.info["env_reward"] = t.reward
            t.metrics["rm/score"] = s
            t.metrics["rm/latency_s"] = latency
            t.reward = self.mix.combine(t.reward, s)


def _fail(traj: Trajectory, reason: str) -> None:
    traj.info["stop_reason_before_reward"] = str(traj.stop_reason)
    traj.stop_reason = StopReason.REWARD_ERROR
    traj.error = f"reward model scoring failed: {reason}"


class _GroupRunner(Protocol):
    group_size: int

    async def run_group(
        self, task: Any, *, index: int, seed: int | None = 0, tag: str = ""
    ) -> list[Trajectory]: ...


class ScoredRunner:
    """A group runner whose groups are scored by a reward model before they are returned.

    Args:
        inner: Runs the episodes (a RolloutRunner, the gateway's runner, ...).
        scorer: Scores them.
    """

    def __init__(self, inner: _GroupRunner, scorer: Scorer) -> None:
        self.inner = inner
        self.scorer = scorer
        self.group_size = inner.group_size

    async def run_group(
        self, task: Any, *, index: int, seed: int | None = 0, tag: str = ""
    ) -> list[Trajectory]:
        """Runs the task's group, then scores it."""
        group = await self.inner.run_group(task, index=index, seed=seed, tag=tag)
        await self.scorer.score_group(group)
        return group


def reward_model_metrics(trajectories: Sequence[Trajectory]) -> dict[str, float]:
    """``reward/rm_mean``, ``reward/rm_std``, ``reward/rm_latency_s`` (mean per batch
    request) and ``reward/rm_scored`` of the episodes a reward model scored; {} if none."""
    scored = [t for t in trajectories if "rm/score" in t.metrics]
    if not scored:
        return {}
    s = [t.metrics["rm/score"] for t in scored]
    mean = sum(s) / len(s)
    std = math.sqrt(sum((x - mean) ** 2 for x in s) / len(s))
    lat = [t.metrics["rm/latency_s"] for t in scored]
    return {
        "reward/rm_mean": mean,
        "reward/rm_std": std,
        "reward/rm_latency_s": sum(lat) / len(lat),
        "reward/rm_scored": float(len(scored)),
    }
