"""How much memory a trainer step takes, and the settings that make it fit.

A small memory model of one step (bytes; P = parameters, T = tokens of a micro-batch,
H/I = hidden/intermediate size, kv = key/value width, V = vocabulary, n = layers):

- **static**: fp32 weights, grads and AdamW's two moments, 16·P for the policy
  (+4·P for a frozen reference model, +16·P for a separate critic), divided by the
  number of FSDP workers; with LoRA (``trainer.lora``) 4·P for the frozen base and 16·L
  for the L adapter parameters (rank r on a linear layer (in, out) adds r·(in + out)),
  and no reference copy (the reference is the base with the adapter off);
- **activations** kept for backward: ``T · n · s · (14·H + 2·kv + 4·I) · 4`` — the
  floats a Llama/Qwen2 decoder layer keeps per token (norms, q/k/v, RoPE and repeated
  k/v copies, attention output, MLP gate/up/act), × ``act_scale`` without and
  ``ckpt_scale`` with gradient checkpointing (measured: on CPU, checkpointing only
  halves the peak, since backward's own per-token temporaries remain);
- **lm head**: ``logit_copies · chunk · V · 4`` (the logprob path runs ``logprob_chunk``
  tokens at a time, ``actor.chunked_logprobs``) plus ``head_grad_copies · V · H · 4``
  (each chunk's lm-head weight gradient before it is summed; none with LoRA, whose
  lm head is frozen);
- **runtime**: the Python/torch/transformers process itself.

The coefficients (:data:`CPU_CALIBRATION`) were fitted on this project's 2-core 24 GiB
CPU machine (fp32, sdpa, torch 2.13, transformers 5.19) to the peak RSS of a
steady-state ``Trainer.step`` of SmolLM2-135M- and Qwen2.5-0.5B-shaped models
(``benchmarks/trainer_memory.py --calibrate``); ``docs/trainer.md`` ("Memory") has the
measured table. On GPU (bf16 autocast) activations are scaled by ``bf16_act_ratio``,
an uncalibrated guess.

:func:`plan_memory` resolves the ``"auto"`` settings from the memory available
(``agentrl.trainer.engine.sysmem.available_bytes``) and
raises :class:`MemoryPlanError`, naming the setting to change, when a configuration
cannot fit.
"""

from __future__ import annotations

import math
import os
import warnings
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from agentrl.trainer.engine.sysmem import available_bytes

__all__ = [
    "CPU_CALIBRATION",
    "MemoryCoefficients",
    "MemoryEstimate",
    "MemoryPlan",
    "MemoryPlanError",
    "ModelShape",
    "auto_chunk",
    "device_chunk",
    "estimate_step",
    "model_shape",
    "plan_memory",
    "server_bytes",
    "trainer_plan",
]

GB = 1e9


class MemoryPlanError(RuntimeError):
    """The trainer cannot fit in the memory available; the message names the setting."""


