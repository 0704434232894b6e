"""A tiny sequence-classification reward model for tests, built from a policy's directory."""

from __future__ import annotations

from pathlib import Path

__all__ = ["build_tiny_reward_model"]


def build_tiny_reward_model(policy_dir: str | Path, out_dir: str | Path, *, seed: int = 0) -> Path:
    """Writes a randomly initialised one-label ``*ForSequenceClassification`` model with
    the policy's architecture, tokenizer and chat template into ``out_dir``.

    Args:
        policy_dir: A causal-LM directory (e.g. the tiny model's).
        out_dir: Where to save it (created).
        seed: Seeds the initialisation.
    """
    import torch
    from transformers import AutoConfig, AutoModelForSequenceClassification, AutoTokenizer

    cfg = AutoConfig.from_pretrained(str(policy_dir))
    tok = AutoTokenizer.from_pretrained(str(policy_dir))
    cfg.num_labels = 1
    cfg.architectures = [type(cfg).__name__.replace("Config", "ForSequenceClassification")]
    if cfg.pad_token_id is None:
        cfg.pad_token_id = tok.pad_token_id if tok.pad_token_id is not None else tok.eos_token_id
    torch.manual_seed(seed)
    model = AutoModelForSequenceClassification.from_config(cfg)
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(out)
    tok.save_pretrained(out)
    return out
