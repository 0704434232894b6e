"""The Trainer: trajectories in, one policy update (and its metrics) out.

It imports nothing from rollout, inference or orchestration: a list of
``agentrl.types.Trajectory`` is its only input.
"""

from __future__ import annotations

import logging
import os
import random
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, Protocol

import numpy as np
import torch
import torch.distributed as dist
from torch import nn

from agentrl.trainer.algo.advantages import AdvantageInputs, compute_advantages
from agentrl.trainer.algo.correction import offpolicy_diagnostics
from agentrl.trainer.algo.kl import AdaptiveKLController, FixedKLController
from agentrl.trainer.algo.losses import explained_variance
from agentrl.trainer.algo.shaping import shape_rewards
from agentrl.trainer.config import TrainerConfig
from agentrl.trainer.engine import state as _state
from agentrl.trainer.engine.actor import (
    ForwardOut,
    resolve_dtype,
    run_micro_batch,
)
from agentrl.trainer.engine.batch import (
    Batch,
    build_batch,
    make_micro_batch,
    partition_balanced,
    plan_micro_batches,
)
from agentrl.trainer.engine.memory import trainer_plan
from agentrl.trainer.engine.metrics import (
    PhaseTimer,
    batch_metrics,
    dist_active,
    mfu,
    reward_metrics,
    train_flops_per_token,
)
from agentrl.trainer.engine.networks import build_networks, build_optimizers
from agentrl.trainer.engine.parts import NonFiniteError
from agentrl.trainer.engine.prepass import decoupled_correction, prepass, ref_kl_old
from agentrl.trainer.engine.roles import role_adapters, roles_of
from agentrl.trainer.engine.sysmem import PeakMemory, return_freed_memory
from agentrl.trainer.engine.update import UpdateInputs, old_logp_in_update, run_update
from agentrl.types import Trajectory

__all__ = ["OBJECTIVES", "NonFiniteError", "Objective", "Trainer", "register_objective"]

_log = logging.getLogger(__name__)


class Objective(Protocol):
    """A trainer step that replaces the policy-gradient step (``trainer.loss.name``)."""

    def __call__(
        self, trainer: Trainer, trajectories: Sequence[Trajectory], *, weight_version: int | None
    ) -> dict[str, float]:
        """One step on ``trajectories``; returns its metrics."""
        ...


OBJECTIVES: dict[str, Callable[[Trainer], Objective]] = {}
"""``trainer.loss.name`` -> a factory called once by each Trainer with itself (it may check
the setup and load files), returning the step. :mod:`agentrl.trainer.objectives` registers
``dpo``; a Trainer whose loss is not here runs the policy-gradient step."""


def register_objective(name: str, factory: Callable[[Trainer], Objective]) -> None:
    """Makes ``trainer.loss.name=name`` run the step ``factory(trainer)`` returns."""
    OBJECTIVES[name] = factory


