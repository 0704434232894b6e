"""agentrl: reinforcement learning for multi-turn, tool-using LLM agents."""

from agentrl.env import Env
from agentrl.llm import Generation, LLMClient, SamplingParams
from agentrl.types import Action, Message, StepResult, StopReason, ToolCall, Trajectory, TurnSpan

__version__ = "0.1.0"

__all__ = [
    "Action",
    "Env",
    "Generation",
    "LLMClient",
    "Message",
    "SamplingParams",
    "StepResult",
    "StopReason",
    "ToolCall",
    "Trajectory",
    "TurnSpan",
    "__version__",
]
