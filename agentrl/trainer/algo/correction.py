"""Rollout correction: importance weights and masks for the train/inference mismatch.

ρ_t = π_old(y_t) / μ(y_t) where μ is the policy that sampled (the rollout logprobs,
maybe from older weights and always from another engine) and π_old the trainer's
proximal policy. Decoupled mode recomputes π_old with the trainer (Hilton et al.
2022, "Batch size-invariance for policy optimization", decoupled PPO); bypass mode
takes π_old = μ and measures ρ with the current policy, detached.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import torch

__all__ = ["CorrectionResult", "compute_correction", "offpolicy_diagnostics"]

_MAX_LOG = 20.0


@dataclass
class CorrectionResult:
    """What multiplies the per-token policy loss.

    Attributes:
        weights_BR: Importance weights (detached; 1 where no IS is applied).
        keep_BR: 1 on tokens that stay in the loss, 0 on masked / rejected ones.
        metrics: Sums for metrics (see ``offpolicy_diagnostics``).
    """

    weights_BR: torch.Tensor
    keep_BR: torch.Tensor
    metrics: dict[str, float] = field(default_factory=dict)


def _seq_log_ratio(log_rho_BR: torch.Tensor, mask_BR: torch.Tensor, level: str) -> torch.Tensor:
    # Unclamped: masks compare it in log space; weights clamp it before exp().
    s_B = (log_rho_BR * mask_BR).sum(-1)
    if level == "geometric":
        s_B = s_B / mask_BR.sum(-1).clamp(min=1)
    return s_B


def _log(x: float) -> float:
    return math.log(x) if x > 0 else -math.inf


def compute_correction(
    logp_old_BR: torch.Tensor,
    rollout_logp_BR: torch.Tensor,
    mask_BR: torch.Tensor,
    *,
    is_level: str = "none",
    is_cap: float = 2.0,
    mask_level: str = "none",
    mask_low: float = 0.5,
    mask_high: float = 5.0,
    veto_threshold: float | None = None,
    batch_normalize: bool = False,
) -> CorrectionResult:
    """Importance weights and masks from ρ = π_old / μ.

    Weights (truncated IS, TIS: Yao et al. 2025, "Your Efficient RL Framework Secretly
    Brings You Off-Policy RL Training"; Espeholt et al. 2018 for truncation):
      token:     w_t = min(ρ_t, C)
      sequence:  w_t = min(Π_t ρ_t, C)
      geometric: w_t = min((Π_t ρ_t)^(1/|y|), C)
    Masks:
      token (ICEPOP, Ling Team 2025 "Every Attention Matters"/Ring-1T): drop tokens with
        ρ_t ∉ [low, high];
      sequence / geometric (rejection sampling, verl rollout_rs; with is_level=token this is
        seq-mask-TIS): drop episodes whose Π ρ (or its geometric mean) ∉ [low, high].
    Veto (verl rollout_token_veto_threshold): drop an episode if any ρ_t < threshold.
    Masks and the veto compare log ρ with log(bound), unclamped, so any positive
    threshold works (one below e^-20 used to never fire); only weights clamp log ρ to
    ±20 before exp() (any cap C < e^20 makes that clamp invisible).
    Batch normalization: w ← w / mean(w) over the *kept* tokens (token level) or kept
    episodes (sequence levels), so the weights that reach the loss average exactly 1;
    verl averages over all response tokens, masked ones included.
    """
    diff_BR = logp_old_BR - rollout_logp_BR
    log_rho_BR = torch.where(mask_BR > 0, diff_BR, torch.zeros_like(diff_BR))
    rho_BR = torch.exp(torch.clamp(log_rho_BR, -_MAX_LOG, _MAX_LOG))
    keep_BR = mask_BR.clone()
    metrics: dict[str, float] = {}
    row_has_B = mask_BR.sum(-1) > 0

    if mask_level == "token":
        lo, hi = _log(mask_low), _log(mask_high)
        out_BR = ((log_rho_BR < lo) | (log_rho_BR > hi)).float() * mask_BR
        keep_BR = keep_BR * (1.0 - out_BR)
    elif mask_level in ("sequence", "geometric"):
        seq_B = _seq_log_ratio(log_rho_BR, mask_BR, mask_level)
        reject_B = ((seq_B < _log(mask_low)) | (seq_B > _log(mask_high))) & row_has_B
        keep_BR = keep_BR * (~reject_B).float()[:, None]
    elif mask_level != "none":
        raise ValueError(
            f"unknown mask_level {mask_level!r}; valid: none, token, sequence, geometric"
        )
    if veto_threshold is not None:
        veto_B = ((log_rho_BR < _log(veto_threshold)) & (mask_BR > 0)).any(-1)
        keep_BR = keep_BR * (~veto_B).float()[:, None]
        metrics["veto_seqs"] = float(veto_B.sum())

    if is_level == "none":
        w_BR = torch.ones_like(rho_BR)
    elif is_level == "token":
        w_BR = torch.clamp(rho_BR, max=is_cap)
    elif is_level in ("sequence", "geometric"):
        seq_B = torch.exp(
            torch.clamp(_seq_log_ratio(log_rho_BR, mask_BR, is_level), -_MAX_LOG, _MAX_LOG)
        )
        w_BR = torch.clamp(seq_B, max=is_cap)[:, None].expand_as(rho_BR).clone()
    else:
        raise ValueError(f"unknown is_level {is_level!r}; valid: none, token, sequence, geometric")
    if batch_normalize and is_level != "none":
        if is_level == "token":
            denom = (w_BR * keep_BR).sum() / keep_BR.sum().clamp(min=1)
        else:
            kept_B = keep_BR.sum(-1) > 0
            denom = w_BR[:, 0][kept_B].mean() if kept_B.any() else torch.ones(())
        w_BR = w_BR / denom.clamp(min=1e-8)
    w_BR = w_BR * mask_BR

    metrics["masked_tokens"] = float((mask_BR - keep_BR).sum())
    metrics["rejected_seqs"] = float((row_has_B & (keep_BR.sum(-1) == 0)).sum())
    metrics["seqs"] = float(row_has_B.sum())
    metrics["tokens"] = float(mask_BR.sum())
    if is_level != "none":
        kept = keep_BR > 0
        metrics["is_weight_sum"] = float(w_BR[kept].sum()) if kept.any() else 0.0
        metrics["is_weight_n"] = float(kept.sum())
    return CorrectionResult(w_BR.detach(), keep_BR.detach(), metrics)


def offpolicy_diagnostics(
    logp_old_BR: torch.Tensor, rollout_logp_BR: torch.Tensor, mask_BR: torch.Tensor
) -> dict[str, float]:
    """How far the sampler μ is from the trainer's π over the batch.

    With ρ = π/μ over tokens sampled from μ:
      kl_k1 = E[log μ - log π]          (KL(μ‖π), Schulman 2020 k1)
      kl_k3 = E[ρ - 1 - log ρ]           (KL(μ‖π), k3)
      chi2_token = E[ρ²] - 1;  chi2_seq = E_seq[(Π ρ)²] - 1   (χ²(π‖μ), the IS variance)
      ppl_ratio = mean over episodes of PPL_π / PPL_μ = exp(mean_t(log μ - log π))
      rho_min / rho_mean / rho_max over tokens;
      logp_absdiff_mean / logp_absdiff_max = mean / max over tokens of |log π - log μ|
      (train–inference parity: near 0 when trainer and sampler hold the same weights).
    """
    n = mask_BR.sum()
    if n == 0:
        return {}
    m = mask_BR > 0
    log_rho_BR = torch.clamp(logp_old_BR - rollout_logp_BR, -_MAX_LOG, _MAX_LOG) * mask_BR
    rho_BR = torch.exp(log_rho_BR)
    row_B = mask_BR.sum(-1) > 0
    n_B = mask_BR.sum(-1).clamp(min=1)
    seq_log_B = torch.clamp(log_rho_BR.sum(-1), -_MAX_LOG, _MAX_LOG)
    return {
        "kl_k1": float((-log_rho_BR).sum() / n),
        "kl_k3": float(((rho_BR - 1.0 - log_rho_BR) * mask_BR).sum() / n),
        "chi2_token": float((rho_BR**2 * mask_BR).sum() / n - 1.0),
        "chi2_seq": float(torch.exp(2 * seq_log_B)[row_B].mean() - 1.0),
        "ppl_ratio": float(torch.exp(-log_rho_BR.sum(-1) / n_B)[row_B].mean()),
        "rho_min": float(rho_BR[m].min()),
        "rho_mean": float(rho_BR[m].mean()),
        "rho_max": float(rho_BR[m].max()),
        "logp_absdiff_mean": float(log_rho_BR.abs().sum() / n),
        "logp_absdiff_max": float(log_rho_BR.abs().max()),
    }
