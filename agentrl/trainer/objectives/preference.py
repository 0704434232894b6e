"""Preference pairs and the DPO / IPO losses on them.

A pair is two episodes of one prompt, ``chosen`` preferred to ``rejected``. They come
from the groups of a run (the best and the worst episode of a group, by reward) or from
a file of preference pairs (``agentrl.trainer.objectives.pairs_file``). The losses take sequence
log-probabilities summed (or averaged) over the model's tokens of each episode only.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

import torch

from agentrl.types import Trajectory

__all__ = [
    "PREFERENCE_VARIANTS",
    "PairOutput",
    "PairSet",
    "build_group_pairs",
    "preference_loss",
    "sequence_logp",
]

PREFERENCE_VARIANTS = ("sigmoid", "ipo")


@dataclass(frozen=True)
class PairSet:
    """Pairs built from a batch of episodes, and what could not be paired.

    Attributes:
        pairs: (chosen, rejected) episodes.
        single_groups: Groups with fewer than two episodes that have model tokens.
        tied_groups: Groups whose episodes all have the same reward (no preference).
        episodes_without_model_tokens: Episodes left out: nothing to score.
    """

    pairs: list[tuple[Trajectory, Trajectory]] = field(default_factory=list)
    single_groups: int = 0
    tied_groups: int = 0
    episodes_without_model_tokens: int = 0


def build_group_pairs(trajectories: Sequence[Trajectory], eps: float = 1e-12) -> PairSet:
    """One pair per group: its highest-reward episode (chosen) vs its lowest (rejected).

    Groups are the episodes sharing ``group_id``, in first-seen order. Among episodes
    with the same best (or worst) reward, the first in the batch's order is taken.
    A group with fewer than two scorable episodes, or whose rewards differ by at most
    ``eps`` (no reward spread), yields no pair and is counted.
    """
    groups: dict[str, list[Trajectory]] = {}
    empty = 0
    for t in trajectories:
        if not t.num_model_tokens:
            empty += 1
            groups.setdefault(t.group_id, [])
            continue
        groups.setdefault(t.group_id, []).append(t)
    pairs: list[tuple[Trajectory, Trajectory]] = []
    single = tied = 0
    for eps_list in groups.values():
        if len(eps_list) < 2:
            single += 1
            continue
        best = max(eps_list, key=lambda t: t.reward)  # max/min keep the first of equals
        worst = min(eps_list, key=lambda t: t.reward)
        if best.reward - worst.reward <= eps:
            tied += 1
            continue
        pairs.append((best, worst))
    return PairSet(pairs, single, tied, empty)


def sequence_logp(logp_BR: torch.Tensor, mask_BR: torch.Tensor, length_norm: bool) -> torch.Tensor:
    """Σ_t log π(y_t | …) over each row's model tokens, or its mean when ``length_norm``.

    The mean is SimPO's average log-probability (Meng et al. 2024, eq. 4), here applied
    to the policy and to the reference alike (the reference term is kept).
    """
    s_B = (logp_BR * mask_BR).sum(-1)
    if length_norm:
        s_B = s_B / mask_BR.sum(-1).clamp(min=1)
    return s_B


@dataclass(frozen=True)
class PairOutput:
    """Per-pair DPO quantities (P pairs).

    Attributes:
        loss_P: The loss of each pair (minimize).
        chosen_reward_P: Implicit reward β·(log π(y_w) - log π_ref(y_w)), detached.
        rejected_reward_P: β·(log π(y_l) - log π_ref(y_l)), detached.
    """

    loss_P: torch.Tensor
    chosen_reward_P: torch.Tensor
    rejected_reward_P: torch.Tensor

    @property
    def margin_P(self) -> torch.Tensor:
        return self.chosen_reward_P - self.rejected_reward_P


def preference_loss(
    chosen_logp_P: torch.Tensor,
    rejected_logp_P: torch.Tensor,
    ref_chosen_logp_P: torch.Tensor,
    ref_rejected_logp_P: torch.Tensor,
    *,
    beta: float,
    variant: str = "sigmoid",
) -> PairOutput:
    """The DPO (sigmoid) or IPO loss of each pair from sequence log-probabilities.

    With h = (log π(y_w) - log π_ref(y_w)) - (log π(y_l) - log π_ref(y_l)):

    - sigmoid: -log σ(β·h) (Rafailov et al. 2023, eq. 7);
    - ipo: (h - 1/(2β))² (Azar et al. 2023, eq. 17, with τ = β).

    Raises:
        ValueError: Unknown variant or β ≤ 0.
    """
    if beta <= 0:
        raise ValueError(f"DPO beta must be > 0, got {beta}")
    d_chosen = chosen_logp_P - ref_chosen_logp_P
    d_rejected = rejected_logp_P - ref_rejected_logp_P
    h = d_chosen - d_rejected
    if variant == "sigmoid":
        # -log σ(x) = softplus(-x), stable for large |x|.
        loss = torch.nn.functional.softplus(-beta * h)
    elif variant == "ipo":
        loss = (h - 1.0 / (2.0 * beta)) ** 2
    else:
        valid = ", ".join(PREFERENCE_VARIANTS)
        raise ValueError(f"unknown DPO variant {variant!r}; valid: {valid}")
    return PairOutput(loss, beta * d_chosen.detach(), beta * d_rejected.detach())