@dataclass(frozen=True)
class ModelShape:
    """The sizes of a decoder-only causal LM that memory depends on."""

    params: int
    hidden: int
    layers: int
    heads: int
    kv_heads: int
    head_dim: int
    intermediate: int
    vocab: int

    @classmethod
    def from_config(cls, cfg: Any, params: int | None = None) -> ModelShape:
        """From a HF config (``params`` counted analytically when not given)."""
        h = int(cfg.hidden_size)
        heads = int(cfg.num_attention_heads)
        kv = int(getattr(cfg, "num_key_value_heads", None) or heads)
        hd = int(getattr(cfg, "head_dim", None) or h // heads)
        inter = int(getattr(cfg, "intermediate_size", None) or 4 * h)
        n, v = int(cfg.num_hidden_layers), int(cfg.vocab_size)
        if params is None:
            layer = h * hd * (heads + 2 * kv) + heads * hd * h + 3 * h * inter + 2 * h
            tied = bool(getattr(cfg, "tie_word_embeddings", False))
            params = v * h * (1 if tied else 2) + n * layer + h
        return cls(params, h, n, heads, kv, hd, inter, v)

    def lora_params(self, rank: int) -> int:
        """Adapter parameters of rank ``rank`` on every linear layer of a Llama/Qwen2-style
        decoder: r·(in + out) for q, k, v, o, gate, up and down, per layer."""
        q, kv = self.heads * self.head_dim, self.kv_heads * self.head_dim
        h, i = self.hidden, self.intermediate
        per_layer = (h + q) + 2 * (h + kv) + (q + h) + 2 * (h + i) + (i + h)
        return rank * per_layer * self.layers


def model_shape(model: str | Path | torch.nn.Module) -> ModelShape:
    """The shape of a model instance (parameters counted) or of a model directory / hub id."""
    if isinstance(model, torch.nn.Module):
        lm = getattr(model, "lm", model)
        n = sum(p.numel() for p in {id(p): p for p in lm.parameters()}.values())
        return ModelShape.from_config(lm.config, n)
    from transformers import AutoConfig

    return ModelShape.from_config(AutoConfig.from_pretrained(str(model)))


@dataclass(frozen=True)
class MemoryCoefficients:
    """The calibrated constants of the memory model (see the module docstring).

    Attributes:
        runtime_bytes: The process without the model (Python, torch, transformers).
        act_scale: Activation bytes per token, × the layer count of floats
            ``14·H + 2·kv + 4·I`` (no checkpointing).
        ckpt_scale: The same with gradient checkpointing.
        attn_scale: Floats per layer, token, head and context position (attention
            scores kept for backward; 0 where sdpa runs a flash kernel).
        logit_copies: fp32 (chunk × V) tensors alive at once in the logprob path.
        head_grad_copies: (V × H) fp32 lm-head gradients alive at once (one per chunk's
            backward, summed into the weight's gradient).
        bf16_act_ratio: Activation bytes under bf16 autocast relative to fp32.
        safety: Share of the available memory the automatic settings plan to use.
    """

    runtime_bytes: float
    act_scale: float
    ckpt_scale: float
    attn_scale: float
    logit_copies: float
    head_grad_copies: float
    bf16_act_ratio: float = 0.6
    safety: float = 0.85


# Fitted on peak RSS of steady-state Trainer.step on CPU (fp32, sdpa, torch 2.13, the mmap
# threshold of return_freed_memory), see docs/trainer.md "Memory": every measured point is
# at or below its estimate (by 4-40%).
CPU_CALIBRATION = MemoryCoefficients(
    runtime_bytes=0.55 * GB,
    act_scale=1.1,
    ckpt_scale=0.4,
    attn_scale=0.0,
    logit_copies=3.0,
    head_grad_copies=2.0,
)


@dataclass(frozen=True)
class MemoryEstimate:
    """Bytes of one trainer step, by consumer (one worker)."""

    static: float
    activations: float
    logits: float
    runtime: float

    @property
    def total(self) -> float:
        return self.static + self.activations + self.logits + self.runtime

    def describe(self) -> str:
        return (
            f"~{self.total / GB:.1f} GB (weights+grads+AdamW {self.static / GB:.1f}, "
            f"activations {self.activations / GB:.1f}, lm head {self.logits / GB:.1f}, "
            f"runtime {self.runtime / GB:.1f})"
        )


def estimate_step(
    shape: ModelShape,
    *,
    tokens: int,
    seq_len: int,
    checkpointing: bool,
    chunk: int,
    ref_model: bool = False,
    separate_critic: bool = False,
    world: int = 1,
    bf16: bool = False,
    flash: bool = False,
    lora_params: int | None = None,
    coef: MemoryCoefficients = CPU_CALIBRATION,
) -> MemoryEstimate:
    """Peak bytes of one step with micro-batches of ``tokens`` tokens (rows ≤ ``seq_len``).

    ``lora_params``: the adapter's parameter count when only a LoRA adapter trains (the
    base is frozen: no gradients or AdamW moments for it, nor for the lm head); None
    when every weight trains.
    """
    p = shape.params
    policy = 16 * p if lora_params is None else 4 * p + 16 * lora_params
    static = (policy + (4 * p if ref_model else 0) + (16 * p if separate_critic else 0)) / world
    kv = shape.kv_heads * shape.head_dim
    layer_f = 14 * shape.hidden + 2 * kv + 4 * shape.intermediate
    attn_f = 0.0 if flash else coef.attn_scale * shape.heads * min(seq_len, tokens)
    scale = coef.ckpt_scale if checkpointing else coef.act_scale
    act = tokens * shape.layers * (scale * layer_f + attn_f) * 4
    if bf16:
        act *= coef.bf16_act_ratio
    if separate_critic:
        act *= 2
    head = coef.logit_copies * min(chunk, tokens) * shape.vocab * 4
    if lora_params is None:  # a frozen lm head (LoRA) gets no weight gradient
        head += coef.head_grad_copies * shape.vocab * shape.hidden * 4 / world
    return MemoryEstimate(static, act, head, coef.runtime_bytes)


def auto_chunk(vocab: int, target_bytes: float = 128 * 2**20, most: int = 4096) -> int:
    """Logprob chunk: the power of two (128..most) whose fp32 (chunk, V) logits fit the target."""
    n = max(1, int(target_bytes // (vocab * 4)))
    return int(min(most, max(128, 2 ** int(math.log2(n)))))


def device_chunk(vocab: int, device: str, available: float) -> int:
    """The ``auto`` logprob chunk on ``device`` for a worker with ``available`` bytes.

    CPU: logits ≤ 128 MiB, at most 4,096 tokens. GPU: logits ≤ 2% of the worker's
    memory and ≤ 1 GiB, at most 1,024 tokens. On one H100, 128-token chunks left the lm
    head launch-bound: Qwen2.5-1.5B shape (152k vocab, 64 × 1,024 tokens a step) ran
    16.8k / 18.3k / 21.2k / 20.1k tokens/s at 128 / 512 / 1,024 / 2,048; a SmolLM2-135M
    shape (49k, 128 × 1,024) ran 47-50k at 512, 49-62k at 1,024 and 48-66k at 4,096 over
    repeated runs, so larger chunks than 1,024 bought nothing measurable.
    """
    if device != "cuda":
        return auto_chunk(vocab)
    return auto_chunk(vocab, min(float(2**30), 0.02 * available), most=1024)


def server_bytes(
    shape: ModelShape, kv_cache_gb: float, num_servers: int, weight_bytes: int = 2
) -> float:
    """RAM that ``num_servers`` local vLLM-CPU servers take: KV cache, weights, runtime.

    ``weight_bytes`` per parameter: 2 (bf16, vLLM's choice for "auto"), 4 for float32.
    The runtime term (API server, engine core and worker processes) is 3 GB a server:
    a vLLM-CPU 0.32 server of SmolLM2-135M with a 2 GiB KV cache measured 5.2 GB RSS
    over its three processes on this project's machine.
    """
    return num_servers * (kv_cache_gb * 2**30 + weight_bytes * shape.params + 3.0 * GB)


@dataclass(frozen=True)
class MemoryPlan:
    """The resolved memory settings of a trainer, and why."""

    token_budget: int
    gradient_checkpointing: bool
    logprob_chunk: int
    estimate: MemoryEstimate
    available: float
    notes: list[str] = field(default_factory=list)
    shape: ModelShape | None = None

    def summary(self) -> str:
        return (
            f"token_budget={self.token_budget} gradient_checkpointing="
            f"{str(self.gradient_checkpointing).lower()} logprob_chunk={self.logprob_chunk}: "
            f"{self.estimate.describe()} of {self.available / GB:.1f} GB available"
        )


# Largest automatic budget: on 2 CPU cores micro-batches of 1-2k tokens ran at 107-140
# tokens/s and 4096 at 51 (SmolLM2-135M, benchmarks/trainer_memory.py): bigger ones only
# take memory there.
_MAX_AUTO_BUDGET = {"cpu": 2048, "cuda": 65536}


def plan_memory(
    shape: ModelShape,
    cfg: Any,
    *,
    max_seq_len: int,
    available: float,
    device: str = "cpu",
    world: int = 1,
    local_world: int = 1,
    flash: bool = False,
    strict: bool = True,
    lora_params: int | None = None,
    coef: MemoryCoefficients = CPU_CALIBRATION,
) -> MemoryPlan:
    """Resolves ``"auto"`` token budget / checkpointing / chunk and checks that the result fits.

    Args:
        shape: The policy's shape.
        cfg: The ``TrainerConfig``.
        max_seq_len: The longest episode (tokens) the trainer will see.
        available: Bytes free for the trainer processes on this host (or GPU).
        device: "cpu" or "cuda".
        world: FSDP workers (static memory is sharded over them).
        local_world: Workers sharing this host's memory (``available`` is split among them).
        flash: Flash attention (no attention-score term).
        strict: Raise when nothing fits (False: keep explicit settings, or take the
            smallest automatic ones, and say so in ``notes``).
        lora_params: With ``cfg.lora``, the adapter's parameter count (``lora.py``'s
            ``count_adapter_params``; None: every linear layer of a Llama-style decoder,
            :meth:`ModelShape.lora_params`). Ignored without ``cfg.lora``.

    Raises:
        MemoryPlanError: Even the smallest configuration allowed by the explicit settings
            does not fit; the message names the setting to change.
    """
    u, a = cfg.update, cfg.actor
    per_worker = available / max(1, local_world)
    chunk = (
        device_chunk(shape.vocab, device, per_worker)
        if u.logprob_chunk == "auto"
        else int(u.logprob_chunk)
    )
    lora = getattr(cfg, "lora", None)
    adapter = None
    if lora is not None:
        adapter = lora_params if lora_params is not None else shape.lora_params(lora.rank)
    # With LoRA the reference is the base with the adapter off, unless loaded from a path.
    ref = bool(cfg.needs_ref) and (lora is None or bool(cfg.kl.ref_model_path))
    kw = dict(
        seq_len=max_seq_len, chunk=chunk, ref_model=ref, world=world,
        separate_critic=bool(cfg.uses_critic and cfg.critic.kind == "separate"),
        bf16=device == "cuda" and a.dtype != "float32", flash=flash, lora_params=adapter,
        coef=coef,
    )  # fmt: skip

    def est(tokens: int, ckpt: bool) -> MemoryEstimate:
        return estimate_step(shape, tokens=tokens, checkpointing=ckpt, **kw)  # type: ignore[arg-type]

    def largest(ckpt: bool) -> int:
        # The largest budget whose estimate fits the safe share; ≥ max_seq_len or 0.
        room = coef.safety * per_worker
        lo, hi = 0, _MAX_AUTO_BUDGET.get(device, 8192)
        if est(max_seq_len, ckpt).total > room:
            return 0
        lo = max_seq_len
        while lo < hi:
            mid = (lo + hi + 1) // 2
            lo, hi = (mid, hi) if est(mid, ckpt).total <= room else (lo, mid - 1)
        return lo

    gb = per_worker / GB
    notes: list[str] = []
    fixed = u.strategy == "fixed"
    if u.token_budget != "auto" or fixed:
        tokens = u.micro_batch_size * max_seq_len if fixed else int(u.token_budget)
        tokens = max(tokens, max_seq_len)  # a longer row gets a micro-batch of its own
        name = (
            f"trainer.update.micro_batch_size={u.micro_batch_size}"
            if fixed
            else f"trainer.update.token_budget={u.token_budget}"
        )
        if a.gradient_checkpointing == "auto":
            ckpt = est(tokens, False).total > coef.safety * per_worker
        else:
            ckpt = bool(a.gradient_checkpointing)
        e = est(tokens, ckpt)
        if e.total > per_worker:
            hint = "lower it" + (
                "" if ckpt else " or set trainer.actor.gradient_checkpointing=true"
            )
            msg = (
                f"{name} (episodes up to {max_seq_len} tokens) needs {e.describe()}, "
                f"{gb:.1f} GB available; {hint}"
            )
            if strict:
                raise MemoryPlanError(msg)
            notes.append(msg)
        budget = int(u.token_budget) if u.token_budget != "auto" else tokens
        return MemoryPlan(budget, ckpt, chunk, e, per_worker, notes, shape)

    if a.gradient_checkpointing == "auto":
        plain = largest(False)
        # Checkpointing costs ~1/3 more compute: only when the plain budget is tiny.
        if plain >= max(2 * max_seq_len, 2048) or plain >= _MAX_AUTO_BUDGET.get(device, 8192):
            ckpt, budget = False, plain
        else:
            ckpt, budget = True, largest(True)
            notes.append(f"gradient checkpointing on (without it the budget would be {plain})")
    else:
        ckpt = bool(a.gradient_checkpointing)
        budget = largest(ckpt)
    if budget == 0:
        e = est(max_seq_len, ckpt)
        ck = "" if ckpt else ", set trainer.actor.gradient_checkpointing=true"
        msg = (
            f"one episode of rollout.max_total_tokens={max_seq_len} tokens needs "
            f"{e.describe()} to train, {gb:.1f} GB available; lower rollout.max_total_tokens"
            f"{ck}, free memory (fewer or smaller inference servers: inference.kv_cache_gb) "
            "or use a smaller model"
        )
        if strict:
            raise MemoryPlanError(msg)
        notes.append(msg)
        ckpt = ckpt if a.gradient_checkpointing != "auto" else True
        budget = max_seq_len
    return MemoryPlan(budget, ckpt, chunk, est(budget, ckpt), per_worker, notes, shape)


def trainer_plan(
    cfg: Any,
    model: str | Path | torch.nn.Module,
    device: torch.device,
    *,
    world: int,
    max_seq_len: int | None,
    available: float | None,
) -> MemoryPlan:
    """The plan of a Trainer being built (before its model is loaded).

    ``max_seq_len`` None: 2048 tokens (the orchestrator passes rollout.max_total_tokens).
    Not strict: settings that look too big are kept (or the smallest automatic ones
    taken) and said in the plan's notes, and warned about; the run's preflight
    (``agentrl.orchestration.trainer_memory``) is what stops a run that cannot fit.
    """
    shape = model_shape(model)
    if available is None:
        available = available_bytes(device)
        if device.type == "cpu" and isinstance(model, torch.nn.Module):
            available += 4 * shape.params  # the caller's copy is already resident
    local = 1 if device.type == "cuda" else int(os.environ.get("LOCAL_WORLD_SIZE", world))
    attn = getattr(getattr(model, "config", None), "_attn_implementation", None)
    adapter = None
    if cfg.lora is not None:
        from agentrl.trainer.engine.lora import count_adapter_params

        adapter = count_adapter_params(model, cfg.lora)
    plan = plan_memory(
        shape, cfg, max_seq_len=max_seq_len or 2048, available=available, device=device.type,
        world=world, local_world=local, flash=attn == "flash_attention_2", strict=False,
        lora_params=adapter,
    )  # fmt: skip
    for note in plan.notes:
        if "needs" in note:
            warnings.warn(f"trainer memory: {note}", RuntimeWarning, stacklevel=3)
    return plan
