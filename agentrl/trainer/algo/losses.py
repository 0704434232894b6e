"""Policy losses (PPO clip / clip-higher / dual-clip, GSPO, plain PG), aggregation, value loss.

A policy loss returns the per-token loss ``loss_BR`` (to be minimized) and per-token
indicators for metrics; aggregation turns per-token values into one scalar through
per-token weights computed once per mini-batch, so splitting a mini-batch into
micro-batches (or across data-parallel workers) leaves the total unchanged.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

import torch

__all__ = [
    "AGG_MODES",
    "DEFAULT_DUAL_CLIP_C",
    "POLICY_LOSSES",
    "PREFERENCE_LOSSES",
    "PolicyLossOutput",
    "agg_loss",
    "agg_weights",
    "compute_policy_loss",
    "explained_variance",
    "value_loss",
]

AGG_MODES = ("token-mean", "seq-mean-token-mean", "seq-mean-token-sum-norm")
DEFAULT_DUAL_CLIP_C = 3.0  # verl's clip_ratio_c
# exp() guard on log(π_θ/π_old). It changes a loss in one case only: ppo (without dual
# clip) on a token with A < 0 and log-ratio > 20, where the unclipped term -A·r would be
# -A·e^(>20): the loss is capped at -A·e^20 and that token's gradient is 0 (docs/trainer.md).
# Everywhere else the clip already makes the loss flat (A > 0, r > 1+ε; A < 0, r < 1-ε)
# or the term is below A·2e-9. Dual clip (c) bounds such tokens by -c·A instead.
_MAX_LOG_RATIO = 20.0


@dataclass
class PolicyLossOutput:
    """Per-token loss and diagnostics.

    Attributes:
        loss_BR: Per-token loss (minimize), zero on padding.
        ratio_BR: The ratio the loss clips (token or GSPO sequence ratio), detached.
        indicators: Name → per-token 0/1 tensor (clip_low, clip_high, dual_clip).
    """

    loss_BR: torch.Tensor
    ratio_BR: torch.Tensor
    indicators: dict[str, torch.Tensor] = field(default_factory=dict)


@dataclass(frozen=True)
class LossParams:
    """Constants a policy loss may use."""

    clip_low: float = 0.2
    clip_high: float = 0.2
    dual_clip_c: float | None = None
    """ppo applies the dual clip iff set (verl's PPO loss: c = 3); dual_clip uses 3 if None."""


PolicyLossFn = Callable[
    [torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, LossParams], PolicyLossOutput
]


def _ppo_core(
    ratio_BR: torch.Tensor, adv_BR: torch.Tensor, mask_BR: torch.Tensor, p: LossParams, dual: bool
) -> PolicyLossOutput:
    # PPO clipped surrogate (Schulman et al. 2017, eq. 7) with decoupled bounds
    # [1-ε_low, 1+ε_high] (DAPO clip-higher, Yu et al. 2025 eq. 10):
    #   L = max(-A·r, -A·clip(r, 1-ε_low, 1+ε_high)).
    pg1_BR = -adv_BR * ratio_BR
    pg2_BR = -adv_BR * torch.clamp(ratio_BR, 1.0 - p.clip_low, 1.0 + p.clip_high)
    loss_BR = torch.maximum(pg1_BR, pg2_BR)
    r = ratio_BR.detach()
    ind = {
        "clip_low": ((adv_BR < 0) & (r < 1.0 - p.clip_low)).float() * mask_BR,
        "clip_high": ((adv_BR > 0) & (r > 1.0 + p.clip_high)).float() * mask_BR,
    }
    if dual:
        # Dual-clip PPO (Ye et al. 2020, eq. 6): for A < 0, L = min(L, -c·A) bounds the loss
        # when r ≫ 1.
        c = p.dual_clip_c if p.dual_clip_c is not None else DEFAULT_DUAL_CLIP_C
        pg3_BR = -adv_BR * c
        ind["dual_clip"] = ((adv_BR < 0) & (loss_BR.detach() > pg3_BR)).float() * mask_BR
        loss_BR = torch.where(adv_BR < 0, torch.minimum(loss_BR, pg3_BR), loss_BR)
    return PolicyLossOutput(loss_BR * mask_BR, r * mask_BR, ind)


def _token_ratio(logp_BR: torch.Tensor, old_logp_BR: torch.Tensor) -> torch.Tensor:
    return torch.exp(torch.clamp(logp_BR - old_logp_BR, -_MAX_LOG_RATIO, _MAX_LOG_RATIO))


def ppo_loss(
    logp_BR: torch.Tensor,
    old_logp_BR: torch.Tensor,
    adv_BR: torch.Tensor,
    mask_BR: torch.Tensor,
    p: LossParams,
) -> PolicyLossOutput:
    """PPO clip (clip-higher when clip_high > clip_low); dual clip too when ``dual_clip_c``."""
    dual = p.dual_clip_c is not None
    return _ppo_core(_token_ratio(logp_BR, old_logp_BR), adv_BR, mask_BR, p, dual=dual)


def dual_clip_loss(
    logp_BR: torch.Tensor,
    old_logp_BR: torch.Tensor,
    adv_BR: torch.Tensor,
    mask_BR: torch.Tensor,
    p: LossParams,
) -> PolicyLossOutput:
    """PPO clip plus the dual clip with constant c (3 when ``dual_clip_c`` is None)."""
    return _ppo_core(_token_ratio(logp_BR, old_logp_BR), adv_BR, mask_BR, p, dual=True)


def gspo_loss(
    logp_BR: torch.Tensor,
    old_logp_BR: torch.Tensor,
    adv_BR: torch.Tensor,
    mask_BR: torch.Tensor,
    p: LossParams,
) -> PolicyLossOutput:
    """GSPO-token (Zheng et al. 2025, arXiv:2507.18071 eqs. 7, 13-14).

    s_i = exp(1/|y_i| Σ_t log(π_θ/π_old)); s_{i,t} = sg[s_i]·π_θ(y_t)/sg[π_θ(y_t)], whose value
    is s_i and whose gradient is token-level; then the clipped surrogate on s_{i,t}.
    """
    n_B = mask_BR.sum(-1).clamp(min=1)
    log_seq_B = ((logp_BR - old_logp_BR) * mask_BR).sum(-1) / n_B
    log_s_BR = log_seq_B.detach()[:, None] + logp_BR - logp_BR.detach()
    ratio_BR = torch.exp(torch.clamp(log_s_BR, -_MAX_LOG_RATIO, _MAX_LOG_RATIO))
    return _ppo_core(ratio_BR, adv_BR, mask_BR, p, dual=False)


def pg_loss(
    logp_BR: torch.Tensor,
    old_logp_BR: torch.Tensor,
    adv_BR: torch.Tensor,
    mask_BR: torch.Tensor,
    p: LossParams,
) -> PolicyLossOutput:
    """Plain policy gradient (REINFORCE, Williams 1992): L = -A·log π_θ, one step per batch.

    Written as -A·exp(log π - sg[log π]) (value -A, gradient -A∇log π); rollout-correction
    weights multiply it as in truncated-IS policy gradient.
    """
    ratio_BR = torch.exp(logp_BR - logp_BR.detach())
    return PolicyLossOutput(-adv_BR * ratio_BR * mask_BR, ratio_BR.detach() * mask_BR, {})


POLICY_LOSSES: dict[str, PolicyLossFn] = {
    "ppo": ppo_loss,
    "dual_clip": dual_clip_loss,
    "gspo": gspo_loss,
    "pg": pg_loss,
}


# Losses on preference pairs instead of advantages: ``Trainer.step`` hands the batch to
# ``agentrl.trainer.objectives.dpo`` (pairs from groups or a file; DPO / IPO in trainer.preference).
PREFERENCE_LOSSES = ("dpo",)


def compute_policy_loss(
    name: str,
    logp_BR: torch.Tensor,
    old_logp_BR: torch.Tensor,
    adv_BR: torch.Tensor,
    mask_BR: torch.Tensor,
    params: LossParams | None = None,
) -> PolicyLossOutput:
    """Runs policy loss ``name``.

    Raises:
        ValueError: Unknown name (the message lists the valid ones).
    """
    fn = POLICY_LOSSES.get(name)
    if fn is None:
        raise ValueError(f"unknown policy loss {name!r}; valid: {', '.join(sorted(POLICY_LOSSES))}")
    return fn(logp_BR, old_logp_BR, adv_BR, mask_BR, params or LossParams())


def agg_weights(
    mask_BR: torch.Tensor, mode: str, norm_constant: float | None = None
) -> torch.Tensor:
    """Per-token weights w with Σ w·loss = the aggregated loss over this (mini-)batch.

    token-mean: Σ_{i,t} l / Σ_{i,t} 1 (DAPO token-level loss, Yu et al. 2025 eq. 12).
    seq-mean-token-mean: 1/S Σ_i (1/|y_i|) Σ_t l (GRPO, Shao et al. 2024 eq. 3); S counts
    episodes with at least one token.
    seq-mean-token-sum-norm: 1/S Σ_i Σ_t l / L (Dr. GRPO, Liu et al. 2025: a constant L
    instead of |y_i|); L = ``norm_constant`` (required: the configured max response length,
    the same for every mini-batch and step — the longest row would change between them).

    Raises:
        ValueError: Unknown mode, or seq-mean-token-sum-norm without ``norm_constant``.
    """
    n_B = mask_BR.sum(-1)
    if mode == "token-mean":
        return mask_BR / mask_BR.sum().clamp(min=1)
    S = (n_B > 0).sum().clamp(min=1)
    if mode == "seq-mean-token-mean":
        return mask_BR / (n_B.clamp(min=1)[:, None] * S)
    if mode == "seq-mean-token-sum-norm":
        if not norm_constant or norm_constant <= 0:
            raise ValueError(
                "seq-mean-token-sum-norm needs a positive constant L (Dr. GRPO): set "
                "loss.loss_norm_constant or shaping.max_response_tokens"
            )
        return mask_BR / (S * float(norm_constant))
    raise ValueError(f"unknown loss aggregation {mode!r}; valid: {', '.join(AGG_MODES)}")


def agg_loss(
    loss_BR: torch.Tensor, mask_BR: torch.Tensor, mode: str, norm_constant: float | None = None
) -> torch.Tensor:
    """Aggregates a per-token loss over the whole of ``mask_BR``."""
    return (loss_BR * agg_weights(mask_BR, mode, norm_constant)).sum()


def value_loss(
    values_BR: torch.Tensor,
    old_values_BR: torch.Tensor,
    returns_BR: torch.Tensor,
    mask_BR: torch.Tensor,
    clip: float | None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-token clipped value loss and its clip indicator.

    ½ max((V - R)², (V_old + clip(V - V_old, -ε, ε) - R)²) (PPO2 value clipping,
    Dhariwal et al. 2017 OpenAI Baselines; Andrychowicz et al. 2021 §3.3). A token counts
    as clipped when |V - V_old| > ε and the clipped error is the larger: inside the range
    V_old + (V - V_old) can differ from V by one ulp, which must neither count as a clip
    nor pick the clipped term.
    """
    err1_BR = (values_BR - returns_BR) ** 2
    if clip is None:
        return 0.5 * err1_BR * mask_BR, torch.zeros_like(mask_BR)
    delta_BR = values_BR - old_values_BR
    v_clip_BR = old_values_BR + torch.clamp(delta_BR, -clip, clip)
    err2_BR = (v_clip_BR - returns_BR) ** 2
    clipped_BR = (delta_BR.abs() > clip) & (err2_BR > err1_BR)
    loss_BR = torch.where(clipped_BR, err2_BR, err1_BR)
    return 0.5 * loss_BR * mask_BR, clipped_BR.float() * mask_BR


def explained_variance(
    values_BR: torch.Tensor, returns_BR: torch.Tensor, mask_BR: torch.Tensor
) -> float:
    """1 - Var[R - V] / Var[R] over masked tokens (nan when Var[R] = 0)."""
    n = mask_BR.sum()
    if n < 2:
        return float("nan")

    def var(x: torch.Tensor) -> torch.Tensor:
        m = (x * mask_BR).sum() / n
        return (((x - m) ** 2) * mask_BR).sum() / n

    vr = var(returns_BR)
    if vr <= 0:
        return float("nan")
    return float(1.0 - var(returns_BR - values_BR) / vr)
