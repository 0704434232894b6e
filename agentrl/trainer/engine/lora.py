"""LoRA (``trainer.lora``): a peft adapter over the frozen policy, its reference and weights.

The adapter's layers are injected in place into the HF model, so the
:class:`~agentrl.trainer.engine.actor.PolicyModule` runs it unchanged; the optimizer gets
only the parameters left trainable (the adapter, and a value head). The reference policy
for KL is the same model with the adapter switched off (:class:`AdapterDisabled`), never a
second copy of the base. With ``serve: merged`` the servers receive the merged weights
W + s·BA under the base model's names (:func:`merged_state`), as with full fine-tuning;
with ``serve: adapter`` (default) the run pushes the adapter alone (:func:`save_adapter`,
peft's format), which the servers hot-load as a new version.

Example:
    >>> cfg = TrainerConfig(lora={"rank": 8, "target_modules": ["q_proj", "v_proj"]})
    >>> trainer = Trainer(cfg, "path/to/model")  # doctest: +SKIP
    >>> trainer.save_adapter("out/adapter")  # doctest: +SKIP
"""

from __future__ import annotations

from contextlib import AbstractContextManager
from pathlib import Path
from typing import Any, cast

import torch
from torch import nn

from agentrl.errors import TrainerSetupError
from agentrl.trainer.config import LoraConfig

__all__ = [
    "AdapterDisabled",
    "adapter_state",
    "apply_lora",
    "base_state",
    "count_adapter_params",
    "linear_names",
    "merged_state",
    "resolve_targets",
    "save_adapter",
]

_INSTALL = "LoRA (trainer.lora) needs peft: pip install 'agentrl[lora]'"


def _decoder(lm: nn.Module) -> nn.Module:
    return cast(nn.Module, getattr(lm, cast(Any, lm).base_model_prefix))


def linear_names(lm: nn.Module) -> list[str]:
    """Names (last component) of the decoder's linear layers: what ``target_modules`` takes."""
    return sorted(
        {n.rsplit(".", 1)[-1] for n, m in _decoder(lm).named_modules() if isinstance(m, nn.Linear)}
    )


def resolve_targets(lm: nn.Module, cfg: LoraConfig) -> list[str]:
    """``cfg.target_modules`` as module names, checked against the model's decoder.

    Raises:
        TrainerSetupError: A name that is not a linear layer of the decoder (the lm_head and
            embeddings included: the log-probs are computed from the lm_head's weight), with
            the names the model has.
    """
    have = linear_names(lm)
    if cfg.target_modules == "all-linear":
        return have
    full = [n for n, m in _decoder(lm).named_modules() if isinstance(m, nn.Linear)]
    bad = [t for t in cfg.target_modules if not any(n == t or n.endswith("." + t) for n in full)]
    if bad:
        raise TrainerSetupError(
            f"trainer.lora.target_modules: {', '.join(map(repr, bad))} "
            f"{'is not a linear layer' if len(bad) == 1 else 'are not linear layers'} of "
            f"{type(lm).__name__}'s decoder; it has: {', '.join(have)} (or use 'all-linear')"
        )
    return list(cfg.target_modules)


def count_adapter_params(model: str | Path | nn.Module, lora: LoraConfig) -> int | None:
    """Parameters of the adapter ``lora`` (a ``LoraConfig``) on ``model``: r·(in + out) for
    each decoder linear layer it targets. A model directory is built on the meta device
    (no weights read). None when the model cannot be built that way.

    Raises:
        TrainerSetupError: A ``target_modules`` name the model lacks (the ones it has named).
    """
    lm: nn.Module
    if isinstance(model, nn.Module):
        lm = getattr(model, "lm", model)
    else:
        try:
            from transformers import AutoConfig, AutoModelForCausalLM

            with torch.device("meta"):
                lm = AutoModelForCausalLM.from_config(AutoConfig.from_pretrained(str(model)))
        except Exception:  # e.g. remote code: the caller falls back to the analytic count
            return None
    targets = resolve_targets(lm, lora)
    return sum(
        lora.rank * (m.in_features + m.out_features)
        for n, m in _decoder(lm).named_modules()
        if isinstance(m, nn.Linear) and any(n == t or n.endswith("." + t) for t in targets)
    )


