"""Reward sources beside the env's own: a served reward model (``model_reward``)."""

from agentrl.rewards.model_reward import (
    RewardMix,
    ScoredRunner,
    Scorer,
    SequenceScorer,
    reward_model_metrics,
)

__all__ = ["RewardMix", "ScoredRunner", "Scorer", "SequenceScorer", "reward_model_metrics"]
