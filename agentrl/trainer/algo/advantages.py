"""Advantage estimators over the model's tokens, selectable by name.

Tensors are "compact": row b holds the model tokens (``loss_mask == 1``) of episode b,
left-aligned, padded to R columns; ``mask_BR`` is 1 on real tokens. Rewards are
per token: a turn's reward sits on that turn's last model token, the episode's
remaining (outcome) reward on its last model token. An in-reward KL penalty is kept
apart (``penalty_BR``, β·KL on every token): it is never a turn's reward, so it cannot
change how grpo supervises. ``turn_BR`` numbers the model turns of each episode (0, 1, …).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

import torch

from agentrl.trainer.algo.tree import tree_advantages

__all__ = [
    "ADVANTAGE_ESTIMATORS",
    "AdvantageInputs",
    "Estimator",
    "compute_advantages",
    "gae",
    "group_stats",
    "masked_whiten",
    "returns_to_go",
    "turn_step_rewards",
]


@dataclass
class AdvantageInputs:
    """What an estimator may read.

    Attributes:
        rewards_BR: Per-token rewards (zero on padding).
        mask_BR: 1.0 on model tokens.
        turn_BR: Model-turn index of each token (any value on padding).
        group_B: Integer group id per episode.
        values_BR: Critic values V(s_t) (gae only).
        gamma: Discount.
        lam: GAE λ.
        norm_by_std: grpo's std switch.
        eps: Added to std before dividing.
        process: grpo's supervision: True credits each turn by its own reward
            (process), False every turn by the episode total (outcome). Chosen by the
            config (``trainer.advantage.supervision``), never from the reward values.
        penalty_BR: In-reward KL penalty β·KL_t per token (subtracted from the rewards);
            grpo adds an episode's total penalty to its outcome, the last turn's step.
        node_BR: Tree node id of each model token (tree_grpo; -1 on padding), unique
            across the batch; None: every episode is its own node (no tree).
    """

    rewards_BR: torch.Tensor
    mask_BR: torch.Tensor
    turn_BR: torch.Tensor
    group_B: torch.Tensor
    values_BR: torch.Tensor | None = None
    gamma: float = 1.0
    lam: float = 1.0
    norm_by_std: bool = True
    eps: float = 1e-6
    process: bool = False
    penalty_BR: torch.Tensor | None = None
    node_BR: torch.Tensor | None = None

    def net_rewards_BR(self) -> torch.Tensor:
        """Rewards less the in-reward KL penalty, per token."""
        return self.rewards_BR if self.penalty_BR is None else self.rewards_BR - self.penalty_BR


EstimatorFn = Callable[[AdvantageInputs], tuple[torch.Tensor, torch.Tensor]]


@dataclass(frozen=True)
class Estimator:
    """A registered estimator: ``fn(inputs) -> (advantages_BR, returns_BR)``."""

    fn: EstimatorFn
    whiten_by_default: bool
    needs_critic: bool = False


def returns_to_go(
    rewards_BR: torch.Tensor, mask_BR: torch.Tensor, turn_BR: torch.Tensor, gamma: float
) -> torch.Tensor:
    """G_t = Σ_{s≥t} γ^(turn(s)-turn(t)) r_s: reward-to-go, discounted per model turn.

    REINFORCE with reward-to-go (Williams 1992; Sutton & Barto §13.3); with one outcome
    reward and γ = 1 every token's G_t is the episode reward.
    """
    B, R = rewards_BR.shape
    G_BR = torch.zeros_like(rewards_BR)
    running_B = torch.zeros(B, dtype=rewards_BR.dtype, device=rewards_BR.device)
    r_BR = rewards_BR * mask_BR
    for t in reversed(range(R)):
        if t + 1 < R:
            # The discount applies only when token t+1 starts a later turn.
            new_turn_B = (turn_BR[:, t + 1] != turn_BR[:, t]) & (mask_BR[:, t + 1] > 0)
            running_B = running_B * torch.where(new_turn_B, gamma, 1.0)
        running_B = r_BR[:, t] + running_B
        G_BR[:, t] = running_B
    return G_BR * mask_BR


def gae(
    rewards_BR: torch.Tensor,
    values_BR: torch.Tensor,
    mask_BR: torch.Tensor,
    gamma: float,
    lam: float,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Generalized advantage estimation (Schulman et al. 2016, eqs. 11-16).

    δ_t = r_t + γ V(s_{t+1}) - V(s_t);  A_t = Σ_l (γλ)^l δ_{t+l};  returns = A + V.
    V after an episode's last model token is 0 (terminal). Observation tokens are not
    in the compact rows, so s_{t+1} is the state before the next model token.
    """
    B, R = rewards_BR.shape
    adv_BR = torch.zeros_like(rewards_BR)
    next_value_B = torch.zeros(B, dtype=rewards_BR.dtype, device=rewards_BR.device)
    next_adv_B = torch.zeros_like(next_value_B)
    for t in reversed(range(R)):
        m_B = mask_BR[:, t]
        delta_B = rewards_BR[:, t] + gamma * next_value_B - values_BR[:, t]
        a_B = delta_B + gamma * lam * next_adv_B
        # Padding passes the terminal (0, 0) through unchanged.
        next_adv_B = torch.where(m_B > 0, a_B, next_adv_B)
        next_value_B = torch.where(m_B > 0, values_BR[:, t], next_value_B)
        adv_BR[:, t] = a_B * m_B
    return adv_BR, (adv_BR + values_BR) * mask_BR


