"""Inference: the LLMClient protocol, vLLM servers, clients, routing, health, weight sync.

Names load on first use, so ``import agentrl`` (which needs only the protocol) does not
import httpx and the server machinery. See docs/inference.md.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from agentrl.inference.protocol import Generation, LLMClient, LLMError, SamplingParams

if TYPE_CHECKING:
    from agentrl.inference.client import (
        BadRequest,
        CompletionsClient,
        GenerateClient,
        ServerUnavailable,
        make_client,
    )
    from agentrl.inference.fleet import Fleet
    from agentrl.inference.lora_sync import AdapterRefused, AdapterSync
    from agentrl.inference.router import Router, ServerState
    from agentrl.inference.server import (
        ServerConfig,
        ServerStartError,
        VLLMServer,
        check_model_dir,
    )
    from agentrl.inference.weight_sync import NcclWeightSync, PauseMode, SyncReport, WeightSync

_LAZY = {
    "BadRequest": "client",
    "CompletionsClient": "client",
    "GenerateClient": "client",
    "ServerUnavailable": "client",
    "make_client": "client",
    "Fleet": "fleet",
    "AdapterRefused": "lora_sync",
    "AdapterSync": "lora_sync",
    "Router": "router",
    "ServerState": "router",
    "ServerConfig": "server",
    "ServerStartError": "server",
    "VLLMServer": "server",
    "check_model_dir": "server",
    "NcclWeightSync": "weight_sync",
    "PauseMode": "weight_sync",
    "SyncReport": "weight_sync",
    "WeightSync": "weight_sync",
}


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'agentrl.inference' has no attribute {name!r}")
    return getattr(importlib.import_module(f"agentrl.inference.{module}"), name)


__all__ = [
    "AdapterRefused",
    "AdapterSync",
    "BadRequest",
    "CompletionsClient",
    "Fleet",
    "GenerateClient",
    "Generation",
    "LLMClient",
    "LLMError",
    "NcclWeightSync",
    "PauseMode",
    "Router",
    "SamplingParams",
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
