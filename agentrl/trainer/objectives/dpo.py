"""One DPO trainer step (``trainer.loss.name=dpo``): pairs in, one or more optimizer steps out.

Pairs come from the groups of the step's batch (best vs worst episode by reward,
``agentrl.trainer.objectives.preference.build_group_pairs``) and/or from a preference-pairs
file (``trainer.dpo.pairs``). Chosen and rejected episodes are rows of one
``Batch``, so multi-turn and ``per_turn`` episodes are scored exactly as the RL
losses score them: on the model's tokens only (the Trajectory ``loss_mask``).
The reference log-probabilities come from the trainer's frozen reference model
(``kl.ref_model_path`` or the starting weights), computed once per step.
"""

from __future__ import annotations

import random
import time
from collections.abc import Sequence

import torch

from agentrl.trainer.engine.batch import build_batch, plan_micro_batches
from agentrl.trainer.engine.metrics import Accumulator, PhaseTimer, reward_metrics
from agentrl.trainer.engine.parts import NonFiniteError
from agentrl.trainer.engine.trainer import Trainer, register_objective
from agentrl.trainer.engine.update import optimizer_step
from agentrl.trainer.objectives.preference import build_group_pairs, preference_loss, sequence_logp
from agentrl.types import Trajectory

__all__ = ["DPOObjective", "FilePairs", "dpo_step"]


class FilePairs:
    """The pairs of a preference-pairs file, handed out ``n`` at a time in a seeded order.

    Args:
        pairs: Tokenized (chosen, rejected) episodes.
        seed: Seeds the shuffle (reshuffled at the end of each pass).
    """

    def __init__(self, pairs: list[tuple[Trajectory, Trajectory]], seed: int) -> None:
        self.pairs = pairs
        self._rng = random.Random(seed)
        self._order: list[int] = []

    def take(self, n: int) -> list[tuple[Trajectory, Trajectory]]:
        """The next ``n`` pairs (at most one pass's worth: a small file is not repeated)."""
        out = []
        for _ in range(min(n, len(self.pairs))):
            if not self._order:
                self._order = list(range(len(self.pairs)))
                self._rng.shuffle(self._order)
            out.append(self.pairs[self._order.pop()])
        return out


def load_file_pairs(trainer: Trainer) -> FilePairs | None:
    """The ``trainer.dpo.pairs`` file, tokenized with the model's tokenizer (None if unset).

    Raises:
        PairsFileError: The file cannot be used, or the model has no directory to take
            the tokenizer from.
    """
    path = trainer.cfg.dpo.pairs
    if path is None:
        return None
    from agentrl.trainer.objectives.pairs_file import PairsFileError, load_pairs_file

    if trainer.source_dir is None:
        raise PairsFileError(
            "trainer.dpo.pairs needs the model given as a directory (its chat template "
            "renders the pairs)"
        )
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(str(trainer.source_dir))
    return FilePairs(load_pairs_file(path, tok), trainer.cfg.seed)


class DPOObjective:
    """``trainer.loss.name=dpo``: the Trainer's step is :func:`dpo_step`.

    Raises:
        ValueError: The trainer is one of several data-parallel workers.
        PairsFileError: ``trainer.dpo.pairs`` cannot be used.
    """

    def __init__(self, trainer: Trainer) -> None:
        if trainer.world > 1:
            raise ValueError(
                "trainer.loss.name=dpo runs on one trainer worker; this group has "
                f"{trainer.world} (use one worker, or a policy-gradient loss)"
            )
        self.file_pairs = load_file_pairs(trainer)

    def __call__(
        self, trainer: Trainer, trajectories: Sequence[Trajectory], *, weight_version: int | None
    ) -> dict[str, float]:
        return dpo_step(trainer, trajectories, self.file_pairs, weight_version=weight_version)


