"""Inference: vLLM server fleet, LLM clients, routing, health, weight sync.

See docs/inference.md.
"""

from agentrl.inference.client import (
    BadRequest,
    CompletionsClient,
    GenerateClient,
    ServerUnavailable,
    make_client,
)
from agentrl.inference.fleet import Fleet
from agentrl.inference.router import Router, ServerState
from agentrl.inference.server import ServerConfig, ServerStartError, VLLMServer, check_model_dir
from agentrl.inference.weight_sync import NcclWeightSync, PauseMode, SyncReport, WeightSync

__all__ = [
    "BadRequest",
    "CompletionsClient",
    "Fleet",
    "GenerateClient",
    "NcclWeightSync",
    "PauseMode",
    "Router",
    "ServerConfig",
    "ServerStartError",
    "ServerState",
    "ServerUnavailable",
    "SyncReport",
    "VLLMServer",
    "WeightSync",
    "check_model_dir",
    "make_client",
]
