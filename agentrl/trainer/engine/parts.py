"""What the update and the checkpoints use of a Trainer, as a Protocol.

:mod:`~agentrl.trainer.engine.update` and :mod:`~agentrl.trainer.engine.state` are handed
the :class:`~agentrl.trainer.engine.trainer.Trainer` that calls them; they name it by this
Protocol, so the Trainer imports them and nothing imports the Trainer back.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any, Protocol

import torch
from torch import nn

from agentrl.trainer.algo.kl import AdaptiveKLController, FixedKLController
from agentrl.trainer.config import TrainerConfig
from agentrl.trainer.engine.actor import ForwardOut, PolicyModule
from agentrl.trainer.engine.batch import Batch

__all__ = ["NonFiniteError", "TrainerParts"]


class NonFiniteError(FloatingPointError):
    """A loss or gradient became NaN/inf; the optimizer step was not taken."""


class TrainerParts(Protocol):
    """The networks, optimizers, counters and forward pass of one trainer worker."""

    cfg: TrainerConfig
    rank: int
    world: int
    device: torch.device
    source_dir: Path | None
    policy: PolicyModule
    ref: nn.Module | None
    critic: PolicyModule | None
    optimizer: torch.optim.AdamW
    scheduler: torch.optim.lr_scheduler.LambdaLR
    critic_optimizer: torch.optim.AdamW | None
    critic_scheduler: torch.optim.lr_scheduler.LambdaLR | None
    lora: Any
    """The ``peft.PeftModel`` around the policy's LM (``trainer.lora``), else None."""
    kl_ctl: FixedKLController | AdaptiveKLController
    global_step: int
    optimizer_steps: int
    samples_seen: int
    dropped_groups_total: int

    def plan(self, batch: Batch, rows: Sequence[int]) -> list[list[int]]:
        """This worker's micro-batches of ``rows``."""
        ...

    def forward(self, module: nn.Module, batch: Batch, rows: Sequence[int]) -> ForwardOut:
        """Runs ``module`` on ``rows``."""
        ...

    def state_dict_for_inference(self) -> dict[str, torch.Tensor]:
        """The policy's full weights, as the inference servers load them."""
        ...
