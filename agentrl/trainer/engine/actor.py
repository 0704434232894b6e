"""The actor: a Hugging Face causal LM scored on the model's own tokens only.

Log-probabilities and entropies are computed from the hidden states of the positions
that predict model tokens, in chunks of ``chunk`` tokens, each chunk under activation
checkpointing: the full-vocabulary logits of at most one chunk exist at a time, in
forward and in backward, instead of (batch × length × vocab) at once.
"""

from __future__ import annotations

import copy
import importlib.util
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Any, cast

import torch
from torch import nn
from torch.utils.checkpoint import checkpoint

from agentrl.errors import TrainerSetupError
from agentrl.trainer.config import ActorConfig
from agentrl.trainer.engine.batch import MicroBatch

__all__ = [
    "ForwardOut",
    "PolicyModule",
    "chunked_logprobs",
    "load_causal_lm",
    "resolve_dtype",
    "save_hf_dir",
]

_TOKENIZER_FILES = (
    "tokenizer.json",
    "tokenizer_config.json",
    "special_tokens_map.json",
    "vocab.json",
    "merges.txt",
    "tokenizer.model",
    "added_tokens.json",
    "chat_template.jinja",
    "chat_template.json",
    "generation_config.json",
)


def resolve_dtype(cfg: ActorConfig, device: torch.device) -> torch.dtype:
    """Compute dtype: bf16 autocast on GPU for 'auto', fp32 on CPU."""
    if cfg.dtype == "bfloat16":
        return torch.bfloat16
    if cfg.dtype == "float32" or device.type != "cuda":
        return torch.float32
    return torch.bfloat16


def _attn_impl(cfg: ActorConfig, device: torch.device) -> str:
    if cfg.attn_implementation != "auto":
        return cfg.attn_implementation
    if device.type == "cuda" and importlib.util.find_spec("flash_attn") is not None:
        return "flash_attention_2"
    return "sdpa"


def load_causal_lm(
    model: str | Path | nn.Module, cfg: ActorConfig, device: torch.device
) -> tuple[nn.Module, Path | None]:
    """Loads (or deep-copies) a causal LM in fp32; returns it and its source directory."""
    if isinstance(model, nn.Module):
        return copy.deepcopy(model).float(), None
    from transformers import AutoModelForCausalLM

    lm = AutoModelForCausalLM.from_pretrained(
        str(model),
        dtype=torch.float32,
        attn_implementation=_attn_impl(cfg, device),
        trust_remote_code=cfg.trust_remote_code,
    )
    src = Path(model)
    return lm, src if src.is_dir() else None


def _chunk_fn(
    h_NH: torch.Tensor,
    w_VH: torch.Tensor,
    b_V: torch.Tensor | None,
    tgt_N: torch.Tensor,
    inv_temp: float,
    entropy_grad: bool,
) -> tuple[torch.Tensor, torch.Tensor]:
    logits_NV = torch.nn.functional.linear(h_NH, w_VH, b_V).float()
    if inv_temp != 1.0:  # a multiply by 1 is a full (N × V) pass, forward and backward
        logits_NV = logits_NV * inv_temp
    logp_NV = torch.log_softmax(logits_NV, dim=-1)  # one fused pass; so is its backward
    logp_N = logp_NV.gather(-1, tgt_N[:, None]).squeeze(-1)
    # H(p) = -Σ_v p_v log p_v. Last, and without autograd unless the loss uses it: then a
    # checkpoint's recompute stops before it (non-reentrant early stop) and saves nothing.
    with torch.set_grad_enabled(entropy_grad and torch.is_grad_enabled()):
        ent_N = -(logp_NV.exp() * logp_NV).sum(-1)
    return logp_N, ent_N


def chunked_logprobs(
    h_NH: torch.Tensor,
    head: nn.Module,
    tgt_N: torch.Tensor,
    chunk: int,
    temperature: float = 1.0,
    entropy_grad: bool = True,
) -> tuple[torch.Tensor, torch.Tensor]:
    """log π(target) and entropy for N hidden states, ``chunk`` rows of logits at a time.

    ``entropy_grad=False`` returns the entropy detached (a metric, not a loss term), which
    spares its (N × V) passes in backward and in the checkpoint's recompute.
    """
    w: torch.Tensor = head.weight  # type: ignore[assignment]  # nn.Module attrs are untyped
    b: torch.Tensor | None = getattr(head, "bias", None)
    outs_lp, outs_ent = [], []
    grad = torch.is_grad_enabled() and (h_NH.requires_grad or w.requires_grad)
    args = (1.0 / temperature, entropy_grad)
    for s in range(0, h_NH.shape[0], chunk):
        h, t = h_NH[s : s + chunk], tgt_N[s : s + chunk]
        if grad:
            lp, ent = checkpoint(_chunk_fn, h, w, b, t, *args, use_reentrant=False)
        else:
            lp, ent = _chunk_fn(h, w, b, t, *args)
        outs_lp.append(lp)
        outs_ent.append(ent)
    if not outs_lp:
        z = h_NH.new_zeros(0, dtype=torch.float32)
        return z, z
    return torch.cat(outs_lp), torch.cat(outs_ent)


