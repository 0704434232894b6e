"""Rollout: the AgentLoop state machine, delta tokenization and the RolloutRunner."""

from agentrl.rollout.agent_loop import AgentLoop, EpisodeState, LoopConfig
from agentrl.rollout.consistency import ConsistencyReport, check_chat_template
from agentrl.rollout.runner import RolloutResult, RolloutRunner, summarize
from agentrl.rollout.tokenization import ChatTokenizer, TemplateError

__all__ = [
    "AgentLoop",
    "ChatTokenizer",
    "ConsistencyReport",
    "EpisodeState",
    "LoopConfig",
    "RolloutResult",
    "RolloutRunner",
    "TemplateError",
    "check_chat_template",
    "summarize",
]