def dpo_step(
    trainer: Trainer,
    trajectories: Sequence[Trajectory],
    file_pairs: FilePairs | None = None,
    *,
    weight_version: int | None = None,
) -> dict[str, float]:
    """One trainer step of DPO; returns metrics (``dpo/*``, ``rewards/*``, ``reward/*``).

    A step with no pair (every group tied or single, no file) changes nothing and
    reports ``step/skipped`` = 1.

    Raises:
        NonFiniteError: NaN/inf in the loss or gradients (the update is not applied).
    """
    cfg, d, timer = trainer.cfg, trainer.cfg.dpo, PhaseTimer()
    t_start = time.perf_counter()
    metrics: dict[str, float] = {}
    with timer("prepare"):
        for t in trajectories:
            t.validate()
        if trajectories:
            metrics.update(reward_metrics(trajectories, cfg))
        pairs: list[tuple[Trajectory, Trajectory]] = []
        if d.from_groups:
            ps = build_group_pairs(trajectories)
            pairs += ps.pairs
            metrics["dpo/group_pairs"] = float(len(ps.pairs))
            metrics["dpo/groups_no_spread"] = float(ps.tied_groups)
            metrics["dpo/groups_single"] = float(ps.single_groups)
            metrics["batch/episodes_without_model_tokens"] = float(ps.episodes_without_model_tokens)
        if file_pairs is not None:
            taken = file_pairs.take(d.pairs_per_step)
            pairs += taken
            metrics["dpo/file_pairs"] = float(len(taken))
        metrics["dpo/pairs"] = float(len(pairs))
        if not pairs:
            trainer.global_step += 1
            return {**metrics, "step/skipped": 1.0, "step": float(trainer.global_step)}
        rows = [t for pair in pairs for t in pair]  # row 2i chosen, 2i+1 rejected
        batch = build_batch(rows, [t.reward for t in rows], [False] * len(rows))
    with timer("prepass"):
        ref_logp = trainer.prepass(batch, need_old=False)["ref_logp"]
    mask = batch.mask_BR
    ref_seq = sequence_logp(ref_logp, mask, d.length_norm)
    u = cfg.update
    P = len(pairs)
    lengths = batch.lengths_B.tolist()
    pair_len = [
        lengths[2 * i] + lengths[2 * i + 1]
        if trainer.packing
        else 2 * max(lengths[2 * i], lengths[2 * i + 1])
        for i in range(P)
    ]
    acc = Accumulator()
    dev = trainer.device
    with timer("update"):
        for epoch in range(u.epochs):
            order = list(range(P))
            if u.shuffle:
                random.Random(cfg.seed * 1_000_003 + trainer.global_step * 1009 + epoch).shuffle(
                    order
                )
            for mi, mini in enumerate(torch.tensor_split(torch.tensor(order), u.mini_batches)):
                pidx = sorted(mini.tolist())
                if not pidx:
                    continue
                bad: str | None = None
                plan = plan_micro_batches(
                    pidx,
                    pair_len,
                    strategy=u.strategy,
                    token_budget=trainer.token_budget,
                    micro_batch_size=max(1, u.micro_batch_size // 2),
                    packing=trainer.packing,
                )
                for k, mb_pairs in enumerate(plan):
                    rws = [r for i in mb_pairs for r in (2 * i, 2 * i + 1)]
                    fo = trainer.forward(trainer.policy, batch, rws)
                    m_b = mask[rws, : fo.logp_bR.shape[1]].to(dev)
                    seq = sequence_logp(fo.logp_bR, m_b, d.length_norm)
                    ref_b = ref_seq[rws].to(dev)
                    out = preference_loss(
                        seq[0::2], seq[1::2], ref_b[0::2], ref_b[1::2],
                        beta=d.beta, variant=d.variant,
                    )  # fmt: skip
                    loss = out.loss_P.sum() / len(pidx)  # mean over the mini-batch's pairs
                    if bad is None and not torch.isfinite(loss):
                        eps = [batch.episode_ids[i] for i in rws]
                        bad = (
                            f"dpo/loss is {float(loss.detach())} at epoch {epoch}, mini-batch "
                            f"{mi}, micro-batch {k} (episodes {eps})"
                        )
                    loss.backward()
                    if epoch == 0:  # metrics of the weights the step started from
                        n = len(mb_pairs)
                        acc.add("dpo/loss", float(out.loss_P.detach().sum()), n)
                        acc.add("rewards/chosen", float(out.chosen_reward_P.sum()), n)
                        acc.add("rewards/rejected", float(out.rejected_reward_P.sum()), n)
                        acc.add("rewards/margin", float(out.margin_P.sum()), n)
                        acc.add("rewards/accuracy", float((out.margin_P > 0).float().sum()), n)
                        acc.add("dpo/logp_chosen", float(seq[0::2].detach().sum()), n)
                        acc.add("dpo/logp_rejected", float(seq[1::2].detach().sum()), n)
                optimizer_step(trainer, acc, bad, mi, epoch, NonFiniteError)
    metrics.update(acc.result())
    trainer.count_step(metrics, len(trajectories), batch, timer, t_start, u.epochs)
    metrics["response/length_mean"] = float(mask.sum(-1).float().mean())
    if weight_version is not None:
        metrics["batch/weight_version"] = float(weight_version)
    metrics["memory/token_budget"] = float(trainer.token_budget)
    metrics["step"] = float(trainer.global_step)
    return metrics


register_objective("dpo", DPOObjective)
