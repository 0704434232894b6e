"""Rollout: the AgentLoop state machine, delta tokenization and the RolloutRunner."""

from agentrl.rollout.agent_loop import AgentLoop, EpisodeState, LoopConfig
from agentrl.rollout.consistency import ConsistencyReport, check_chat_template
from agentrl.rollout.runner import RolloutResult, RolloutRunner, summarize
from agentrl.rollout.templates import Capabilities, TemplateReport, inspect_template
from agentrl.rollout.tokenization import ChatTokenizer, TemplateError, TemplateRenderError

__all__ = [
    "AgentLoop",
    "Capabilities",
    "ChatTokenizer",
    "ConsistencyReport",
    "EpisodeState",
    "LoopConfig",
    "RolloutResult",
    "RolloutRunner",
    "TemplateError",
    "TemplateRenderError",
    "TemplateReport",
    "check_chat_template",
    "inspect_template",
    "summarize",
]
