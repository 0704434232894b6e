"""FSDP2 sharding of a module across the workers of a torch.distributed group."""

from __future__ import annotations

from torch import nn

__all__ = ["shard_module"]


def shard_module(module: nn.Module) -> None:
    """fully_shard each transformer block (the HF ``_no_split_modules``), then the root."""
    from torch.distributed.fsdp import fully_shard

    lm = getattr(module, "lm", module)
    block_names = set(getattr(lm, "_no_split_modules", None) or [])
    for sub in module.modules():
        if type(sub).__name__ in block_names:
            fully_shard(sub)
    fully_shard(module)
