"""agentrl.trainer: policy-gradient algorithms, rollout correction, actor, checkpoints, DP.

The trainer's only input is a list of ``agentrl.types.Trajectory``; it imports nothing
from rollout, inference or orchestration.
"""

from agentrl.trainer.advantages import ADVANTAGE_ESTIMATORS, AdvantageInputs, compute_advantages
from agentrl.trainer.config import (
    ActorConfig,
    AdvantageConfig,
    CheckpointConfig,
    CriticConfig,
    KLConfig,
    OptimConfig,
    PolicyLossConfig,
    RolloutCorrectionConfig,
    ShapingConfig,
    TrainerConfig,
    UpdateConfig,
)
from agentrl.trainer.distributed import DataParallelTrainer
from agentrl.trainer.kl import kl_estimate
from agentrl.trainer.losses import POLICY_LOSSES, agg_loss, compute_policy_loss
from agentrl.trainer.shaping import dynamic_filter, shape_rewards
from agentrl.trainer.trainer import NonFiniteError, Trainer

__all__ = [
    "ADVANTAGE_ESTIMATORS",
    "POLICY_LOSSES",
    "ActorConfig",
    "AdvantageConfig",
    "AdvantageInputs",
    "CheckpointConfig",
    "CriticConfig",
    "DataParallelTrainer",
    "KLConfig",
    "NonFiniteError",
    "OptimConfig",
    "PolicyLossConfig",
    "RolloutCorrectionConfig",
    "ShapingConfig",
    "Trainer",
    "TrainerConfig",
    "UpdateConfig",
    "agg_loss",
    "compute_advantages",
    "compute_policy_loss",
    "dynamic_filter",
    "kl_estimate",
    "shape_rewards",
]
