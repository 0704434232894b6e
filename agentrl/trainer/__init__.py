"""The learner: pure math (``algo``), the engine (``engine``), other objectives (``objectives``).

The trainer's only input is a list of ``agentrl.types.Trajectory``; it imports nothing
from rollout, inference or orchestration (the layer contracts in pyproject.toml hold it).
"""

from agentrl.trainer.algo.advantages import (
    ADVANTAGE_ESTIMATORS,
    AdvantageInputs,
    compute_advantages,
)
from agentrl.trainer.algo.kl import kl_estimate
from agentrl.trainer.algo.losses import POLICY_LOSSES, agg_loss, compute_policy_loss
from agentrl.trainer.algo.shaping import dynamic_filter, shape_rewards
from agentrl.trainer.config import (
    ActorConfig,
    AdvantageConfig,
    CheckpointConfig,
    CriticConfig,
    KLConfig,
    LoraConfig,
    OptimConfig,
    PolicyLossConfig,
    RolloutCorrectionConfig,
    ShapingConfig,
    TrainerConfig,
    UpdateConfig,
)
from agentrl.trainer.engine.distributed import DataParallelTrainer
from agentrl.trainer.engine.trainer import NonFiniteError, Trainer
from agentrl.trainer.objectives import DPOObjective  # registers trainer.loss.name=dpo

__all__ = [
    "ADVANTAGE_ESTIMATORS",
    "POLICY_LOSSES",
    "ActorConfig",
    "AdvantageConfig",
    "AdvantageInputs",
    "CheckpointConfig",
    "CriticConfig",
    "DPOObjective",
    "DataParallelTrainer",
    "KLConfig",
    "LoraConfig",
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
