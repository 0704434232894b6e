"""Supervised steps on the model's own tokens of chosen episodes (rejection-sampling fine-tuning).

The negative log-likelihood of every model token (``loss_mask == 1``) of the given
episodes, aggregated as the policy losses are (``trainer.loss.agg``) and computed by
the same batching as RL: multi-turn episodes score only the model's turns, and
``per_turn`` episodes restart their position ids at each sample, each sample
attending only to itself (``agentrl.trainer.engine.batch``).
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import TYPE_CHECKING

import torch

from agentrl.trainer.algo.losses import agg_weights
from agentrl.trainer.engine.batch import build_batch
from agentrl.trainer.engine.metrics import Accumulator
from agentrl.types import Trajectory

if TYPE_CHECKING:
    from agentrl.trainer.engine.trainer import Trainer

__all__ = ["sft_step"]


def sft_step(trainer: Trainer, trajectories: Sequence[Trajectory]) -> dict[str, float]:
    """One optimizer step of NLL on the model tokens of ``trajectories``; returns metrics.

    Metrics: ``sft/nll`` (mean NLL per model token, before the step), ``sft/tokens``,
    ``sft/episodes``, ``actor/grad_norm``, ``optim/lr``.

    Raises:
        ValueError: No episode with a model token, or a trajectory whose fields disagree.
        NonFiniteError: NaN/inf loss or gradients (the step is not applied).
    """
    from agentrl.trainer.engine.parts import NonFiniteError
    from agentrl.trainer.engine.update import optimizer_step

    t0 = time.perf_counter()
    kept = [t for t in trajectories if t.num_model_tokens]
    if not kept:
        raise ValueError("no episode with model tokens to train on")
    batch = build_batch(kept, [t.reward for t in kept], [False] * len(kept))
    mask = batch.mask_BR
    lc = trainer.cfg.loss
    W = agg_weights(mask, lc.agg, lc.loss_norm_constant)
    acc = Accumulator()
    bad: str | None = None
    dev = trainer.device
    for k, rows in enumerate(trainer.plan(batch, range(batch.size))):
        fo = trainer.forward(trainer.policy, batch, rows)
        r = fo.logp_bR.shape[1]
        m_b, w_b = mask[rows, :r].to(dev), W[rows, :r].to(dev)
        loss = -(fo.logp_bR * w_b).sum()
        if bad is None and not torch.isfinite(loss):
            bad = f"sft loss is {float(loss.detach())} in micro-batch {k}"
        loss.backward()
        acc.add("sft/nll", float(-(fo.logp_bR.detach() * m_b).sum()), float(m_b.sum()))
        acc.add("loss/sft", float(loss.detach()), 0.0)
    acc.counts["loss/sft"] = 1.0
    optimizer_step(trainer, acc, bad, 0, 0, NonFiniteError)
    trainer.global_step += 1
    trainer.samples_seen += len(kept)
    out = acc.result()
    out["sft/tokens"] = float(mask.sum())
    out["sft/episodes"] = float(len(kept))
    out["optim/lr"] = float(trainer.scheduler.get_last_lr()[0])
    out["time/step"] = time.perf_counter() - t0
    out["step"] = float(trainer.global_step)
    return out
