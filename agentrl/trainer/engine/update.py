"""The update loop: epochs × mini-batches × micro-batches, one optimizer step per mini-batch.

Aggregation weights are computed for the whole mini-batch before it is split, so the
sum of micro-batch losses (and of worker losses) equals the mini-batch loss exactly:
micro-batch size, accumulation steps and worker count do not change the update.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.distributed as dist
from torch.optim.lr_scheduler import LRScheduler

from agentrl.trainer.algo.correction import compute_correction
from agentrl.trainer.algo.kl import kl_estimate
from agentrl.trainer.algo.losses import LossParams, agg_weights, compute_policy_loss, value_loss
from agentrl.trainer.engine.batch import Batch
from agentrl.trainer.engine.metrics import Accumulator, dist_active
from agentrl.trainer.engine.parts import NonFiniteError, TrainerParts

__all__ = ["NonFiniteError", "UpdateInputs", "old_logp_in_update", "optimizer_step", "run_update"]


@dataclass
class UpdateInputs:
    """Compact (B, R) tensors fixed for the whole step (CPU).

    ``old_logp_BR`` None: π_old is sg(π_θ) of the update's own forward (see
    :func:`old_logp_in_update`), and the decoupled IS weights are computed from it per
    micro-batch.
    """

    adv_BR: torch.Tensor
    ret_BR: torch.Tensor
    old_logp_BR: torch.Tensor | None
    ref_logp_BR: torch.Tensor
    old_values_BR: torch.Tensor
    is_weights_BR: torch.Tensor | None
    keep_BR: torch.Tensor | None


def _has_dropout(module: torch.nn.Module) -> bool:
    """Whether the module is stochastic in train mode (then π_θ in training ≠ π_old in eval)."""
    if any(isinstance(m, torch.nn.Dropout) and m.p > 0 for m in module.modules()):
        return True
    conf = getattr(getattr(module, "lm", module), "config", None)
    fields = conf.to_dict() if conf is not None and hasattr(conf, "to_dict") else {}
    return any(  # HF attention dropout is a config number, not a module
        k.endswith(("dropout", "pdrop")) and not isinstance(v, bool) and isinstance(v, int | float)
        and v > 0
        for k, v in fields.items()
    )  # fmt: skip


def old_logp_in_update(trainer: TrainerParts) -> bool:
    """Whether decoupled π_old can come from the update's own forward (no pre-pass).

    With one epoch of one mini-batch, every micro-batch's forward runs on the weights the
    step started with, so sg(π_θ) there *is* π_old (as verl does for its on-policy case):
    the PPO ratio starts at 1 and the IS weights ρ = π_old/μ are the same numbers. Not
    when something needs π_old before the update: the in-reward KL penalty, a value head
    without a critic (its pre-pass forward gives π_old for free), episode masks or the veto
    (they set the aggregation weights before the update), batch-normalized IS weights (a
    whole-batch mean), or dropout (train-mode π_θ would differ from eval-mode π_old).
    """
    cfg = trainer.cfg
    c = cfg.correction
    return (
        c.mode == "decoupled" and c.old_logp == "auto"
        and cfg.update.epochs == 1 and cfg.update.mini_batches == 1
        and not (trainer.ref is not None and cfg.kl.placement == "reward")
        and not (trainer.critic is None and trainer.policy.value_head is not None)
        and c.mask_level == "none" and c.veto_threshold is None and not c.batch_normalize
        and not _has_dropout(trainer.policy)
    )  # fmt: skip


def _grad_norm(params: list[torch.Tensor], max_norm: float | None) -> float:
    gn = torch.nn.utils.clip_grad_norm_(params, max_norm if max_norm else math.inf)
    full = getattr(gn, "full_tensor", None)
    return float(full() if full is not None else gn)


def run_update(
    trainer: TrainerParts, batch: Batch, x: UpdateInputs
) -> tuple[Accumulator, torch.Tensor]:
    """Runs all optimizer steps of one trainer step; returns metric sums and π_θ of epoch 0."""

    cfg, dev = trainer.cfg, trainer.device
    u, lc, c = cfg.update, cfg.loss, cfg.correction
    B, R = batch.mask_BR.shape
    mask = batch.mask_BR
    keep = x.keep_BR if x.keep_BR is not None else mask
    params = LossParams(lc.clip_low, lc.clip_high, lc.dual_clip_c)
    acc = Accumulator()
    cur_logp = torch.zeros(B, R)
    beta = trainer.kl_ctl.value
    kl_in_loss = trainer.ref is not None and cfg.kl.placement == "loss"
    value_head = trainer.policy.value_head is not None
    per_rank = 1.0 / trainer.world

    for epoch in range(u.epochs):
        if u.shuffle:
            g = torch.Generator().manual_seed(
                cfg.seed * 1_000_003 + trainer.global_step * 1009 + epoch
            )
            order = torch.randperm(B, generator=g)
        else:
            order = torch.arange(B)
        for mi, mini in enumerate(torch.tensor_split(order, u.mini_batches)):
            rows_all = sorted(mini.tolist())
            if not rows_all:
                continue
            # Mini-batch-wide aggregation weights (policy terms and token-mean value loss).
            W_pol = torch.zeros(B, R)
            W_pol[rows_all] = agg_weights(keep[rows_all], lc.agg, lc.loss_norm_constant)
            W_tok = torch.zeros(B, R)
            W_tok[rows_all] = agg_weights(mask[rows_all], "token-mean")
            bad: str | None = None
            for k, rows in enumerate(trainer.plan(batch, rows_all)):
                dummy = not rows
                rws = rows or [0]
                fo = trainer.forward(trainer.policy, batch, rws)
                r = fo.logp_bR.shape[1]

                def sl(t: torch.Tensor, rws: list[int] = rws, r: int = r) -> torch.Tensor:
                    return t[rws, :r].to(dev)

                m_b, keep_b = sl(mask), sl(keep)
                w_is = sl(x.is_weights_BR) if x.is_weights_BR is not None else torch.ones_like(m_b)
                # π_old: given, or sg(π_θ) of this very forward (one pass: the same numbers).
                old_b = sl(x.old_logp_BR) if x.old_logp_BR is not None else fo.logp_bR.detach()
                if c.mode == "bypass" or x.old_logp_BR is None:
                    mu_b = sl(batch.rollout_logp_BR)
                    corr = compute_correction(fo.logp_bR.detach(), mu_b, m_b, **c.weight_args())
                    w_is, keep_b = corr.weights_BR, corr.keep_BR
                    if not dummy and c.mode == "bypass":
                        for name in ("masked_tokens", "rejected_seqs", "veto_seqs"):
                            if name in corr.metrics:
                                den = corr.metrics["tokens" if name == "masked_tokens" else "seqs"]
                                acc.add(f"corr/{name}", corr.metrics[name], den)
                if epoch == 0 and not dummy:
                    cur_logp[rws, :r] = fo.logp_bR.detach().cpu()
                wp, wt = sl(W_pol), sl(W_tok)
                pol = compute_policy_loss(lc.name, fo.logp_bR, old_b, sl(x.adv_BR), keep_b, params)
                terms: dict[str, torch.Tensor] = {"loss/policy": (pol.loss_BR * w_is * wp).sum()}
                if lc.entropy_coef:
                    terms["loss/entropy_bonus"] = -lc.entropy_coef * (fo.entropy_bR * wp).sum()
                if kl_in_loss:
                    kl_b = kl_estimate(fo.logp_bR, sl(x.ref_logp_BR), cfg.kl.estimator)
                    # KL penalty in the loss (Shao et al. 2024, GRPO eq. 3): + β·KL.
                    terms["loss/kl"] = beta * (kl_b * keep_b * wp).sum()
                    acc.add("kl/ref_kl", float((kl_b.detach() * m_b).sum()), float(m_b.sum()))
                vclip = None
                if value_head and fo.values_bR is not None:
                    vl, vclip = value_loss(
                        fo.values_bR, sl(x.old_values_BR), sl(x.ret_BR), m_b, cfg.critic.value_clip
                    )
                    terms["loss/value"] = cfg.critic.value_loss_coef * (vl * wt).sum()
                total = sum(terms.values(), torch.zeros((), device=dev))
                for name, t in terms.items():
                    if bad is None and not torch.isfinite(t):
                        eps = [batch.episode_ids[i] for i in rws]
                        bad = (
                            f"{name} is {float(t.detach())} at epoch {epoch}, mini-batch {mi}, "
                            f"micro-batch {k} (episodes {eps})"
                        )
                if dummy:
                    total = total * 0.0
                # FSDP averages gradients over workers; the weights already sum to 1 globally.
                (total * trainer.world).backward()
                if trainer.critic is not None and trainer.critic_optimizer is not None:
                    cfo = trainer.forward(trainer.critic, batch, rws)
                    assert cfo.values_bR is not None
                    vl, vclip = value_loss(
                        cfo.values_bR, sl(x.old_values_BR), sl(x.ret_BR), m_b, cfg.critic.value_clip
                    )
                    closs = (vl * wt).sum()
                    terms["loss/value"] = closs
                    if bad is None and not torch.isfinite(closs):
                        bad = f"loss/value (critic) is {float(closs.detach())}, mini-batch {mi}"
                    (closs * (0.0 if dummy else 1.0) * trainer.world).backward()
                if dummy:
                    continue
                for name, t in terms.items():
                    acc.add(name, float(t.detach()), 0.0)
                ind_n = float(keep_b.sum())
                for name, ind in pol.indicators.items():
                    acc.add(f"actor/{name}_frac", float(ind.sum()), ind_n)
                ratio = pol.ratio_BR[keep_b > 0]
                if ratio.numel():
                    acc.extreme("actor/ratio", float(ratio.min()), float(ratio.max()))
                    acc.add("actor/ratio_mean", float(ratio.sum()), ratio.numel())
                acc.add(
                    "actor/entropy", float((fo.entropy_bR.detach() * m_b).sum()), float(m_b.sum())
                )
                if vclip is not None:
                    acc.add("critic/value_clip_frac", float(vclip.sum()), float(m_b.sum()))
            for name in ("loss/policy", "loss/entropy_bonus", "loss/kl", "loss/value"):
                if name in acc.sums:
                    acc.counts[name] += per_rank
            optimizer_step(trainer, acc, bad, mi, epoch, NonFiniteError)
    if dist_active():
        dist.all_reduce(cur_logp)
    return acc, cur_logp


def optimizer_step(
    trainer: TrainerParts,
    acc: Accumulator,
    bad: str | None,
    mi: int,
    epoch: int,
    err: type[Exception],
) -> None:
    max_norm = trainer.cfg.optim.max_grad_norm
    pairs: list[tuple[torch.nn.Module, torch.optim.Optimizer, LRScheduler, str]] = [
        (trainer.policy, trainer.optimizer, trainer.scheduler, "actor")
    ]
    if trainer.critic is not None:
        assert trainer.critic_optimizer is not None and trainer.critic_scheduler is not None
        pairs.append((trainer.critic, trainer.critic_optimizer, trainer.critic_scheduler, "critic"))
    norms = []
    for module, _, _, name in pairs:
        gn = _grad_norm([p for p in module.parameters() if p.grad is not None], max_norm)
        norms.append((name, gn))
    nonfinite = [n for n, g in norms if not math.isfinite(g)]
    if nonfinite or bad is not None:
        for _, opt, _, _ in pairs:
            opt.zero_grad(set_to_none=True)
        where = (
            bad or f"non-finite gradients (epoch {epoch}, mini-batch {mi}; loss on another worker)"
        )
        raise err(
            f"step {trainer.global_step}: {where}; grad norms {dict(norms)}; weights left unchanged"
        )
    for (_, opt, sched, name), (_, gn) in zip(pairs, norms, strict=True):
        opt.step()
        sched.step()
        opt.zero_grad(set_to_none=True)
        acc.add(f"{name}/grad_norm", gn / trainer.world, 1.0 / trainer.world)
        acc.extreme(f"{name}/grad_norm", gn, gn)
    trainer.optimizer_steps += 1