class Trainer:
    """Updates a Hugging Face causal LM from trajectories.

    Runs alone or as one worker of a torch.distributed group (then FSDP2-sharded; see
    ``DataParallelTrainer`` for the launcher).

    Args:
        config: The configuration.
        model: A HF model directory / hub id, or a model instance (copied).
        device: Defaults to cuda:LOCAL_RANK when CUDA is available, else CPU.
        max_seq_len: Longest episode expected (tokens), for the "auto" memory settings
            (None: 2048).
        available_memory: Bytes this trainer may use (None: measured now, see
            ``agentrl.trainer.engine.memory.available_bytes``).

    Raises:
        MemoryPlanError: "auto" settings found no configuration that fits.

    Example:
        >>> trainer = Trainer(TrainerConfig(), "path/to/model")  # doctest: +SKIP
        >>> metrics = trainer.step(trajectories)  # doctest: +SKIP
    """

    def __init__(
        self,
        config: TrainerConfig,
        model: str | Path | nn.Module,
        *,
        device: str | torch.device | None = None,
        max_seq_len: int | None = None,
        available_memory: float | None = None,
    ) -> None:
        self.cfg = config
        self.rank, self.world = (
            (dist.get_rank(), dist.get_world_size()) if dist_active() else (0, 1)
        )
        if device is None:
            local = int(os.environ.get("LOCAL_RANK", 0))
            device = f"cuda:{local}" if torch.cuda.is_available() else "cpu"
        self.device = torch.device(device)
        self.compute_dtype = resolve_dtype(config.actor, self.device)
        random.seed(config.seed)
        np.random.seed(config.seed)
        torch.manual_seed(config.seed)
        # "auto" token budget / checkpointing / logprob chunk from the memory model.
        self.memory_plan = trainer_plan(
            config, model, self.device, world=self.world, max_seq_len=max_seq_len,
            available=available_memory,
        )  # fmt: skip
        self.token_budget = self.memory_plan.token_budget
        self.gradient_checkpointing = self.memory_plan.gradient_checkpointing
        self.logprob_chunk = self.memory_plan.logprob_chunk
        self._peak = PeakMemory(self.device)
        if self.device.type == "cpu":
            return_freed_memory()  # freed activations leave RSS (the plan assumes it)

        nets = build_networks(
            config,
            model,
            self.device,
            world=self.world,
            gradient_checkpointing=self.gradient_checkpointing,
            logprob_chunk=self.logprob_chunk,
        )
        self.policy, self.ref, self.critic = nets.policy, nets.ref, nets.critic
        self.source_dir, self.packing = nets.source_dir, nets.packing
        self.share_prefix = nets.share_prefix
        self.lora = nets.lora
        """The ``peft.PeftModel`` around the policy's LM (``trainer.lora``), else None."""
        self.role_adapters = role_adapters(config, self.lora, self.gradient_checkpointing)
        """One adapter per role (``trainer.lora.per_role``), else None."""
        self.trainable_params = sum(p.numel() for p in self.policy.parameters() if p.requires_grad)
        if self.lora is not None and self.rank == 0:
            total = sum(p.numel() for p in self.policy.parameters())
            _log.info(
                "LoRA: training %d of %d policy parameters (%.2f%%)",
                self.trainable_params, total, 100 * self.trainable_params / max(total, 1),
            )  # fmt: skip
        self.shared_prefix_tokens = 0
        """Token positions the current step's forwards did not run (``share_prefix``)."""
        opts = build_optimizers(config, self.policy, self.critic)
        self.optimizer, self.scheduler = opts.optimizer, opts.scheduler
        self.critic_optimizer = opts.critic_optimizer
        self.critic_scheduler = opts.critic_scheduler
        k = config.kl
        self.kl_ctl: FixedKLController | AdaptiveKLController = (
            AdaptiveKLController(k.coef, k.target, k.horizon)
            if k.adaptive
            else FixedKLController(k.coef)
        )
        self.global_step = 0
        self.optimizer_steps = 0
        self.samples_seen = 0
        self.dropped_groups_total = 0
        factory = OBJECTIVES.get(config.loss.name)
        self.objective: Objective | None = factory(self) if factory is not None else None

    # ----------------------------------------------------------------------------- state

    def save_checkpoint(
        self, root: str | Path | None = None, extra: dict[str, Any] | None = None
    ) -> Path:
        """Saves model, optimizer, scheduler, RNG, counters, KL state and ``extra`` atomically.

        Args:
            root: Checkpoint root (default ``config.checkpoint.dir``); writes root/step_N.
            extra: Caller state kept with it (e.g. the data loader's position).
        """
        return _state.save_checkpoint(self, root, extra)

    def load_checkpoint(self, path: str | Path) -> dict[str, Any]:
        """Resumes from a step directory or a root (its ``latest``); returns ``extra``."""
        return _state.load_checkpoint(self, path)

    def state_dict_for_inference(self) -> dict[str, torch.Tensor]:
        """Full policy weights on CPU with HF names (collective under DP; {} off worker 0)."""
        return _state.state_dict_for_inference(self)

    def save_hf(self, out_dir: str | Path) -> Path:
        """Writes a plain HF model directory (config, safetensors, tokenizer files); with
        LoRA the merged model."""
        return _state.save_hf(self, out_dir)

    def adapter_state_for_inference(self) -> dict[str, torch.Tensor]:
        """The LoRA adapter alone on CPU, with peft's names (``trainer.lora`` only)."""
        return _state.adapter_state_for_inference(self)

    def adapter_states_for_inference(self) -> dict[str, dict[str, torch.Tensor]]:
        """{role: its adapter on CPU, peft's names} (``trainer.lora``; one "policy" entry
        unless ``per_role``)."""
        if self.role_adapters is not None:
            return self.role_adapters.states()
        return {"policy": self.adapter_state_for_inference()}

    def save_adapter(self, out_dir: str | Path) -> Path:
        """Writes the LoRA adapter (``adapter_config.json``, ``adapter_model.safetensors``),
        loadable with ``peft.PeftModel.from_pretrained(base, out_dir)``."""
        return _state.save_adapter(self, out_dir)

    # ----------------------------------------------------------------------------- planning

    def plan(self, batch: Batch, rows: Sequence[int]) -> list[list[int]]:
        """This worker's micro-batches of ``rows``; every worker gets the same count."""
        u = self.cfg.update
        lengths = batch.lengths_B.tolist()
        parts = (
            partition_balanced(list(rows), lengths, self.world) if self.world > 1 else [list(rows)]
        )
        kw = dict(
            strategy=u.strategy,
            token_budget=self.token_budget,
            micro_batch_size=u.micro_batch_size,
            packing=self.packing,
        )
        plans = [plan_micro_batches(p, lengths, **kw) for p in parts]  # type: ignore[arg-type]
        while len({len(p) for p in plans}) > 1:
            k = max(len(p) for p in plans)
            plans = [plan_micro_batches(p, lengths, min_count=k, **kw) for p in parts]  # type: ignore[arg-type]
        return plans[self.rank]

    def forward(self, module: nn.Module, batch: Batch, rows: Sequence[int]) -> ForwardOut:
        """Runs ``module`` on ``rows`` (an empty list runs row 0 as a collective-matching dummy)."""
        rws = list(rows) or [0]
        mb = make_micro_batch(batch, rws, self.packing, self.share_prefix).to(self.device)
        if mb.prefix_ids is not None:  # positions the shared prefix spared the other rows
            self.shared_prefix_tokens += mb.prefix_ids.shape[1] * (len(rws) - 1)
        mask_bR = batch.mask_BR[rws, : mb.R].to(self.device)
        if module is self.policy and self.role_adapters is not None:  # trainer.lora.per_role
            return self.role_adapters.forward(
                lambda: run_micro_batch(module, mb, mask_bR, self.compute_dtype),
                roles_of(batch, rws, mb.R).to(self.device),
            )
        return run_micro_batch(module, mb, mask_bR, self.compute_dtype)

    def prepass(self, batch: Batch, need_old: bool) -> dict[str, torch.Tensor]:
        """π_old (decoupled), π_ref and critic values of every row, before any update."""
        return prepass(self, batch, need_old)

    # ----------------------------------------------------------------------------- step

    def count_step(
        self,
        metrics: dict[str, float],
        n_trajectories: int,
        batch: Any,
        timer: Any,
        t_start: float,
        epochs: int,
    ) -> None:
        """Ends a step (RL or DPO): counters, timings, throughput and the learning rate."""
        self.global_step += 1
        self.samples_seen += n_trajectories
        timing = timer.result()
        total_s = time.perf_counter() - t_start
        n_tok = float(batch.lengths_B.sum())
        metrics.update(timing)
        update_s = timing.get("time/update", total_s)
        metrics["perf/tokens_per_s"] = n_tok * epochs / max(update_s, 1e-9)
        metrics["perf/step_tokens_per_s"] = n_tok / max(total_s, 1e-9)
        metrics["time/step"] = total_s
        metrics["optim/lr"] = float(self.scheduler.get_last_lr()[0])

    def step(
        self, trajectories: Sequence[Trajectory], *, weight_version: int | None = None
    ) -> dict[str, float]:
        """One training step on a batch of episodes; returns metrics.

        Args:
            trajectories: The batch (all workers must receive the same list).
            weight_version: The newest policy version, for staleness metrics
                (default: the newest version in the batch).

        Raises:
            ValueError: A trajectory whose fields disagree (named), or a bad batch.
            NonFiniteError: NaN/inf in a loss or the gradients (the update is not applied).
        """
        self.shared_prefix_tokens = 0
        if self.objective is not None:  # e.g. DPO: preference pairs instead of advantages
            return self.objective(self, trajectories, weight_version=weight_version)
        cfg, timer = self.cfg, PhaseTimer()
        t_start = time.perf_counter()
        self._peak.reset()
        with timer("prepare"):
            for t in trajectories:
                t.validate()
            shaped = shape_rewards(trajectories, cfg.shaping)
            metrics: dict[str, float] = dict(shaped.metrics)
            metrics.update(reward_metrics(trajectories, cfg))
            self.dropped_groups_total += int(shaped.metrics.get("filter/dropped_groups", 0))
            metrics["filter/dropped_groups_total"] = float(self.dropped_groups_total)
            # Episodes without a sampled token (e.g. a prompt over the context budget)
            # have nothing to train on; they are counted, not silently kept.
            sel = [j for j, i in enumerate(shaped.kept) if trajectories[i].num_model_tokens]
            metrics["batch/episodes_without_model_tokens"] = float(len(shaped.kept) - len(sel))
            kept = [trajectories[shaped.kept[j]] for j in sel]
            if not kept:
                self.global_step += 1
                return {**metrics, "step/skipped": 1.0, "step": float(self.global_step)}
            batch = build_batch(
                kept, [shaped.scores[j] for j in sel], [shaped.truncated[j] for j in sel]
            )
            if self.role_adapters is not None:
                batch.roles_BR = self.role_adapters.index_BR(kept, batch.mask_BR.shape[1])
        mask = batch.mask_BR
        decoupled = cfg.correction.mode == "decoupled"
        # One-pass update: π_old = sg(π_θ) of the update's forward, no pre-pass forward.
        in_update = old_logp_in_update(self)
        prepassed = decoupled and not in_update
        with timer("prepass"):
            pre = self.prepass(batch, need_old=prepassed)
        old_logp = pre["old_logp"] if prepassed else batch.rollout_logp_BR
        values = pre["values"] if cfg.uses_critic else None

        penalty = None
        if self.ref is not None and not in_update:
            kl_BR = ref_kl_old(self.cfg, old_logp, pre["ref_logp"], mask, metrics)
            if cfg.kl.placement == "reward":
                # In-reward KL penalty r_t - β·KL_t (Ziegler et al. 2019 eq. 2;
                # Ouyang et al. 2022 eq. 2), kept apart from the turn rewards.
                penalty = self.kl_ctl.value * kl_BR
        a = cfg.advantage
        adv, ret = compute_advantages(
            a.estimator,
            AdvantageInputs(
                batch.rewards_BR,
                mask,
                batch.turn_BR,
                batch.group_B,
                values,
                a.gamma,
                a.lam,
                a.norm_by_std,
                a.eps,
                process=a.supervision == "process",  # auto unresolved (no env): outcome
                penalty_BR=penalty,
                node_BR=batch.node_BR,
            ),
            a.whiten,
        )
        weights = keep = None
        if prepassed:
            weights, keep = decoupled_correction(self.cfg, old_logp, batch, metrics)
        with timer("update"):
            acc, cur_logp = run_update(
                self,
                batch,
                UpdateInputs(
                    adv, ret, None if in_update else old_logp, pre["ref_logp"], pre["values"],
                    weights, keep,
                ),
            )  # fmt: skip
        if in_update:  # cur_logp is π_old: the numbers a pre-pass would have given
            decoupled_correction(self.cfg, cur_logp, batch, metrics)
            if self.ref is not None:
                ref_kl_old(self.cfg, cur_logp, pre["ref_logp"], mask, metrics)
        acc.reduce()
        out = acc.result()
        if not decoupled:
            metrics.update(
                {
                    f"offpolicy/{k}": v
                    for k, v in offpolicy_diagnostics(cur_logp, batch.rollout_logp_BR, mask).items()
                }
            )
            names = {"masked_tokens": "masked_token", "rejected_seqs": "rejected_seq"}
            names["veto_seqs"] = "veto_seq"
            for k, v in names.items():
                if f"corr/{k}" in out:
                    out[f"correction/{v}_frac"] = out.pop(f"corr/{k}")
        metrics.update(out)
        kl_now = out.get("kl/ref_kl", metrics.get("kl/ref_kl_old"))
        if self.ref is not None and kl_now is not None:
            self.kl_ctl.update(kl_now, n_steps=batch.size)
        metrics["kl/coef"] = self.kl_ctl.value
        metrics.update(
            batch_metrics(
                batch, adv, ret, values, pre["entropy"] if prepassed else None, weight_version
            )
        )
        if values is not None:
            metrics["critic/explained_variance"] = explained_variance(values, ret, mask)
        self.count_step(metrics, len(trajectories), batch, timer, t_start, cfg.update.epochs)
        metrics.update(self._peak.metrics())
        sh = self.memory_plan.shape
        if sh is not None and self.device.type == "cuda" and self.compute_dtype == torch.bfloat16:
            mean_len = float(batch.lengths_B.float().mean())
            fpt = train_flops_per_token(sh.params, sh.layers, sh.heads, sh.head_dim, mean_len)
            util = mfu(metrics["perf/tokens_per_s"], fpt, torch.cuda.get_device_name(self.device))
            if util is not None:  # tokens/s is the whole group's; the peak is per GPU
                metrics["perf/mfu"] = util / self.world
        metrics["perf/shared_prefix_tokens"] = float(self.shared_prefix_tokens)
        metrics["memory/token_budget"] = float(self.token_budget)
        if self.lora is not None:
            metrics["lora/trainable_params"] = float(self.trainable_params)
        metrics["memory/estimated_peak_gb"] = self.memory_plan.estimate.total / 1e9
        metrics["step"] = float(self.global_step)
        return metrics
