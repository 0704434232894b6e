"""The trainer's networks (policy, reference, critic) and optimizers, built from its config.

The Trainer owns the update; this module only assembles what the config asks for:
which models are loaded or copied, how they are wrapped, sharded and checkpointed,
and the optimizers and learning-rate schedules that drive them.
"""

from __future__ import annotations

import copy
import math
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, cast

import torch
import torch.distributed as dist
from torch import nn

from agentrl.errors import TrainerSetupError
from agentrl.trainer.config import TrainerConfig
from agentrl.trainer.engine.actor import PolicyModule, load_causal_lm

__all__ = ["Networks", "Optimizers", "build_networks", "build_optimizers", "lr_lambda"]


@dataclass
class Networks:
    """The modules one trainer updates and reads.

    Attributes:
        policy: The policy (with a value head when the critic is "value_head").
        ref: The frozen reference policy for KL, or None without KL (with LoRA: the
            policy with its adapter switched off, no parameters of its own).
        critic: A separate critic, or None.
        source_dir: The policy's source directory (tokenizer files for exports), if any.
        packing: Whether micro-batches pack several episodes into one row.
        share_prefix: Whether a prompt shared by a micro-batch's rows runs once.
    """

    policy: PolicyModule
    ref: nn.Module | None
    critic: PolicyModule | None
    source_dir: Path | None
    packing: bool
    share_prefix: bool
    lora: Any = None
    """The ``peft.PeftModel`` around the policy's LM (``trainer.lora``), else None."""


@dataclass
class Optimizers:
    """AdamW and its learning-rate schedule, for the policy and (if separate) the critic."""

    optimizer: torch.optim.AdamW
    scheduler: torch.optim.lr_scheduler.LambdaLR
    critic_optimizer: torch.optim.AdamW | None
    critic_scheduler: torch.optim.lr_scheduler.LambdaLR | None


def lr_lambda(cfg: TrainerConfig) -> Callable[[int], float]:
    """The learning-rate multiplier of each optimizer step, for ``LambdaLR``."""
    o = cfg.optim

    def f(step: int) -> float:
        # Linear warm-up (Goyal et al. 2017), then constant / linear / cosine decay
        # (Loshchilov & Hutter 2017) to min_lr_ratio.
        if o.warmup_steps and step < o.warmup_steps:
            return (step + 1) / o.warmup_steps
        if o.schedule == "constant" or o.total_steps is None:
            return 1.0
        span = max(o.total_steps - o.warmup_steps, 1)
        p = min(max(step - o.warmup_steps, 0) / span, 1.0)
        decay = 1.0 - p if o.schedule == "linear" else 0.5 * (1.0 + math.cos(math.pi * p))
        return o.min_lr_ratio + (1.0 - o.min_lr_ratio) * decay

    return f


def _share_prefix(
    config: TrainerConfig, lm: nn.Module, *, packing: bool, checkpointing: bool, sharded: bool
) -> bool:
    """Whether micro-batches run a shared prompt once (``update.share_prefix``).

    Raises:
        TrainerSetupError: ``share_prefix=True`` where it is not supported (the reason named).
    """
    layer_types = getattr(cast(Any, lm).config, "layer_types", None) or ["full_attention"]
    why = [
        reason
        for reason, bad in (
            ("packed micro-batches (update.packing)", packing),
            ("gradient checkpointing (HF drops the cache under it)", checkpointing),
            ("FSDP-sharded workers", sharded),
            (
                f"layers other than full attention ({sorted(set(layer_types))})",
                any(t != "full_attention" for t in layer_types),
            ),
        )
        if bad
    ]
    want = config.update.share_prefix
    if want and why:
        raise TrainerSetupError(
            f"trainer.update.share_prefix=true is not supported with {why[0]}; "
            "leave it unset (on where supported) or set it to false"
        )
    return not why if want is None else want


