"""Before the update: π_old, π_ref and critic values of every row, and what follows from
them (the decoupled importance weights, the reference KL of π_old)."""

from __future__ import annotations

import torch
import torch.distributed as dist
from torch import nn

from agentrl.trainer.algo.correction import compute_correction, offpolicy_diagnostics
from agentrl.trainer.algo.kl import kl_estimate
from agentrl.trainer.config import TrainerConfig
from agentrl.trainer.engine.batch import Batch
from agentrl.trainer.engine.metrics import correction_metrics, dist_active
from agentrl.trainer.engine.parts import TrainerParts

__all__ = ["decoupled_correction", "prepass", "ref_kl_old"]


@torch.no_grad()
def prepass(trainer: TrainerParts, batch: Batch, need_old: bool) -> dict[str, torch.Tensor]:
    """π_old (decoupled), π_ref and critic values of every row, before any update."""
    B, R = batch.mask_BR.shape
    jobs: list[tuple[str, nn.Module]] = []
    if need_old or (trainer.critic is None and trainer.policy.value_head is not None):
        jobs.append(("policy", trainer.policy))
    if trainer.ref is not None:
        jobs.append(("ref", trainer.ref))
    if trainer.critic is not None:
        jobs.append(("critic", trainer.critic))
    out = {
        name: torch.zeros(B, R, device=trainer.device)
        for name in ("old_logp", "ref_logp", "values", "entropy")
    }
    for name, module in jobs:
        was_training = module.training
        module.eval()
        for rows in trainer.plan(batch, range(B)):
            fo = trainer.forward(module, batch, rows)
            if not rows:
                continue
            r = fo.logp_bR.shape[1]
            if name in ("policy", "ref"):
                out["old_logp" if name == "policy" else "ref_logp"][rows, :r] = fo.logp_bR
            if name == "policy":
                out["entropy"][rows, :r] = fo.entropy_bR
            if fo.values_bR is not None:
                out["values"][rows, :r] = fo.values_bR
        module.train(was_training)
    if dist_active():
        for t in out.values():
            dist.all_reduce(t)  # each row was filled by exactly one worker
    return {k: v.cpu() for k, v in out.items()}


def decoupled_correction(
    cfg: TrainerConfig, old_logp: torch.Tensor, batch: Batch, metrics: dict[str, float]
) -> tuple[torch.Tensor, torch.Tensor]:
    """IS weights and keep mask from ρ = π_old/μ, with their metrics."""
    mu, mask = batch.rollout_logp_BR, batch.mask_BR
    corr = compute_correction(old_logp, mu, mask, **cfg.correction.weight_args())
    metrics.update(correction_metrics(corr.metrics))
    diag = offpolicy_diagnostics(old_logp, mu, mask)
    metrics.update({f"offpolicy/{k}": v for k, v in diag.items()})
    return corr.weights_BR, corr.keep_BR


def ref_kl_old(
    cfg: TrainerConfig,
    old_logp: torch.Tensor,
    ref_logp: torch.Tensor,
    mask: torch.Tensor,
    m: dict[str, float],
) -> torch.Tensor:
    """Per-token KL(π_old ‖ π_ref) estimate (masked); its mean is ``kl/ref_kl_old``."""
    kl_BR = kl_estimate(old_logp, ref_logp, cfg.kl.estimator) * mask
    m["kl/ref_kl_old"] = float(kl_BR.sum() / mask.sum().clamp(min=1))
    return kl_BR