@dataclass
class ForwardOut:
    """Compact (b, R) outputs of one micro-batch (zeros on padding)."""

    logp_bR: torch.Tensor
    entropy_bR: torch.Tensor
    values_bR: torch.Tensor | None


class PolicyModule(nn.Module):
    """A causal LM (+ optional value head) whose forward scores a micro-batch's model tokens.

    Wrapping the LM in one module lets FSDP2 treat it as the root (embeddings, final norm
    and lm head are gathered by its forward hook).
    """

    def __init__(
        self,
        lm: nn.Module,
        *,
        value_head: bool,
        chunk: int,
        temperature: float,
        need_logp: bool = True,
        entropy_grad: bool = True,
    ) -> None:
        super().__init__()
        self.lm = lm
        hidden = int(cast(Any, lm).config.hidden_size)
        self.value_head = nn.Linear(hidden, 1) if value_head else None
        if self.value_head is not None:
            nn.init.zeros_(self.value_head.weight)
            nn.init.zeros_(self.value_head.bias)
        self.chunk = chunk
        self.temperature = temperature
        self.need_logp = need_logp
        self.entropy_grad = entropy_grad  # False: the entropy is a metric only (detached)

    def forward(
        self,
        input_ids: torch.Tensor,
        position_ids: torch.Tensor,
        attention_mask: torch.Tensor | None,
        sel_N: torch.Tensor,
        targets_N: torch.Tensor,
        prefix_ids: torch.Tensor | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
        lm = cast(Any, self.lm)
        base = getattr(lm, lm.base_model_prefix)
        past = None
        if prefix_ids is not None:
            # A prompt shared by every row runs once; its keys and values, repeated per
            # row, are the rows' cache (gradients reach the prefix through them).
            P = prefix_ids.shape[1]
            pos = torch.arange(P, device=prefix_ids.device)[None]
            past = base(input_ids=prefix_ids, position_ids=pos, use_cache=True).past_key_values
            if past is None:
                raise TrainerSetupError(
                    f"{type(lm).__name__} returned no key/value cache for a shared prefix; "
                    "set trainer.update.share_prefix=false"
                )
            past.batch_repeat_interleave(input_ids.shape[0])
        out = base(
            input_ids=input_ids,
            position_ids=position_ids,
            attention_mask=attention_mask,
            past_key_values=past,
            # Without a prefix no cache: one would disable HF's packed-sequence masking.
            use_cache=past is not None,
        )
        hidden = out.last_hidden_state
        h_NH = hidden.reshape(-1, hidden.shape[-1]).index_select(0, sel_N)
        if self.need_logp:
            logp_N, ent_N = chunked_logprobs(
                h_NH,
                lm.get_output_embeddings(),
                targets_N,
                self.chunk,
                self.temperature,
                self.entropy_grad,
            )
        else:
            logp_N = ent_N = h_NH.new_zeros(h_NH.shape[0], dtype=torch.float32)
        values_N = None
        if self.value_head is not None:
            values_N = self.value_head(h_NH.float()).squeeze(-1).float()
        return logp_N, ent_N, values_N


def to_compact(x_N: torch.Tensor, mask_bR: torch.Tensor) -> torch.Tensor:
    """Scatters a flat per-model-token vector into compact (b, R) rows."""
    out = torch.zeros(mask_bR.shape, dtype=x_N.dtype, device=x_N.device)
    return out.masked_scatter(mask_bR > 0, x_N)


def run_micro_batch(
    module: nn.Module, mb: MicroBatch, mask_bR: torch.Tensor, autocast_dtype: torch.dtype
) -> ForwardOut:
    """Forward of ``module`` (a PolicyModule, maybe FSDP-wrapped) on one micro-batch."""
    dev = mask_bR.device
    use_autocast = autocast_dtype != torch.float32
    with torch.autocast(dev.type, dtype=autocast_dtype, enabled=use_autocast):
        logp_N, ent_N, val_N = module(
            mb.input_ids, mb.position_ids, mb.attention_mask, mb.sel_N, mb.targets_N, mb.prefix_ids
        )
    return ForwardOut(
        to_compact(logp_N.float(), mask_bR),
        to_compact(ent_N.float(), mask_bR),
        to_compact(val_N.float(), mask_bR) if val_N is not None else None,
    )


def save_hf_dir(
    lm: nn.Module, state: dict[str, torch.Tensor], out_dir: str | Path, source_dir: Path | None
) -> Path:
    """Writes config + safetensors (+ tokenizer files of the source dir) to ``out_dir``."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    cast(Any, lm).save_pretrained(str(out), state_dict=state)
    if source_dir is not None:
        for name in _TOKENIZER_FILES:
            f = source_dir / name
            if f.is_file() and not (out / name).exists():
                shutil.copy2(f, out / name)
    return out