def build_networks(
    config: TrainerConfig,
    model: str | Path | nn.Module,
    device: torch.device,
    *,
    world: int,
    gradient_checkpointing: bool,
    logprob_chunk: int,
) -> Networks:
    """Loads the policy (and the reference / critic the config asks for) onto ``device``.

    Args:
        config: The trainer's configuration.
        model: A HF model directory / hub id, or a model instance (copied).
        device: Where the modules live.
        world: Number of data-parallel workers (more than one: FSDP2-sharded).
        gradient_checkpointing: Recompute activations in the backward pass.
        logprob_chunk: Tokens per chunk of the log-prob computation.
    """
    a = config.actor
    sharded = world > 1 or (a.fsdp == "always" and dist.is_initialized())
    lora = config.lora
    if lora is not None:
        _check_lora(config, sharded)
    lm, source_dir = load_causal_lm(model, config.actor, device)
    attn = getattr(cast(Any, lm).config, "_attn_implementation", None)
    # Packing only pays with varlen attention; dense (sdpa/eager) attention over a packed
    # row spends FLOPs on the masked cross-episode blocks.
    packing = (
        config.update.packing if config.update.packing is not None else attn == "flash_attention_2"
    )
    ref_lm = None
    if config.needs_ref:  # KL, or DPO's reference
        if config.kl.ref_model_path:
            ref_lm, _ = load_causal_lm(config.kl.ref_model_path, config.actor, device)
        elif lora is None:
            ref_lm = copy.deepcopy(lm)
    critic_lm = None
    if config.uses_critic and config.critic.kind == "separate":
        src = config.critic.model_path or model
        critic_lm = (
            copy.deepcopy(lm) if src is model else load_causal_lm(src, config.actor, device)[0]
        )
    if gradient_checkpointing:
        for m in (lm, critic_lm):
            if m is not None:
                cast(Any, m).gradient_checkpointing_enable(
                    gradient_checkpointing_kwargs={"use_reentrant": False}
                )
    peft_model = None
    if lora is not None:
        from agentrl.trainer.engine.lora import apply_lora

        peft_model = apply_lora(lm, lora)  # in place; freezes all but the adapter

    policy = PolicyModule(
        lm,
        value_head=config.uses_critic and config.critic.kind == "value_head",
        chunk=logprob_chunk,
        temperature=a.temperature,
        entropy_grad=config.loss.entropy_coef != 0,  # else the entropy is only logged
    ).to(device)
    ref: nn.Module | None = None
    if ref_lm is not None:
        ref = PolicyModule(ref_lm, value_head=False, chunk=logprob_chunk, temperature=a.temperature)
        ref.to(device).eval().requires_grad_(False)
    elif config.needs_ref and peft_model is not None:
        from agentrl.trainer.engine.lora import AdapterDisabled

        ref = AdapterDisabled(policy, peft_model)
    critic = None
    if critic_lm is not None:
        critic = PolicyModule(
            critic_lm,
            value_head=True,
            chunk=logprob_chunk,
            temperature=a.temperature,
            need_logp=False,
        ).to(device)
    if sharded:
        from agentrl.trainer.engine.sharding import shard_module

        for mod in (policy, ref, critic):
            if mod is not None:
                shard_module(mod)
    share = _share_prefix(
        config, lm, packing=packing, checkpointing=gradient_checkpointing, sharded=sharded
    )
    return Networks(policy, ref, critic, source_dir, packing, share, peft_model)


def _check_lora(config: TrainerConfig, sharded: bool) -> None:
    """Refuses ``trainer.lora`` with what it does not support yet (the setting named)."""
    if sharded:
        raise TrainerSetupError(
            "trainer.lora is not supported with FSDP2-sharded trainer workers (more than one "
            "trainer worker, or trainer.actor.fsdp=always): run one trainer worker, or unset "
            "trainer.lora"
        )
    pissa = config.lora is not None and config.lora.init == "pissa"
    if pissa and config.needs_ref and not config.kl.ref_model_path:
        raise TrainerSetupError(
            "trainer.lora.init=pissa changes the base weights, so the reference (the model "
            "with its adapter off) would not be the starting policy: set "
            "trainer.kl.ref_model_path, or use trainer.lora.init=default"
        )


def build_optimizers(
    config: TrainerConfig, policy: nn.Module, critic: nn.Module | None
) -> Optimizers:
    """AdamW (``config.optim``) and its schedule for the policy and the separate critic."""
    o = config.optim
    # Only what is trainable: with LoRA the adapter (and a value head), not the frozen base.
    trainable = [p for p in policy.parameters() if p.requires_grad]
    optimizer = torch.optim.AdamW(
        trainable, lr=o.lr, betas=o.betas, eps=o.eps, weight_decay=o.weight_decay
    )
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lr_lambda(config))
    critic_optimizer = None
    critic_scheduler = None
    if critic is not None:
        critic_optimizer = torch.optim.AdamW(
            critic.parameters(),
            lr=config.critic.lr or o.lr,
            betas=o.betas,
            eps=o.eps,
            weight_decay=o.weight_decay,
        )
        critic_scheduler = torch.optim.lr_scheduler.LambdaLR(critic_optimizer, lr_lambda(config))
    return Optimizers(optimizer, scheduler, critic_optimizer, critic_scheduler)