def apply_lora(lm: nn.Module, cfg: LoraConfig) -> Any:
    """Injects a LoRA adapter into ``lm`` in place and freezes everything else.

    Returns the ``peft.PeftModel`` around ``lm`` (``.base_model.model is lm``), which
    the trainer keeps outside its module tree for ``disable_adapter`` and exports.

    Raises:
        TrainerSetupError: peft is not installed, or a bad ``target_modules``.
    """
    try:
        import peft
    except ImportError as e:
        raise TrainerSetupError(_INSTALL) from e
    targets = resolve_targets(lm, cfg)
    pcfg = peft.LoraConfig(
        r=cfg.rank,
        lora_alpha=cast(Any, int(cfg.alpha) if cfg.alpha.is_integer() else cfg.alpha),
        lora_dropout=cfg.dropout,
        target_modules=targets,
        init_lora_weights=True if cfg.init == "default" else cfg.init,
        bias="none",
        task_type="CAUSAL_LM",
    )
    model = peft.get_peft_model(cast(Any, lm), pcfg)
    if model.base_model.model is not lm:  # pragma: no cover - peft wraps in place
        raise TrainerSetupError("peft did not adapt the model in place")
    return model


class AdapterDisabled(nn.Module):
    """The reference policy: ``policy`` run with its adapter switched off, in eval mode.

    Holds no parameters (``policy`` is not a submodule: no second copy, nothing saved
    twice, and ``requires_grad_(False)`` here cannot freeze the adapter). Its forward
    returns no values (a value head is the policy's, not the reference's).
    """

    def __init__(self, policy: nn.Module, peft_model: Any) -> None:
        super().__init__()
        self._target = (policy, peft_model)

    def forward(
        self, *args: Any, **kwargs: Any
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
        policy, peft_model = self._target
        was_training = policy.training
        policy.eval()
        try:
            with cast(AbstractContextManager[None], peft_model.disable_adapter()):
                logp, ent, _ = policy(*args, **kwargs)
        finally:
            policy.train(was_training)
        return logp, ent, None


def merged_state(lm: nn.Module, sd: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """``lm``'s state dict ``sd`` (adapted) as the base model's: W + s·BA, HF names.

    The model is not changed (merging in place and back would round the base weights).
    ``lora_*`` entries are dropped and ``<layer>.base_layer.<p>`` becomes ``<layer>.<p>``.
    """
    from peft.tuners.lora import LoraLayer

    out = base_state(sd)
    for name, m in lm.named_modules():
        if not isinstance(m, LoraLayer):
            continue
        key = f"{name}.weight"
        if key not in out:  # e.g. a tied weight the state dict names once elsewhere
            continue
        with torch.no_grad():
            delta = sum(
                cast(Any, m).get_delta_weight(a) for a in m.active_adapters if a in m.lora_A
            )
            out[key] = (out[key] + cast(torch.Tensor, delta).to(out[key].device)).to(out[key].dtype)
    return out


def base_state(sd: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """An adapted state dict ``sd`` without its adapters, under the base model's names:
    ``lora_*`` entries dropped, ``<layer>.base_layer.<p>`` as ``<layer>.<p>``."""
    return {k.replace(".base_layer.", "."): v for k, v in sd.items() if ".lora_" not in k}


def adapter_state(peft_model: Any) -> dict[str, torch.Tensor]:
    """The adapter's weights on CPU, as peft saves them (``adapter_model.safetensors``)."""
    from peft import get_peft_model_state_dict

    sd = get_peft_model_state_dict(peft_model)
    return {k: v.detach().cpu().clone() for k, v in sd.items()}


def save_adapter(peft_model: Any, out_dir: str | Path) -> Path:
    """Writes ``adapter_config.json`` + ``adapter_model.safetensors`` (``PeftModel`` loads it)."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    peft_model.save_pretrained(str(out), safe_serialization=True)
    return out