def group_stats(
    score_B: torch.Tensor, group_B: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """Per-episode (group mean, group unbiased std, group sum, group size).

    Accumulated in float64, so a group whose scores are all equal gets exactly its
    score as mean and exactly 0 as std (in float32 the mean can be one ulp off, and
    ``(R - mean) / (std + eps)`` is then a large same-sign push on a group with no
    signal). A group of one has mean 0 and std 1 (as verl), so its advantage is its
    own return.
    """
    x_B = score_B.to(torch.float64)
    _, inv_B = torch.unique(group_B, return_inverse=True)
    G = int(inv_B.max().item()) + 1 if inv_B.numel() else 0
    n_G = torch.zeros(G, dtype=x_B.dtype, device=x_B.device).index_add_(
        0, inv_B, torch.ones_like(x_B)
    )
    sum_G = torch.zeros_like(n_G).index_add_(0, inv_B, x_B)
    mean_G = sum_G / n_G
    # Equal scores: n·x is exact in float64 (24-bit mantissas), so sum/n is exactly x;
    # the spread test makes that explicit for any input dtype.
    lo_G = torch.full_like(n_G, math.inf).scatter_reduce_(0, inv_B, x_B, "amin")
    hi_G = torch.full_like(n_G, -math.inf).scatter_reduce_(0, inv_B, x_B, "amax")
    flat_G = lo_G == hi_G
    mean_G = torch.where(flat_G, lo_G, mean_G)
    sq_G = torch.zeros_like(n_G).index_add_(0, inv_B, (x_B - mean_G[inv_B]) ** 2)
    std_G = torch.sqrt(sq_G / (n_G - 1).clamp(min=1))  # Bessel-corrected, as torch.std
    std_G = torch.where(flat_G, torch.zeros_like(std_G), std_G)
    single_G = n_G < 2
    mean_G = torch.where(single_G, torch.zeros_like(mean_G), mean_G)
    std_G = torch.where(single_G, torch.ones_like(std_G), std_G)
    dt = score_B.dtype
    return mean_G[inv_B].to(dt), std_G[inv_B].to(dt), sum_G[inv_B].to(dt), n_G[inv_B].to(dt)


def masked_whiten(x_BR: torch.Tensor, mask_BR: torch.Tensor, eps: float = 1e-8) -> torch.Tensor:
    """(x - mean) / sqrt(var + eps) over masked entries, unbiased variance (as verl)."""
    n = mask_BR.sum()
    if n < 2:
        return x_BR * mask_BR
    mean = (x_BR * mask_BR).sum() / n
    var = (((x_BR - mean) ** 2) * mask_BR).sum() / (n - 1)
    return (x_BR - mean) * torch.rsqrt(var + eps) * mask_BR


def _episode_return(G_BR: torch.Tensor) -> torch.Tensor:
    # G at the first model token: the episode's whole (turn-discounted) return.
    return G_BR[:, 0]


def turn_step_rewards(
    rewards_BR: torch.Tensor, mask_BR: torch.Tensor, turn_BR: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Rewards summed per model turn: (step reward (B, K), turn exists (B, K), turn (B, R)).

    ``turn_BR`` is clamped to 0 on padding so it can index the (B, K) tensors.
    """
    B, _ = rewards_BR.shape
    t_BR = torch.where(mask_BR > 0, turn_BR, torch.zeros_like(turn_BR)).long()
    K = int(t_BR.max().item()) + 1 if t_BR.numel() else 1
    step_BK = torch.zeros(B, K, dtype=torch.float64, device=rewards_BR.device)
    step_BK.scatter_add_(1, t_BR, (rewards_BR * mask_BR).to(torch.float64))
    has_BK = torch.zeros(B, K, dtype=torch.float64, device=rewards_BR.device)
    has_BK.scatter_add_(1, t_BR, mask_BR.to(torch.float64))
    return step_BK, has_BK > 0, t_BR


def _grpo(x: AdvantageInputs) -> tuple[torch.Tensor, torch.Tensor]:
    """GRPO (Shao et al. 2024, DeepSeekMath §4.1.2-4.1.3), outcome or process supervision.

    The supervision is ``x.process`` (the config's, never read off the rewards):

    * outcome: one step per episode, its last turn, carrying the episode total R (turn
      rewards, outcome and in-reward KL penalty together):
      Â_t = γ^(T-1-turn(t)) · (R - mean_g R) / (std_g R + ε) (§4.1.2; with γ = 1 every
      token gets (R - mean)/(std + ε));
    * process: every model turn k of every episode is a step with reward ρ_k (the rewards
      on that turn's tokens; the episode's KL penalty joins its last step);
      ρ̃ = (ρ - mean_g ρ) / (std_g ρ + ε) over all steps of the group, and
      Â_t = Σ_{k ≥ turn(t)} γ^(k-turn(t)) ρ̃_k (§4.1.3: the sum of the normalized rewards
      of the following steps).

    Bound: with N steps in the group (N = G for outcome) and T turns in the episode,
    Cauchy-Schwarz and Σ (ρ - mean)² = (N-1)·std² give |Â_t| ≤ √(T_steps·(N-1)),
    T_steps = 1 for outcome (√(G-1)); a group whose steps are all equal gets exactly 0.
    A group with one step (N = 1) gets ρ̃ = ρ (verl's convention, mean 0 and std 1).
    ``norm_by_std=False`` drops the division.
    """
    G_BR = returns_to_go(x.net_rewards_BR(), x.mask_BR, x.turn_BR, x.gamma)
    step_BK, has_BK, t_BR = turn_step_rewards(x.rewards_BR, x.mask_BR, x.turn_BR)
    B, K = step_BK.shape
    k_K = torch.arange(K, device=step_BK.device)
    last_B = torch.where(has_BK, k_K[None, :], torch.full_like(k_K[None, :], -1)).amax(-1)
    is_last_BK = k_K[None, :] == last_B[:, None]
    if x.penalty_BR is not None:  # the whole episode's penalty on its last step
        pen_B = (x.penalty_BR * x.mask_BR).to(torch.float64).sum(-1)
        step_BK = step_BK - torch.where(is_last_BK, pen_B[:, None], 0.0)
    _, inv_B = torch.unique(x.group_B, return_inverse=True)
    if x.process:
        use_BK = has_BK
    else:  # one step per episode, its last turn, carrying the episode total
        step_BK = torch.where(is_last_BK, step_BK.sum(-1, keepdim=True), 0.0)
        use_BK = is_last_BK & has_BK
    flat = use_BK.flatten()
    mean_S, std_S, _, _ = group_stats(
        step_BK.flatten()[flat], inv_B[:, None].expand(B, K).flatten()[flat]
    )
    norm_S = step_BK.flatten()[flat] - mean_S
    if x.norm_by_std:
        norm_S = norm_S / (std_S + x.eps)
    norm_BK = torch.zeros(B * K, dtype=torch.float64, device=step_BK.device)
    norm_BK[flat] = norm_S
    norm_BK = norm_BK.view(B, K)
    # Â at turn k = Σ_{k' ≥ k} γ^(k'-k) ρ̃_k' (discounted per model turn, as returns_to_go).
    adv_BK = torch.zeros_like(norm_BK)
    running_B = torch.zeros(B, dtype=torch.float64, device=step_BK.device)
    for k in reversed(range(K)):
        running_B = norm_BK[:, k] + x.gamma * running_B
        adv_BK[:, k] = running_B
    adv_BR = adv_BK.gather(1, t_BR).to(x.rewards_BR.dtype)
    return adv_BR * x.mask_BR, G_BR


def _dr_grpo(x: AdvantageInputs) -> tuple[torch.Tensor, torch.Tensor]:
    # Dr. GRPO (Liu et al. 2025, "Understanding R1-Zero-Like Training", eq. 3): Â = R - mean(R).
    G_BR = returns_to_go(x.net_rewards_BR(), x.mask_BR, x.turn_BR, x.gamma)
    mean_B, _, _, _ = group_stats(_episode_return(G_BR), x.group_B)
    return (G_BR - mean_B[:, None]) * x.mask_BR, G_BR


def _rloo(x: AdvantageInputs) -> tuple[torch.Tensor, torch.Tensor]:
    # RLOO (Kool et al. 2019; Ahmadian et al. 2024 eq. 6): Â_i = R_i - 1/(k-1) Σ_{j≠i} R_j.
    G_BR = returns_to_go(x.net_rewards_BR(), x.mask_BR, x.turn_BR, x.gamma)
    R_B = _episode_return(G_BR).to(torch.float64)  # float64: equal rewards → baseline = R
    _, _, sum_B, n_B = group_stats(R_B, x.group_B)
    baseline_B = torch.where(n_B > 1, (sum_B - R_B) / (n_B - 1).clamp(min=1), torch.zeros_like(R_B))
    return (G_BR - baseline_B[:, None].to(G_BR.dtype)) * x.mask_BR, G_BR


def _reinforce_pp(x: AdvantageInputs) -> tuple[torch.Tensor, torch.Tensor]:
    # REINFORCE++ (Hu 2025, arXiv:2501.03262 eqs. 5-7): A_t = Σ_{s≥t} γ^(s-t) r_s, then batch-
    # normalized (whitening is this estimator's default and is applied by compute_advantages).
    G_BR = returns_to_go(x.net_rewards_BR(), x.mask_BR, x.turn_BR, x.gamma)
    return G_BR, G_BR


def _reinforce_pp_baseline(x: AdvantageInputs) -> tuple[torch.Tensor, torch.Tensor]:
    # REINFORCE++-baseline (Hu et al. 2025, arXiv:2501.03262 v3): A = R - mean_group(R), then
    # batch-normalized (whitening on by default).
    G_BR = returns_to_go(x.net_rewards_BR(), x.mask_BR, x.turn_BR, x.gamma)
    mean_B, _, _, _ = group_stats(_episode_return(G_BR), x.group_B)
    return (G_BR - mean_B[:, None]) * x.mask_BR, G_BR


def _outcome(x: AdvantageInputs) -> torch.Tensor:
    # Each episode's total, float64, summed as grpo's outcome step (turns, penalty on the last).
    step_BK, has_BK, _ = turn_step_rewards(x.rewards_BR, x.mask_BR, x.turn_BR)
    if x.penalty_BR is not None:
        k_K = torch.arange(step_BK.shape[1], device=step_BK.device)
        last_B = torch.where(has_BK, k_K[None, :], -1).amax(-1)
        pen_B = (x.penalty_BR * x.mask_BR).to(torch.float64).sum(-1)
        step_BK = step_BK - torch.where(k_K[None, :] == last_B[:, None], pen_B[:, None], 0.0)
    return step_BK.sum(-1)


def _tree_grpo(x: AdvantageInputs) -> tuple[torch.Tensor, torch.Tensor]:
    """Tree credit (``trainer/algo/tree.py``): each turn's advantage is its node's mean leaf
    outcome against its parent's (the root: the group mean), over grpo's group std, then
    discounted by γ^(last turn - turn) as grpo's outcome mode. Outcome only: a leaf's
    outcome is its total reward (turn rewards and in-reward KL penalty included). Without
    ``node_BR`` every episode is one node and this is grpo's outcome mode.
    """
    G_BR = returns_to_go(x.net_rewards_BR(), x.mask_BR, x.turn_BR, x.gamma)
    R_B = _outcome(x)
    mean_B, std_B, _, _ = group_stats(R_B, x.group_B)
    B = x.mask_BR.shape[0]
    node_BR = x.node_BR
    if node_BR is None:  # one node per episode
        node_BR = torch.arange(B, device=x.mask_BR.device)[:, None].expand_as(x.mask_BR)
    adv_BR = tree_advantages(
        R_B, node_BR, x.mask_BR, mean_B, std_B, norm_by_std=x.norm_by_std, eps=x.eps
    )
    if x.gamma != 1.0:
        t_BR = torch.where(x.mask_BR > 0, x.turn_BR, torch.zeros_like(x.turn_BR)).to(torch.float64)
        adv_BR = adv_BR * x.gamma ** (t_BR.amax(-1, keepdim=True) - t_BR)
    return adv_BR.to(x.rewards_BR.dtype) * x.mask_BR, G_BR


def _gae(x: AdvantageInputs) -> tuple[torch.Tensor, torch.Tensor]:
    if x.values_BR is None:
        raise ValueError("estimator 'gae' needs critic values")
    return gae(x.net_rewards_BR(), x.values_BR, x.mask_BR, x.gamma, x.lam)


ADVANTAGE_ESTIMATORS: dict[str, Estimator] = {
    "gae": Estimator(_gae, whiten_by_default=True, needs_critic=True),
    "grpo": Estimator(_grpo, whiten_by_default=False),
    "tree_grpo": Estimator(_tree_grpo, whiten_by_default=False),
    "dr_grpo": Estimator(_dr_grpo, whiten_by_default=False),
    "rloo": Estimator(_rloo, whiten_by_default=False),
    "reinforce_pp": Estimator(_reinforce_pp, whiten_by_default=True),
    "reinforce_pp_baseline": Estimator(_reinforce_pp_baseline, whiten_by_default=True),
}


def compute_advantages(
    name: str, inputs: AdvantageInputs, whiten: bool | None = None
) -> tuple[torch.Tensor, torch.Tensor]:
    """Runs estimator ``name``; returns (advantages_BR, returns_BR), zero on padding.

    Raises:
        ValueError: Unknown name (the message lists the valid ones).
    """
    est = ADVANTAGE_ESTIMATORS.get(name)
    if est is None:
        valid = ", ".join(sorted(ADVANTAGE_ESTIMATORS))
        raise ValueError(f"unknown advantage estimator {name!r}; valid: {valid}")
    adv_BR, ret_BR = est.fn(inputs)
    if est.whiten_by_default if whiten is None else whiten:
        adv_BR = masked_whiten(adv_BR, inputs.mask_BR)
    return adv_BR * inputs.mask_BR, ret_BR * inputs.mask_BR
