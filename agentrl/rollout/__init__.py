"""Rollout: the AgentLoop state machine, the RolloutRunner, multi-stage turns, tree rollouts."""

from agentrl.chat.consistency import ConsistencyReport, check_chat_template
from agentrl.chat.templates import Capabilities, TemplateReport, inspect_template
from agentrl.chat.tokenization import ChatTokenizer, TemplateError, TemplateRenderError
from agentrl.rollout.agent_loop import AgentLoop, EpisodeState, LoopConfig
from agentrl.rollout.runner import RolloutResult, RolloutRunner, summarize
from agentrl.rollout.tree import TreeSampler, TreeSpec

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
    "TreeSampler",
    "TreeSpec",
    "check_chat_template",
    "inspect_template",
    "summarize",
]
