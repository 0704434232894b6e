"""Reward shaping and filtering on each episode's total reward.

Order: overlong penalty → stop-properly penalty → clipping → dynamic filtering →
normalization. Per-turn rewards stay as the env gave them; the shaped total minus
their sum lands on the episode's last model token (see ``batch.build_batch``).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Protocol

import numpy as np

from agentrl.types import Trajectory

__all__ = ["ShapedRewards", "ShapingParams", "dynamic_filter", "overlong_penalty", "shape_rewards"]


class ShapingParams(Protocol):
    """The shaping settings (``trainer.shaping``, :class:`agentrl.trainer.ShapingConfig`)."""

    @property
    def max_response_tokens(self) -> int | None: ...
    @property
    def overlong_buffer(self) -> int | None: ...
    @property
    def overlong_factor(self) -> float: ...
    @property
    def stop_properly_coef(self) -> float | None: ...
    @property
    def truncated_reasons(self) -> list[str]: ...
    @property
    def dynamic_filter(self) -> bool: ...
    @property
    def reward_clip(self) -> float | None: ...
    @property
    def reward_normalize(self) -> bool: ...


def overlong_penalty(n_tokens: int, max_len: int, buffer: int, factor: float = 1.0) -> float:
    """DAPO soft overlong punishment (Yu et al. 2025, eq. 13).

    R = 0 if |y| ≤ L_max - L_cache;
    R = ((L_max - L_cache) - |y|) / L_cache if L_max - L_cache < |y| ≤ L_max;
    R = -1 beyond L_max; scaled by ``factor``.
    """
    expected = max_len - buffer
    exceed = min(n_tokens - expected, buffer)
    return -exceed / buffer * factor if exceed > 0 else 0.0


@dataclass
class ShapedRewards:
    """Shaped totals of the kept episodes.

    Attributes:
        kept: Indices (into the input list) of the episodes kept.
        scores: Their shaped total rewards.
        raw: Their rewards before shaping.
        truncated: Whether each kept episode was truncated.
        metrics: Shaping counters.
    """

    kept: list[int]
    scores: list[float]
    raw: list[float]
    truncated: list[bool]
    metrics: dict[str, float] = field(default_factory=dict)


def dynamic_filter(group_ids: Sequence[str], scores: Sequence[float]) -> tuple[list[int], int]:
    """DAPO dynamic sampling (Yu et al. 2025, eq. 11 constraint 0 < |{correct}| < G).

    Drops groups whose rewards are all equal (zero advantage, no gradient); groups of one
    episode are kept. Returns (indices kept, number of groups dropped).
    """
    by_group: dict[str, list[int]] = {}
    for i, g in enumerate(group_ids):
        by_group.setdefault(g, []).append(i)
    kept: list[int] = []
    dropped = 0
    for idx in by_group.values():
        vals = [scores[i] for i in idx]
        if len(idx) > 1 and max(vals) - min(vals) <= 1e-12:
            dropped += 1
        else:
            kept.extend(idx)
    return sorted(kept), dropped


def shape_rewards(trajectories: Sequence[Trajectory], cfg: ShapingParams) -> ShapedRewards:
    """Applies the configured shaping to each episode's ``reward``."""
    raw = [float(t.reward) for t in trajectories]
    truncated = [str(t.stop_reason) in cfg.truncated_reasons for t in trajectories]
    scores = list(raw)
    metrics: dict[str, float] = {}
    if cfg.overlong_buffer is not None and cfg.max_response_tokens is not None:
        pens = [
            overlong_penalty(
                t.num_model_tokens,
                cfg.max_response_tokens,
                cfg.overlong_buffer,
                cfg.overlong_factor,
            )
            for t in trajectories
        ]
        scores = [s + p for s, p in zip(scores, pens, strict=True)]
        metrics["shaping/overlong_penalized"] = float(sum(p < 0 for p in pens))
        metrics["shaping/overlong_penalty_mean"] = float(np.mean(pens)) if pens else 0.0
    if cfg.stop_properly_coef is not None:
        # ProRL v2 stop-properly penalty (NVIDIA 2025; OpenRLHF stop_properly_penalty_coef):
        # a truncated episode's reward is scaled by coef ∈ [0, 1].
        scores = [
            s * cfg.stop_properly_coef if tr else s for s, tr in zip(scores, truncated, strict=True)
        ]
    if cfg.reward_clip is not None:
        c = cfg.reward_clip
        scores = [min(max(s, -c), c) for s in scores]
    kept = list(range(len(trajectories)))
    if cfg.dynamic_filter:
        kept, dropped = dynamic_filter([trajectories[i].group_id for i in kept], scores)
        metrics["filter/dropped_groups"] = float(dropped)
        metrics["filter/kept_episodes"] = float(len(kept))
    scores = [scores[i] for i in kept]
    if cfg.reward_normalize and len(scores) > 1:
        arr = np.asarray(scores, dtype=np.float64)
        # Sample (Bessel-corrected) std, as GRPO's group std and torch.std.
        scores = list((arr - arr.mean()) / (arr.std(ddof=1) + 1e-8))
    return ShapedRewards(
        kept=kept,
        scores=[float(s) for s in scores],
        raw=[raw[i] for i in kept],
        truncated=[truncated[i] for i in kept],
        metrics=metrics,
    )
