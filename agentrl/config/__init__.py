"""Typed run configuration: its sections, loading with presets and overrides, Ray placement."""

from agentrl.config.ray import RayConfig, RoleSpec
from agentrl.config.run import ConfigError, RunConfig, dump_config, load_config
from agentrl.config.sections import (
    DEFAULT_LR,
    DEFAULT_MODEL,
    AgentConfig,
    EvalConfig,
    InferenceConfig,
    ModelConfig,
    OrchestrationConfig,
    RewardConfig,
    RolloutConfig,
    StageConfig,
    TreeConfig,
)

__all__ = [
    "DEFAULT_LR",
    "DEFAULT_MODEL",
    "AgentConfig",
    "ConfigError",
    "EvalConfig",
    "InferenceConfig",
    "ModelConfig",
    "OrchestrationConfig",
    "RayConfig",
    "RewardConfig",
    "RoleSpec",
    "RolloutConfig",
    "RunConfig",
    "StageConfig",
    "TreeConfig",
    "dump_config",
    "load_config",
]
